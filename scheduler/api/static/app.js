// Fencepost dashboard: plain JavaScript, no build step. Talks to the same API as everyone
// else (/v1/...) with the token kept in sessionStorage; views refresh by polling.
"use strict";

const TOKEN_KEY = "fencepost.token";
const POLL_MS = 2000;
const VERBS = ["pause", "stop", "cancel", "resume", "restart", "retry"];
const $ = (id) => document.getElementById(id);
let pollTimer = null;
let me = null;

// -- helpers ---------------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function fmtTime(t) {
  if (!t) return "";
  const d = new Date(t);
  return isNaN(d) ? t : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function ago(t) {
  if (!t) return "";
  const s = Math.max(0, (Date.now() - new Date(t).getTime()) / 1000);
  return s < 90 ? `${Math.round(s)}s ago` : s < 5400 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`;
}

const state = (s) => el("span", { class: `state ${s}`, "data-state": s }, s);
const runLink = (id) => el("a", { href: `#/run/${id}` }, String(id));

function table(cols, rows, id) {
  return el("table", { id },
    el("thead", {}, el("tr", {}, cols.map(([label]) => el("th", {}, label)))),
    el("tbody", {}, rows.length ? rows.map((r) => el("tr", { "data-id": r.id ?? "" },
      cols.map(([, f]) => el("td", {}, f(r))))) : el("tr", {}, el("td", { colspan: cols.length, class: "muted" }, "(none)"))));
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY) || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await resp.text();
  const data = text ? JSON.parse(text) : null;
  if (!resp.ok) {
    if (resp.status === 401 && method === "GET") logout();
    const err = new Error((data && (data.detail || data.title)) || `HTTP ${resp.status}`);
    err.problem = data;
    throw err;
  }
  return data;
}

function showError(e) { $("error").textContent = e ? String(e.message || e) : ""; }

// -- login -----------------------------------------------------------------------------------
async function login(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    me = await api("GET", "/v1/me");
  } catch (e) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("login-error").textContent = e.message;
    return false;
  }
  $("login-error").textContent = "";
  $("who").textContent = `${me.name || "token " + me.id} · ${me.role}` + (me.queues.length ? ` · ${me.queues.join(", ")}` : "");
  $("login-view").hidden = true;
  $("nav").hidden = $("view").hidden = $("logout").hidden = false;
  return true;
}

function logout() {
  sessionStorage.removeItem(TOKEN_KEY);
  me = null;
  clearInterval(pollTimer);
  $("nav").hidden = $("view").hidden = $("logout").hidden = true;
  $("login-view").hidden = false;
  $("who").textContent = "";
}

// -- views -----------------------------------------------------------------------------------
const views = {
  async queues() {
    const qs = await api("GET", "/v1/queues");
    return [el("h1", {}, "Queues"), table([
      ["Queue", (q) => el("a", { href: `#/runs?queue=${encodeURIComponent(q.queue)}` }, q.queue)],
      ["Paused", (q) => q.paused ? "paused" : ""],
      ["Due", (q) => q.due], ["Delayed", (q) => q.delayed], ["Running", (q) => q.active],
      ["Oldest due", (q) => `${q.oldest_due_age_s.toFixed(1)}s`],
      ["Schedule lag", (q) => q.schedule_lag_s === null ? "" : `${q.schedule_lag_s.toFixed(2)}s`],
      ["Throughput", (q) => `${q.throughput_per_min}/min`],
      ["Dispatch", (q) => el("a", { href: `#/dispatch/${encodeURIComponent(q.queue)}` }, "tenants & limits")],
      ["", (q) => el("span", { class: "commands" },
        el("button", { onclick: () => confirmQueue(q.queue, q.paused ? "resume" : "pause") }, q.paused ? "Resume queue" : "Pause queue"))],
    ], qs, "queues-table")];
  },

  // Read-only: who shares the queue and what limits it; changes go through the CLI or the
  // API (`fencepost queue weight|limit|aging`, POST /v1/queues/{q}/dispatch, admin).
  async dispatch(params, queue) {
    const d = await api("GET", `/v1/queues/${queue}/dispatch`);
    const name = decodeURIComponent(queue);
    const age = d.priority_age_ms === null ? "60 s (default)" : `${d.priority_age_ms / 1000} s`;
    return [el("h1", {}, `Queue ${name}: dispatch`),
      el("p", { id: "dispatch-summary" },
        `Leased now ${d.leased}` + (d.max_running === null ? " (no queue-wide limit). " : ` of at most ${d.max_running}. `),
        `Priority aging: one level is worth ${age} of waiting.`),
      el("h2", {}, "Tenants with due runs (served in proportion to their weights)"),
      table([["Tenant", (t) => t.tenant], ["Weight", (t) => t.weight], ["Due", (t) => t.due],
        ["Virtual time", (t) => t.virtual_time]], d.tenants, "tenants-table"),
      el("h2", {}, "Concurrency keys with an operator's limit"),
      table([["Key", (k) => k.key], ["Limit", (k) => k.limit], ["Leased", (k) => k.leased],
        ["Held (waiting for a slot)", (k) => k.held]], d.keys, "keys-table"),
      el("p", { class: "muted" }, "Change with fencepost queue weight / limit / aging, or POST /v1/queues/{queue}/dispatch (admin).")];
  },

  async runs(params) {
    const q = new URLSearchParams(params);
    for (const [k, v] of [...q.entries()]) if (!v) q.delete(k);
    const runs = await api("GET", `/v1/runs?${q}`);
    const input = (name, ph) => el("input", { name, placeholder: ph, value: params.get(name) || "" });
    const statusSel = el("select", { name: "status" }, el("option", { value: "" }, "any state"),
      ["PENDING", "RUNNING", "RETRY_WAIT", "PAUSED", "STOPPING", "STOPPED", "SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "BLOCKED"]
        .map((s) => el("option", { value: s, selected: params.get("status") === s }, s)));
    const form = el("form", { class: "filters", id: "runs-filter", onsubmit: (ev) => {
      ev.preventDefault();
      const f = new URLSearchParams(new FormData(ev.target));
      for (const k of ["since", "until"]) if (f.get(k)) f.set(k, new Date(f.get(k)).toISOString());
      for (const [k, v] of [...f.entries()]) if (!v) f.delete(k);
      location.hash = `#/runs?${f}`;
    } }, input("queue", "queue"), statusSel, input("handler", "handler"),
      el("label", {}, "since ", el("input", { name: "since", type: "datetime-local" })),
      el("label", {}, "until ", el("input", { name: "until", type: "datetime-local" })),
      el("button", { type: "submit" }, "Filter"));
    return [el("h1", {}, "Runs"), form, table([
      ["Id", (r) => runLink(r.id)], ["Handler", (r) => r.handler], ["Queue", (r) => r.queue],
      ["State", (r) => state(r.status)], ["Attempt", (r) => r.attempt], ["Created", (r) => ago(r.created_at)],
      ["Finished", (r) => fmtTime(r.finished_at)], ["Error", (r) => r.last_error_class || ""],
    ], runs, "runs-table")];
  },

  async run(params, id) {
    const [run, attempts, events, ckpt] = await Promise.all([
      api("GET", `/v1/runs/${id}`), api("GET", `/v1/runs/${id}/attempts`),
      api("GET", `/v1/runs/${id}/events`), api("GET", `/v1/runs/${id}/checkpoint`)]);
    const fields = ["handler", "queue", "attempt", "max_retries", "version", "priority", "lease_owner", "token",
      "created_at", "started_at", "finished_at", "reason", "last_error_class", "last_error", "idempotency_key"];
    const grid = el("div", { class: "grid" },
      el("span", {}, "state"), el("span", { id: "run-status" }, state(run.status),
        run.recorded_status !== run.status ? el("span", { class: "muted" }, ` (recorded: ${run.recorded_status})`) : null,
        run.pause_requested ? el("span", { class: "muted" }, " · pause requested") : null,
        run.stop_requested ? el("span", { class: "muted" }, " · stop requested") : null),
      fields.filter((f) => run[f] !== null && run[f] !== undefined && run[f] !== "").map((f) =>
        [el("span", { class: "muted" }, f), el("span", {}, f.endsWith("_at") ? fmtTime(run[f]) : String(run[f]))]),
      run.workflow_id ? [el("span", { class: "muted" }, "workflow"), el("a", { href: `#/workflow/${run.workflow_id}` }, run.workflow_id)] : null,
      run.result !== null ? [el("span", { class: "muted" }, "result"), el("code", {}, JSON.stringify(run.result))] : null);
    const cmds = el("div", { class: "commands" }, VERBS.map((v) =>
      el("button", { "data-cmd": v, onclick: () => confirmRun(run, v) }, v[0].toUpperCase() + v.slice(1))));
    const progress = ckpt ? el("div", { id: "checkpoint" },
      el("p", {}, `Checkpoint v${ckpt.version} by attempt ${ckpt.attempt}, ${fmtTime(ckpt.updated_at)} · processed `,
        el("strong", { id: "processed" }, String(ckpt.processed ?? "?"))),
      el("pre", {}, JSON.stringify(ckpt.state, null, 2))) : el("p", { class: "muted", id: "checkpoint" }, "No checkpoint.");
    return [el("h1", {}, `Run ${run.id}`), grid, el("h2", {}, "Commands"), cmds,
      el("p", { id: "cmd-result", role: "status" }, lastResult[run.id] || ""),
      el("h2", {}, "Progress"), progress,
      el("h2", {}, "Attempts"), table([
        ["#", (a) => a.attempt], ["Worker", (a) => a.worker_id], ["Token", (a) => a.token],
        ["Started", (a) => fmtTime(a.started_at)], ["Finished", (a) => fmtTime(a.finished_at)],
        ["Outcome", (a) => a.outcome || ""], ["Error", (a) => a.error_class || ""]], attempts, "attempts-table"),
      el("h2", {}, "Timeline"), timelineNote(events), table([
        ["At", (e) => fmtTime(e.at)], ["Event", (e) => e.type],
        ["Transition", (e) => e.from_status || e.to_status ? `${e.from_status || "·"} → ${e.to_status || "·"}` : ""],
        ["Attempt", (e) => e.attempt ?? ""], ["Worker", (e) => e.worker_id || ""], ["Actor", (e) => e.actor || ""],
        ["Reason", (e) => e.reason || (e.actor && e.actor.startsWith("token:") ? el("em", { class: "muted" }, "no reason given") : "")],
        ["Error", (e) => e.error_class || ""]], events.filter((e) => e.type !== "checkpointed"), "events-table")];
  },

  async "dead-letter"() {
    const rows = await api("GET", "/v1/dead-letter");
    return [el("h1", {}, "Dead letter"), table([
      ["Id", (r) => runLink(r.id)], ["Handler", (r) => r.handler], ["Queue", (r) => r.queue], ["State", (r) => state(r.status)],
      ["Attempts", (r) => r.attempt], ["Finished", (r) => fmtTime(r.finished_at)], ["Reason", (r) => r.reason || ""],
      ["Error", (r) => `${r.last_error_class || ""} ${r.last_error || ""}`],
      ["", (r) => el("button", { onclick: () => confirmRun(r, "retry") }, "Retry")]], rows, "dead-table")];
  },

  async review() {
    const rows = await api("GET", "/v1/review");
    const resolve = (r, as) => el("button", { onclick: () => confirmResolve(r, as) }, `Resolve as ${as}`);
    return [el("h1", {}, "Review queue"), el("p", { class: "muted" },
      "Runs whose non-idempotent side effect may or may not have happened: check, then resolve."), table([
      ["Id", (r) => runLink(r.id)], ["Handler", (r) => r.handler], ["Queue", (r) => r.queue],
      ["Finished", (r) => fmtTime(r.finished_at)], ["Error", (r) => r.last_error || ""],
      ["", (r) => [resolve(r, "succeeded"), resolve(r, "failed"), resolve(r, "retry")]]], rows, "review-table")];
  },

  async schedules() {
    const rows = await api("GET", "/v1/schedules");
    const next = await Promise.all(rows.map((s) => api("GET", `/v1/schedules/${encodeURIComponent(s.name)}/next?n=3`)
      .then((n) => n.fires).catch(() => [])));
    return [el("h1", {}, "Schedules"), table([
      ["Name", (s) => s.name], ["Handler", (s) => s.handler], ["Every", (s) => s.cron || `${s.interval_s}s`],
      ["Timezone", (s) => s.timezone], ["Paused", (s) => s.paused ? "paused" : ""],
      ["Next fires", (s) => next[rows.indexOf(s)].map(fmtTime).join(" · ")],
      ["Last", (s) => s.last_run_id ? [runLink(s.last_run_id), " ", s.last_status ? state(s.last_status) : ""] : ""],
      ["Fires / skipped", (s) => `${s.fires} / ${s.skipped}`]], rows, "schedules-table")];
  },

  async workflows() {
    const rows = await api("GET", "/v1/workflows");
    return [el("h1", {}, "Workflows"), table([
      ["Id", (w) => el("a", { href: `#/workflow/${w.id}` }, w.id)], ["Name", (w) => w.name || ""],
      ["Nodes", (w) => w.nodes], ["Created", (w) => fmtTime(w.created_at)]], rows, "workflows-table")];
  },

  async workflow(params, id) {
    const wf = await api("GET", `/v1/workflows/${id}`);
    return [el("h1", {}, `Workflow ${wf.name || ""}`), el("p", { class: "muted" }, wf.id), graph(wf.nodes),
      el("div", { class: "commands" }, el("button", { onclick: () => confirmWorkflowRetry(wf) }, "Retry what did not succeed")),
      el("p", { id: "cmd-result" }, lastResult[wf.id] || ""),
      table([["Node", (n) => n.name], ["Run", (n) => runLink(n.id)], ["State", (n) => state(n.status)],
        ["Depends on", (n) => n.depends_on.join(", ")], ["Reason", (n) => n.reason || ""]], wf.nodes, "nodes-table")];
  },
};

function timelineNote(events) {
  const ckpts = events.filter((e) => e.type === "checkpointed");
  return ckpts.length ? el("p", { class: "muted" }, `${ckpts.length} checkpoint events not shown (latest ${fmtTime(ckpts[ckpts.length - 1].at)}).`) : null;
}

// The DAG as SVG: one column per depth (longest path from a root), edges as lines.
function graph(nodes) {
  const by = Object.fromEntries(nodes.map((n) => [n.name, n]));
  const depth = {};
  const d = (name, seen = new Set()) => {
    if (depth[name] !== undefined) return depth[name];
    if (seen.has(name)) return 0;
    seen.add(name);
    const ups = (by[name].depends_on || []).filter((u) => by[u]);
    return (depth[name] = ups.length ? 1 + Math.max(...ups.map((u) => d(u, seen))) : 0);
  };
  nodes.forEach((n) => d(n.name));
  const cols = {};
  nodes.forEach((n) => (cols[depth[n.name]] = cols[depth[n.name]] || []).push(n));
  const W = 200, H = 46, pos = {};
  Object.entries(cols).forEach(([c, ns]) => ns.forEach((n, i) => (pos[n.name] = [20 + c * W, 20 + i * H])));
  const width = 40 + (Object.keys(cols).length) * W, height = 40 + Math.max(...Object.values(cols).map((c) => c.length)) * H;
  const NS = "http://www.w3.org/2000/svg";
  const s = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text) e.textContent = text;
    return e;
  };
  const colour = { SUCCEEDED: "#d1fadf", FAILED: "#fee4e2", TIMED_OUT: "#fee4e2", RUNNING: "#d1e9ff", PAUSED: "#fef0c7",
    STOPPED: "#fef0c7", CANCELLED: "#f2f4f7", BLOCKED: "#ffffff", PENDING: "#eef1f5" };
  const svg = s("svg", { width, height, id: "workflow-graph", role: "img" });
  nodes.forEach((n) => (n.depends_on || []).filter((u) => pos[u]).forEach((u) => svg.append(s("line", {
    x1: pos[u][0] + 160, y1: pos[u][1] + 15, x2: pos[n.name][0], y2: pos[n.name][1] + 15, stroke: "#98a2b3" }))));
  nodes.forEach((n) => {
    const [x, y] = pos[n.name];
    const a = s("a", { href: `#/run/${n.id}` });
    a.append(s("rect", { x, y, width: 160, height: 30, rx: 5, fill: colour[n.status] || "#fff", stroke: "#667085" }),
      s("text", { x: x + 6, y: y + 19 }, `${n.name} · ${n.status}`));
    svg.append(a);
  });
  return svg;
}

// -- commands --------------------------------------------------------------------------------
const lastResult = {};

function ask(title, text) {
  return new Promise((resolve) => {
    const dlg = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-reason").value = "";
    const done = (ok) => { dlg.close(); resolve(ok ? $("confirm-reason").value : null); };
    $("confirm-form").onsubmit = (ev) => { ev.preventDefault(); done(true); };
    $("confirm-cancel").onclick = () => done(false);
    dlg.showModal();
  });
}

async function act(key, path, body, label) {
  try {
    const out = await api("POST", path, body);
    lastResult[key] = `${label}: ${out.state ?? (out.paused !== undefined ? (out.paused ? "paused" : "resumed") : "done")}`;
    showError(null);
  } catch (e) {
    lastResult[key] = `${label} refused: ${e.message}` + (e.problem && e.problem.offer ? ` (try ${e.problem.offer})` : "");
  }
  await render();
}

async function confirmRun(run, verb) {
  const reason = await ask(`${verb[0].toUpperCase() + verb.slice(1)} run ${run.id}?`,
    `Run ${run.id} (${run.handler}) is ${run.status}.`);
  if (reason !== null) await act(run.id, `/v1/runs/${run.id}/${verb}`, { reason }, `${verb} run ${run.id}`);
}

async function confirmResolve(run, as) {
  const reason = await ask(`Resolve run ${run.id} as ${as}?`, "Only after you checked what really happened.");
  if (reason !== null) await act(run.id, `/v1/runs/${run.id}/resolve`, { as, reason }, `resolve run ${run.id}`);
}

async function confirmQueue(queue, verb) {
  const reason = await ask(`${verb} queue ${queue}?`, verb === "pause" ? "Nothing new is dispatched while paused." : "");
  if (reason !== null) await act(queue, `/v1/queues/${encodeURIComponent(queue)}/${verb}`, { reason }, `${verb} ${queue}`);
}

async function confirmWorkflowRetry(wf) {
  const reason = await ask(`Retry workflow ${wf.name || wf.id}?`, "Failed, stopped and cancelled nodes run again.");
  if (reason === null) return;
  try {
    const out = await api("POST", `/v1/workflows/${wf.id}/retry`, { reason });
    lastResult[wf.id] = Object.entries(out.done).filter(([, v]) => v.length).map(([k, v]) => `${k}: ${v.join(", ")}`).join("; ") || "nothing to retry";
  } catch (e) { lastResult[wf.id] = `refused: ${e.message}`; }
  await render();
}

// -- routing and polling ---------------------------------------------------------------------
async function render() {
  if (!me || $("confirm").open) return;
  const [path, query] = (location.hash.slice(2) || "queues").split("?");
  const [name, id] = path.split("/");
  const view = views[name] || views.queues;
  document.querySelectorAll("#nav a").forEach((a) => a.classList.toggle("active", a.getAttribute("href") === `#/${name}`));
  try {
    const content = await view(new URLSearchParams(query || ""), id);
    $("view").replaceChildren(...content.flat());
    showError(null);
  } catch (e) { showError(e); }
}

function start() {
  clearInterval(pollTimer);
  render();
  pollTimer = setInterval(render, POLL_MS);
}

$("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  if (await login($("token").value.trim())) start();
});
$("logout").addEventListener("click", logout);
window.addEventListener("hashchange", render);

(async () => {
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved && await login(saved)) start();
  else logout();
})();
