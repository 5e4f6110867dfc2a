// Fencepost dashboard: plain JavaScript, no build step. Talks to the same API as everyone
// else (/v1/...) with the token kept in sessionStorage. Views are live: one event stream per tab
// (GET /v1/events/stream) says when something changed, and the view shown is rebuilt then (at most
// every RENDER_GAP_MS), plus a slow refresh for what has no event (workers, Redis depths); only
// while the stream is down do views refresh by the 2 s poll. A rebuild never takes what the
// operator is doing away: forms marked data-keep survive it (typed text, selections, focus), open
// tracebacks stay open, selected rows stay selected; filters live in the URL so a view can be
// shared and survives a reload, and Back / Forward show the URL's filter in the box again.
"use strict";

const TOKEN_KEY = "fencepost.token";
const POLL_MS = 2000;
const RENDER_GAP_MS = 2500;
// While the stream is up: how often a view is rebuilt with no event about it (its data has none).
// A run page refreshes every 5 s too: a running run's progress (ctx.progress) has no event.
const LIVE_REFRESH_MS = { queues: 5000, workers: 5000, dispatch: 5000, run: 5000, default: 30000 };
// The run states, their groups and the states each command takes: fencepost.core.states, served by
// GET /v1/states (filled in before the first view is drawn; never typed in here).
let STATES = [];
let GROUPS = {};
let COMMANDS = {};
let LISTS = {};
const $ = (id) => document.getElementById(id);
let tickTimer = null;
let me = null;
let lastRoute = null;
const selected = {};  // view -> Set of run ids ticked by the operator
const opened = new Set();  // ids of <details> the operator opened

// -- helpers ---------------------------------------------------------------------------------
// Bidirectional controls (U+202A-202E, U+2066-2069, U+200E/F, U+061C) and other control characters
// (but line breaks and tabs) in any text the page shows are replaced by a visible mark, so a job's
// error "\u202eevil" reads as written, never reversed; job text is also isolated in <bdi dir=ltr>.
const HIDDEN = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
const visible = (s) => String(s).replace(HIDDEN, (c) => `⟨U+${c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`);
const jt = (s) => s === null || s === undefined || s === "" ? "" : el("bdi", { dir: "ltr", class: "jt" }, String(s));

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : (k === "title" || k === "aria-label" ? visible(v) : v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(visible(c)));
  }
  return node;
}

function fmtTime(t) {
  if (!t) return "";
  const d = new Date(typeof t === "number" ? t * 1000 : t);
  return isNaN(d) ? String(t) : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function ago(t) {
  if (!t) return "";
  const ms = typeof t === "number" ? t * 1000 : new Date(t).getTime();
  const s = Math.max(0, (Date.now() - ms) / 1000);
  return s < 90 ? `${Math.round(s)}s ago` : s < 5400 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`;
}

// The named groups a state is in (GROUPS from /v1/states), space-separated: app.css colours a state by
// its group (`[data-group~=ACTIVE]`), so a state added to a group in core/states.py takes its colour.
const groupsOf = (s) => Object.keys(GROUPS).filter((g) => GROUPS[g].includes(s)).sort().join(" ");
const state = (s) => el("span", { class: `state ${s}`, "data-state": s, "data-group": groupsOf(s) }, s);
const runLink = (id) => el("a", { href: `#/run/${id}` }, String(id));
const enc = encodeURIComponent;
const isAdmin = () => me && me.role === "admin";

// A long text (a traceback, a message): its first line, the rest behind a disclosure that stays open.
function longText(text, id) {
  if (!text) return "";
  const lines = String(text).split("\n");
  if (lines.length === 1 && lines[0].length <= 120) return jt(lines[0]);
  return el("details", { id, class: "long", open: opened.has(id), ontoggle: (ev) => {
    if (ev.target.open) opened.add(id); else opened.delete(id);
  } }, el("summary", {}, jt(lines[0].slice(0, 120))), el("pre", { dir: "ltr" }, String(text)));
}

// A table in a box that scrolls sideways on its own: the page itself never grows wider than the window.
function table(cols, rows, id) {
  return el("div", { class: "table-wrap" }, el("table", { id },
    el("thead", {}, el("tr", {}, cols.map(([label]) => el("th", { scope: "col" }, label)))),
    el("tbody", {}, rows.length ? rows.map((r) => el("tr", { "data-id": r.id ?? "" },
      cols.map(([, f]) => el("td", {}, f(r))))) : el("tr", {}, el("td", { colspan: cols.length, class: "muted" }, "(none)")))));
}

async function api(method, path, body, opts) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY) || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await resp.text();
  const data = text ? JSON.parse(text) : null;
  if (!resp.ok) {
    if (resp.status === 401 && method === "GET") logout();
    const err = new Error((data && (data.detail || data.title)) || `HTTP ${resp.status}`);
    err.problem = data;
    err.status = resp.status;
    throw err;
  }
  return opts && opts.headers ? { data, headers: resp.headers } : data;
}

function showError(e) { $("error").textContent = e ? String(e.message || e) : ""; }

// A filter form kept across refreshes; changes go to the URL (debounced), which re-renders the view.
// The URL is the filter: Back / Forward (a hash the form did not set) rebuild the form from the URL,
// and a pending change is dropped then; a bulk action first applies what the box shows (flushFilters).
const filterTimers = new Map();  // form id -> [timer, apply]
let ownHash = null;  // the hash the last filter change set (its hashchange keeps the form as typed)

function filterTarget(form, route) {
  const f = new URLSearchParams();
  for (const [k, v] of new FormData(form).entries()) {
    if (!v) continue;
    f.set(k, (k === "since" || k === "until") ? new Date(v).toISOString() : v);
  }
  return `#/${route}${f.toString() ? "?" + f : ""}`;
}

function flushFilters() {  // apply what the boxes show now (a pending debounced change included)
  for (const [id, [timer, apply]] of filterTimers) {
    clearTimeout(timer);
    const form = document.getElementById(id);
    if (form) apply(form);
  }
  filterTimers.clear();
}

function filterForm(id, route, params, fields) {
  const apply = (form) => {
    filterTimers.delete(id);
    const target = filterTarget(form, route);
    if (location.hash !== target) { ownHash = target; location.hash = target; }
  };
  const field = ([name, label, kind, options]) => {
    const value = params.get(name) || "", fid = `${id}-${name}`;
    let input;
    if (kind === "select") {
      input = el("select", { name, id: fid },
        el("option", { value: "" }, "any"), options.map((o) => el("option", { value: o, selected: value === o }, o)));
    } else if (kind === "datetime-local") {
      const local = value ? new Date(new Date(value).getTime() - new Date().getTimezoneOffset() * 60000)
        .toISOString().slice(0, 16) : "";
      input = el("input", { name, id: fid, type: kind, value: local });
    } else input = el("input", { name, id: fid, placeholder: label, value, type: kind || "text" });
    return el("span", { class: "field" }, el("label", { for: fid }, label), input);
  };
  return el("form", { class: "filters", id, "data-keep": true, role: "search", "data-route": route,
    onsubmit: (ev) => { ev.preventDefault(); const t = filterTimers.get(id); if (t) clearTimeout(t[0]); apply(ev.target); },
    oninput: (ev) => {
      const form = ev.currentTarget, t = filterTimers.get(id);
      if (t) clearTimeout(t[0]);
      filterTimers.set(id, [setTimeout(() => apply(form), 600), apply]);
    },
  }, fields.map(field), el("button", { type: "submit" }, "Filter"));
}

function selectBox(view, id) {
  const set = selected[view] || (selected[view] = new Set());
  return el("input", { type: "checkbox", "aria-label": `select run ${id}`, "data-select": id, checked: set.has(id),
    onchange: (ev) => { if (ev.target.checked) set.add(id); else set.delete(id); render(); } });
}

// -- login -----------------------------------------------------------------------------------
async function loadStates() {
  const g = await api("GET", "/v1/states");
  STATES = g.states;
  GROUPS = g.groups;
  COMMANDS = g.commands;
  LISTS = g.lists;
}

async function login(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    me = await api("GET", "/v1/me");
    if (!STATES.length) await loadStates();
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
  clearInterval(tickTimer);
  stopLive();
  $("nav").hidden = $("view").hidden = $("logout").hidden = true;
  $("login-view").hidden = false;
  $("who").textContent = "";
}

// -- views -----------------------------------------------------------------------------------
const views = {
  // Depths from Redis: due now, overdue (its time has come but no worker promoted it: a queue with no
  // workers keeps them), scheduled (later); latency (the oldest due run's age); who serves the queue with
  // how many busy slots; its concurrency limit (admins change it here, audited).
  async queues() {
    const [qs, ops] = await Promise.all([api("GET", "/v1/queues"), api("GET", "/v1/ops/queues")]);
    const by = Object.fromEntries(ops.map((o) => [o.queue, o]));
    const admin = isAdmin();
    const concurrency = (q) => {
      const o = by[q.queue];
      const shown = o && o.max_running !== null ? String(o.max_running) : "no limit";
      const now = el("span", { "data-max-running": q.queue }, shown);
      if (!admin) return now;
      const fid = `conc-${q.queue}`;
      return [now, el("form", { id: `conc-form-${q.queue}`, class: "inline", "data-keep": true,
        onsubmit: (ev) => { ev.preventDefault(); setConcurrency(q.queue, ev.target); } },
      el("label", { for: fid, class: "muted" }, " set to"),
      el("input", { id: fid, name: "value", type: "number", min: "1", step: "1", placeholder: "empty: none", size: 6 }),
      el("button", { type: "submit", "data-concurrency": q.queue }, "Set…"))];
    };
    return [el("h1", {}, "Queues"), table([
      ["Queue", (q) => el("a", { href: `#/runs?queue=${enc(q.queue)}` }, q.queue)],
      ["Paused", (q) => q.paused ? "paused" : ""],
      ["Due", (q) => q.due],
      ["Overdue", (q) => by[q.queue] ? el("span", { "data-overdue": by[q.queue].overdue }, by[q.queue].overdue) : ""],
      ["Scheduled", (q) => by[q.queue] ? el("a", { href: `#/scheduled?queue=${enc(q.queue)}` }, by[q.queue].scheduled) : ""],
      ["Running", (q) => q.active],
      ["Latency", (q) => el("span", { title: "age of the oldest due run", "data-latency": q.queue }, `${q.oldest_due_age_s.toFixed(1)}s`)],
      ["Workers (busy / slots)", (q) => {
        const o = by[q.queue];
        if (!o) return "";
        if (!o.workers.length) return el("span", { class: "muted", "data-workers": 0 }, "no workers");
        return el("span", { "data-workers": o.workers.length }, o.workers.map((w, i) => [i ? ", " : "",
          el("a", { href: "#/workers", title: `${w.host}: ${w.held} held over all its queues` }, w.id), ` ${w.busy}/${w.concurrency}`]));
      }],
      ["Concurrency", concurrency],
      ["Schedule lag", (q) => q.schedule_lag_s === null ? "" : `${q.schedule_lag_s.toFixed(2)}s`],
      ["Throughput", (q) => `${q.throughput_per_min}/min`],
      ["Views", (q) => [el("a", { href: `#/dispatch/${enc(q.queue)}` }, "dispatch"), " · ",
        el("a", { href: `#/charts?queue=${enc(q.queue)}` }, "charts")]],
      ["", (q) => el("span", { class: "commands" },
        el("button", { onclick: () => confirmQueue(q.queue, q.paused ? "resume" : "pause") }, q.paused ? "Resume queue" : "Pause queue"))],
    ], qs, "queues-table"), el("p", { id: "queues-result", role: "status" }, lastResult.queues || "")];
  },

  // Who shares the queue and what limits it; admins change a setting here (audited with the reason).
  async dispatch(params, queue) {
    const d = await api("GET", `/v1/queues/${queue}/dispatch`);
    const name = decodeURIComponent(queue);
    const age = d.priority_age_ms === null ? "60 s (default)" : `${d.priority_age_ms / 1000} s`;
    const out = [el("h1", {}, `Queue ${name}: dispatch`),
      el("p", { id: "dispatch-summary" },
        `Leased now ${d.leased}` + (d.max_running === null ? " (no queue-wide limit). " : ` of at most ${d.max_running}. `),
        `Priority aging: one level is worth ${age} of waiting.`),
      el("h2", {}, "Tenants with due runs (served in proportion to their weights)"),
      table([["Tenant", (t) => t.tenant || "(default)"], ["Weight", (t) => t.weight], ["Due", (t) => t.due],
        ["Virtual time", (t) => t.virtual_time]], d.tenants, "tenants-table"),
      el("h2", {}, "Concurrency keys with an operator's limit"),
      table([["Key", (k) => k.key], ["Limit", (k) => k.limit], ["Leased", (k) => k.leased],
        ["Held (waiting for a slot)", (k) => k.held]], d.keys, "keys-table"),
      el("h2", {}, "Rate limits (starts per interval, over all workers)"),
      el("p", { id: "rate-summary" }, d.rate === null ? "No queue-wide rate limit." : `The queue starts at most ${d.rate}.`),
      table([["Key", (r) => r.key || "(whole queue)"], ["Rate", (r) => r.rate || "-"],
        ["Started in the window", (r) => r.used], ["Held (waiting for the window)", (r) => r.held],
        ["Set by", (r) => r.override ? "operator" : "runs"]], d.rate_use || [], "rates-table")];
    if (!isAdmin()) {
      out.push(el("p", { class: "muted" }, "An admin token changes these here, or: fencepost queue weight / limit / rate / aging."));
      return out;
    }
    const field = (name, label, type) => el("label", {}, `${label} `, el("input", { name, type: type || "text", step: "any" }));
    out.push(el("h2", {}, "Change a setting"), el("form", { id: "dispatch-form", class: "filters", "data-keep": true,
      onsubmit: (ev) => { ev.preventDefault(); changeDispatch(name, ev.target); } },
    el("label", {}, "Setting ", el("select", { name: "setting" }, ["weight", "limit", "max_running", "aging", "rate"]
      .map((v) => el("option", { value: v }, v)))),
    field("tenant", "tenant (weight)"), field("key", "key (limit, rate)"), field("value", "value (empty: default)", "number"),
    field("rate", "rate, like 100/1s (empty: none)"),
    el("button", { type: "submit" }, "Apply…")), el("p", { id: "dispatch-result", role: "status" }, lastResult[`dispatch:${name}`] || ""));
    return out;
  },

  async runs(params) {
    const q = new URLSearchParams(params);
    for (const [k, v] of [...q.entries()]) if (!v) q.delete(k);
    const limit = Number(params.get("limit") || 50), offset = Number(params.get("offset") || 0);
    // A sort no index serves is refused (422 naming sort) when the filters match more than the count cap:
    // the list is shown in id order then, with the server's reason.
    let res, refused = "";
    try {
      res = await api("GET", `/v1/runs?${q}`, undefined, { headers: true });
    } catch (e) {
      if (!(e.problem && e.problem.field === "sort")) throw e;
      refused = e.message;
      q.delete("sort"); q.delete("order"); q.delete("offset");
      res = await api("GET", `/v1/runs?${q}`, undefined, { headers: true });
    }
    const { data: runs, headers } = res;
    const total = Number(headers.get("X-Total-Count") || runs.length);
    const exact = headers.get("X-Total-Count-Exact") !== "false";
    const form = filterForm("runs-filter", "runs", params, [
      ["queue", "queue"], ["status", "state", "select", STATES], ["handler", "handler"], ["id", "run id", "number"],
      ["tenant", "tenant"], ["concurrency_key", "concurrency key"], ["idempotency_key", "idempotency key"],
      ["arg", "argument contains"], ["since", "since", "datetime-local"], ["until", "until", "datetime-local"]]);
    const sortBy = q.get("sort") || "id", order = q.get("order") || "desc";
    // Offered only where the server serves it (GET /v1/runs): id and times always; state within a queue (a
    // filter or the token's queues) or a state filter; handler with a handler filter; attempt, handler and
    // state whenever the filters match at most the count cap (an exact count).
    const served = { status: exact || !!q.get("queue") || !!q.get("status") || me.queues.length > 0,
      handler: exact || !!q.get("handler"), attempt: exact };
    const head = (label, key) => served[key] === false ? el("span", { "data-sort-off": key,
      title: `Sorting by ${label.toLowerCase()} is offered within a queue or for at most 10000 matching runs: narrow the filters` }, label) :
      el("button", { class: "link", "data-sort": key, "aria-label": `sort by ${label}`,
        onclick: () => go("runs", params, { sort: key, order: sortBy === key && order === "desc" ? "asc" : "desc", offset: "" }) },
      label, sortBy === key ? (order === "desc" ? " ▼" : " ▲") : "");
    const sel = selected.runs || new Set();
    return [el("h1", {}, "Runs"), form,
      refused ? el("p", { id: "runs-sort-refused", class: "muted", role: "status" }, refused) : null,
      el("p", { id: "runs-count", class: "muted" }, runs.length
        ? `${offset + 1}–${offset + runs.length} of ${total}${exact ? "" : "+"}` : `0 of ${total}`),
      bulkBar(params),
      el("div", { class: "table-wrap" }, el("table", { id: "runs-table" },
        el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", {}, head("Id", "id")), el("th", {}, head("Handler", "handler")),
          el("th", {}, "Queue"), el("th", {}, head("State", "status")), el("th", {}, head("Attempt", "attempt")),
          el("th", {}, head("Created", "created_at")), el("th", {}, head("Finished", "finished_at")), el("th", {}, "Error"))),
        el("tbody", {}, runs.length ? runs.map((r) => el("tr", { "data-id": r.id },
          el("td", {}, selectBox("runs", r.id)), el("td", {}, runLink(r.id)), el("td", {}, jt(r.handler)), el("td", {}, r.queue),
          el("td", {}, state(r.status)), el("td", {}, r.attempt), el("td", { title: fmtTime(r.created_at) }, ago(r.created_at)),
          el("td", {}, fmtTime(r.finished_at)), el("td", {}, jt(r.last_error_class || "")))) :
          el("tr", {}, el("td", { colspan: 9, class: "muted" }, "(none)"))))),
      el("nav", { class: "pager", "aria-label": "pages" },
        el("button", { id: "prev-page", disabled: offset <= 0, onclick: () => go("runs", params, { offset: String(Math.max(0, offset - limit)) }) }, "← Newer"),
        el("button", { id: "next-page", disabled: offset + runs.length >= total, onclick: () => go("runs", params, { offset: String(offset + limit) }) }, "Older →")),
      sel.size ? el("div", { class: "commands", id: "selection" }, `${sel.size} selected: `,
        ["pause", "cancel", "retry"].map((v) => el("button", { "data-bulk-selected": v, onclick: () => actOnSelected("runs", v) },
          `${v[0].toUpperCase() + v.slice(1)} ${sel.size}`)),
        el("button", { onclick: () => { sel.clear(); render(); } }, "Clear")) : null,
      el("p", { id: "bulk-result", role: "status" }, lastResult.bulk || lastResult.runs || "")];
  },

  // One run. Its timeline is fetched after a cursor (GET /v1/runs/{id}/timeline?after=): each rebuild asks
  // only for the events recorded since the last one, never the whole history again. The error text is
  // shown once (with its attempt); the grid and the timeline name its class.
  async run(params, id) {
    if (timeline.id !== id) Object.assign(timeline, { id, events: [], cursor: null, ids: new Set() });
    const [run, attempts, ckpt] = await Promise.all([
      api("GET", `/v1/runs/${id}`), api("GET", `/v1/runs/${id}/attempts`), api("GET", `/v1/runs/${id}/checkpoint`),
      fetchTimeline(id)]);
    const events = timeline.events;
    const fields = ["handler", "queue", "tenant", "concurrency_key", "concurrency_limit", "attempt", "max_retries", "version",
      "priority", "lease_owner", "token", "created_at", "run_at", "started_at", "finished_at", "reason", "last_error_class",
      "idempotency_key", "trace_id", "schedule_id"];
    const shownErrors = new Set(attempts.map((a) => a.error_message).filter(Boolean));
    const due = run.status === "PENDING" && run.run_at ? Date.parse(run.run_at) : null;
    const grid = el("div", { class: "grid" },
      el("span", {}, "state"), el("span", { id: "run-status" }, state(run.status),
        run.recorded_status !== run.status ? el("span", { class: "muted" }, ` (recorded: ${run.recorded_status})`) : null,
        due !== null ? el("span", { class: "muted", id: "run-due" }, due > Date.now() ? ` · scheduled for ${fmtTime(run.run_at)}`
          : ` · due since ${fmtTime(run.run_at)}`) : null,
        run.pause_requested ? el("span", { class: "muted" }, " · pause requested") : null,
        run.stop_requested ? el("span", { class: "muted" }, " · stop requested") : null),
      fields.filter((f) => run[f] !== null && run[f] !== undefined && run[f] !== "").map((f) =>
        [el("span", { class: "muted" }, f.replace(/_/g, " ")), el("span", { "data-field": f },
          f.endsWith("_at") ? fmtTime(run[f]) : jt(String(run[f])))]),
      run.last_error && !shownErrors.has(run.last_error) ? [el("span", { class: "muted" }, "last error"),
        el("span", { id: "last-error" }, longText(run.last_error, `err-${run.id}`))] : null,
      run.progress ? [el("span", { class: "muted" }, "progress"), el("span", { id: "run-progress" },
        run.progress.total ? el("progress", { value: run.progress.done, max: run.progress.total }) : null,
        ` ${run.progress.done}${run.progress.total ? " / " + run.progress.total : ""} `, jt(run.progress.message || ""))] : null,
      run.workflow_id ? [el("span", { class: "muted" }, "workflow"), el("a", { href: `#/workflow/${run.workflow_id}` }, run.workflow_id)] : null,
      run.result !== null && run.result !== undefined ? [el("span", { class: "muted" }, "result"), el("code", { dir: "ltr" }, JSON.stringify(run.result))] : null);
    const verbs = Object.keys(COMMANDS).filter((v) => v in VERB && !["run_now", "delete"].includes(v) && COMMANDS[v].includes(run.status));
    const cmds = el("div", { class: "commands", id: "commands" }, verbs.length ? verbs.map((v) =>
      el("button", { "data-cmd": v, onclick: () => confirmRun(run, v) }, v[0].toUpperCase() + v.slice(1))) :
      el("span", { class: "muted" }, `No command applies to a ${run.status} run.`));
    const argsView = run.arguments_truncated
      ? [el("p", { class: "muted" }, `${run.arguments_bytes} bytes of arguments; the first 64 KiB:`), el("pre", { id: "run-args", dir: "ltr" }, run.arguments_preview)]
      : el("pre", { id: "run-args", dir: "ltr" }, JSON.stringify({ args: run.args ?? [], kwargs: run.kwargs ?? {} }, null, 2));
    const progress = ckpt ? el("div", { id: "checkpoint" },
      el("p", {}, `Checkpoint v${ckpt.version} by attempt ${ckpt.attempt}, ${fmtTime(ckpt.updated_at)} · processed `,
        el("strong", { id: "processed" }, String(ckpt.processed ?? "?"))),
      el("pre", { dir: "ltr" }, JSON.stringify(ckpt.state, null, 2))) : el("p", { class: "muted", id: "checkpoint" }, "No checkpoint.");
    return [el("h1", {}, `Run ${run.id}`), grid, el("h2", {}, "Commands"), cmds,
      el("p", { id: "cmd-result", role: "status" }, lastResult[run.id] || ""),
      el("h2", {}, "Arguments"), argsView,
      el("h2", {}, "Progress"), progress,
      el("h2", {}, "Attempts"), table([
        ["#", (a) => a.attempt], ["Worker", (a) => a.worker_id], ["Token", (a) => a.token],
        ["Started", (a) => fmtTime(a.started_at)], ["Finished", (a) => fmtTime(a.finished_at)],
        ["Outcome", (a) => a.outcome || ""], ["Error", (a) => jt(a.error_class || "")],
        ["Message", (a) => longText(a.error_message, `att-${run.id}-${a.attempt}`)]], attempts, "attempts-table"),
      el("h2", {}, "Timeline"), timelineNote(events), table([
        ["At", (e) => fmtTime(e.at)], ["Event", (e) => e.type],
        ["Transition", (e) => e.from_status || e.to_status ? `${e.from_status || "·"} → ${e.to_status || "·"}` : ""],
        ["Attempt", (e) => e.attempt ?? ""], ["Worker", (e) => e.worker_id || ""], ["Actor", (e) => jt(e.actor || "")],
        ["Reason", (e) => e.reason ? jt(e.reason) : (e.actor && e.actor.startsWith("token:") ? el("em", { class: "muted" }, "no reason given") : "")],
        ["Error", (e) => [jt(e.error_class || ""), e.error_message && !shownErrors.has(e.error_message) && e.error_message !== run.last_error
          ? [" ", longText(e.error_message, `ev-${e.id}`)] : ""]]],
      events.filter((e) => e.type !== "checkpointed"), "events-table")];
  },

  "dead-letter": (params) => listView("dead", "dead-letter", params),
  review: (params) => listView("review", "review", params),
  retries: (params) => listView("retries", "retries", params),
  scheduled: (params) => listView("scheduled", "scheduled", params),

  async workers() {
    const ws = await api("GET", "/v1/workers");
    return [el("h1", {}, "Workers"), el("p", { class: "muted" },
      "Live workers (their identity heartbeat); a stopped or dead worker leaves the list within seconds."), table([
      ["Id", (w) => w.id], ["Host", (w) => w.host], ["Pid", (w) => w.pid], ["Version", (w) => w.version],
      ["Queues", (w) => w.queues.join(", ")], ["Busy", (w) => `${w.running.length} / ${w.concurrency}`],
      ["Runs held", (w) => w.running.length ? w.running.map((h) => [runLink(h.id), " ", jt(h.handler), " "]) : ""],
      ["Started", (w) => ago(w.started_at)], ["Last claim", (w) => w.last_claim_at ? ago(w.last_claim_at) : "never"],
      ["State", (w) => w.stop_requested ? el("span", { class: "state STOPPING", "data-group": groupsOf("STOPPING"), "data-worker-state": "stopping" },
        `stopping (${w.stop_requested.actor})`) : el("span", { "data-worker-state": "running" }, "running")],
      ["", (w) => w.stop_requested ? "" : el("button", { "data-stop-worker": w.id, onclick: () => confirmStopWorker(w) }, "Drain and stop…")],
    ], ws, "workers-table"), el("p", { id: "cmd-result", role: "status" }, lastResult.workers || "")];
  },

  async schedules() {
    const rows = await api("GET", "/v1/schedules");  // one request: the list carries each next fire
    const admin = isAdmin();
    const btn = (s, label, fn) => el("button", { "data-schedule": s.name, "data-action": label.toLowerCase().replace(/\W+/g, "-"), onclick: fn }, label);
    const out = [el("h1", {}, "Schedules"), table([
      ["Name", (s) => el("a", { href: `#/schedule/${enc(s.name)}` }, jt(s.name))], ["Handler", (s) => jt(s.handler)],
      ["Every", (s) => s.cron || `${s.interval_s}s`],
      ["Timezone", (s) => s.timezone], ["Paused", (s) => s.paused ? "paused" : ""],
      ["Next fire", (s) => el("time", { datetime: s.next_fire_time }, fmtTime(s.next_fire_time))],
      ["Last", (s) => s.last_run_id ? [runLink(s.last_run_id), " ", s.last_status ? state(s.last_status) : ""] : ""],
      ["Fires / skipped", (s) => `${s.fires} / ${s.skipped}`],
      ["", (s) => admin ? el("span", { class: "commands" },
        btn(s, s.paused ? "Resume" : "Pause", () => scheduleCommand(s, s.paused ? "resume" : "pause")),
        btn(s, "Run now", () => scheduleCommand(s, "run-now")), btn(s, "Delete", () => scheduleCommand(s, "delete")),
        el("a", { href: `#/schedule/${enc(s.name)}`, "data-schedule": s.name, "data-action": "edit" }, "Edit")) : ""]],
    rows, "schedules-table"), el("p", { id: "cmd-result", role: "status" }, lastResult.schedules || "")];
    if (admin) {
      out.push(el("h2", {}, "New schedule"), el("form", { id: "schedule-form", class: "filters", "data-keep": true,
        onsubmit: (ev) => { ev.preventDefault(); createSchedule(ev.target); } },
      ["name", "handler", "queue", "cron", "interval_s", "timezone"].map((n) => el("span", { class: "field" },
        el("label", { for: `schedule-form-${n}` }, n === "interval_s" ? "or every N seconds" : n === "cron" ? "cron (0 3 * * *)" : n),
        el("input", { name: n, id: `schedule-form-${n}`, required: n === "name" || n === "handler", type: n === "interval_s" ? "number" : "text" }))),
      el("span", { class: "field" }, el("label", { for: "schedule-form-args" }, "arguments (JSON list)"),
        el("input", { name: "args", id: "schedule-form-args", placeholder: '["report"]' })),
      el("button", { type: "submit" }, "Create…")));
    }
    return out;
  },

  // One schedule: its definition, next fires, last fires with their runs' outcomes; admins pause / resume,
  // run now, delete and edit it in place (PATCH: only the fields changed, with a reason).
  async schedule(params, name) {
    const [s, runs, next] = await Promise.all([api("GET", `/v1/schedules/${name}`),
      api("GET", `/v1/schedules/${name}/runs?limit=20`), api("GET", `/v1/schedules/${name}/next?n=5`)]);
    const admin = isAdmin();
    const btn = (label, fn) => el("button", { "data-schedule": s.name, "data-action": label.toLowerCase().replace(/\W+/g, "-"), onclick: fn }, label);
    const out = [el("h1", {}, `Schedule ${s.name}`), el("div", { class: "grid", id: "schedule-fields" },
      ["handler", "queue", "cron", "interval_s", "timezone", "priority", "paused", "next_fire_time", "last_fire_time",
        "fires", "skipped", "created_at"]
        .filter((f) => s[f] !== null && s[f] !== undefined)
        .map((f) => [el("span", { class: "muted" }, f.replace(/_/g, " ")),
          el("span", { "data-field": f }, f.endsWith("_time") || f.endsWith("_at") ? fmtTime(s[f]) : String(s[f]))]),
      [el("span", { class: "muted" }, "arguments"), el("code", {}, JSON.stringify(s.args_json))]),
    admin ? el("div", { class: "commands", id: "schedule-commands" },
      btn(s.paused ? "Resume" : "Pause", () => scheduleCommand(s, s.paused ? "resume" : "pause")),
      btn("Run now", () => scheduleCommand(s, "run-now")), btn("Delete", () => scheduleCommand(s, "delete"))) : null,
    el("p", { id: "cmd-result", role: "status" }, lastResult.schedules || ""),
    el("h2", {}, "Next fires"), el("p", { id: "next-fires" }, next.fires.map((t, i) =>
      [i ? " · " : "", el("time", { datetime: t }, fmtTime(t))])),
    el("h2", {}, `Last fires (newest first, up to 20)`), table([["Fire time", (r) => fmtTime(r.fire_time)], ["Run", (r) => runLink(r.id)],
      ["State", (r) => state(r.status)], ["Attempt", (r) => r.attempt], ["Started", (r) => fmtTime(r.started_at)],
      ["Finished", (r) => fmtTime(r.finished_at)]], runs, "schedule-runs-table")];
    if (admin) out.push(el("h2", {}, "Edit"), scheduleEditForm(s));
    return out;
  },

  // The fleet's history: live from the tab's event stream while it is up (the list is loaded once when the
  // stream is ready, reports a gap or the filter changes, then every event recorded is added as it comes),
  // from the 2 s poll otherwise. The filter is applied here: one stream serves every view of the tab.
  async events(params) {
    const q = new URLSearchParams();
    for (const k of ["type", "queue"]) if (params.get(k)) q.set(k, params.get(k));
    const aq = new URLSearchParams({ limit: "100" });
    for (const k of ["actor", "queue"]) if (params.get(k)) aq.set(k, params.get(k));
    const list = () => api("GET", `/v1/events?${new URLSearchParams({ limit: "200", ...Object.fromEntries(q) })}`);
    let events;
    if (live.status === "live") {
      if (live.reload || live.listKey !== q.toString()) {
        live.reload = false;
        live.listKey = q.toString();
        live.merge(await list(), true);
      }
      events = live.events;
    } else events = await list();
    const audit = await api("GET", `/v1/audit?${aq}`);
    const actor = params.get("actor"), type = params.get("type"), queue = params.get("queue");
    const shown = events.filter((e) => (!actor || (e.actor || "").startsWith(actor)) && (!type || e.type === type) &&
      (!queue || e.queue === queue));
    return [el("h1", {}, "Fleet events"), filterForm("events-filter", "events", params,
      [["type", "event type"], ["queue", "queue"], ["actor", "actor"]]),
    el("p", { id: "events-live", class: "muted", "data-live": live.status === "live" ? "stream" : "poll" },
      live.status === "live" ? "Live: events appear as they are recorded." :
        `Refreshing every ${POLL_MS / 1000} s${live.why ? ` (live stream: ${live.why})` : ""}.`),
    table([["At", (e) => fmtTime(e.at)], ["Event", (e) => e.type], ["Run", (e) => e.run_id ? runLink(e.run_id) : ""],
      ["Queue", (e) => e.queue || ""], ["Handler", (e) => jt(e.handler || "")],
      ["Transition", (e) => e.from_status || e.to_status ? `${e.from_status || "·"} → ${e.to_status || "·"}` : ""],
      ["Worker", (e) => e.worker_id || ""], ["Actor", (e) => jt(e.actor || "")], ["Reason", (e) => jt(e.reason || "")],
      ["Error", (e) => jt(e.error_class || "")]], shown, "fleet-events-table"),
    el("h2", {}, "Audit log"), table([["At", (a) => fmtTime(a.at)], ["Actor", (a) => jt(a.actor)], ["Action", (a) => a.action],
      ["Queue", (a) => a.queue || ""], ["Target", (a) => jt(a.target || "")], ["Reason", (a) => jt(a.reason || "")],
      ["Detail", (a) => a.data ? el("code", { dir: "ltr", class: "detail" }, JSON.stringify(a.data)) : ""]], audit, "audit-table")];
  },

  // Activity over time from the per-minute rollup (GET /v1/stats, /v1/queues/{q}/stats): inline SVG.
  async charts(params) {
    const queue = params.get("queue"), window = params.get("window") || "1h", handler = params.get("handler");
    const hq = new URLSearchParams({ window });
    if (queue) hq.set("queue", queue);
    if (handler) hq.set("handler", handler);
    const [st, qs, hs] = await Promise.all([
      api("GET", queue ? `/v1/queues/${enc(queue)}/stats?window=${window}` : `/v1/stats?window=${window}`),
      api("GET", "/v1/queues"), api("GET", `/v1/ops/handlers?${hq}`)]);
    const pick = el("nav", { class: "filters", "aria-label": "chart window and queue" },
      ["1h", "24h", "7d"].map((w) => el("a", { href: `#/charts?${new URLSearchParams({ ...(queue ? { queue } : {}), window: w })}`,
        "aria-current": w === window ? "page" : null, class: w === window ? "chosen" : null }, w)), " · ",
      el("a", { href: `#/charts?window=${window}`, class: queue ? null : "chosen" }, "fleet"),
      qs.map((q) => el("a", { href: `#/charts?queue=${enc(q.queue)}&window=${window}`, class: q.queue === queue ? "chosen" : null }, q.queue)));
    const per = st.step_s >= 3600 ? `${st.step_s / 3600} h` : `${st.step_s / 60} min`;
    return [el("h1", {}, `Activity: ${queue || "fleet"}, last ${window}`), pick,
      el("h2", {}, `Runs per ${per}`), lineChart("chart-throughput", st.points,
        [["started", "started"], ["succeeded", "succeeded"], ["failed", "failed"], ["retried", "retried"]], ""),
      el("h2", {}, "Start lag (due → claimed)"), lineChart("chart-lag", st.points, [["lag_p50_ms", "p50"], ["lag_p95_ms", "p95"]], "ms"),
      el("h2", {}, "Run time (attempt start → finish)"), lineChart("chart-runtime", st.points,
        [["run_p50_ms", "p50"], ["run_p95_ms", "p95"]], "ms"),
      el("h2", { id: "by-handler" }, `By handler (attempts started in the last ${window})`),
      table([["Handler", (h) => el("a", { href: `#/charts?${new URLSearchParams({ ...(queue ? { queue } : {}), window, handler: h.handler })}`,
        "data-handler": h.handler, class: h.handler === handler ? "chosen" : null }, jt(h.handler))],
      ["Started", (h) => h.started], ["Succeeded", (h) => h.succeeded], ["Failed", (h) => h.failed],
      ["Error rate", (h) => h.started ? `${Math.round(100 * h.failed / h.started)}%` : ""],
      ["Run time p50", (h) => h.run_p50_ms === null ? "" : `${Math.round(h.run_p50_ms)} ms`],
      ["p95", (h) => h.run_p95_ms === null ? "" : `${Math.round(h.run_p95_ms)} ms`]], hs.handlers, "handlers-table"),
      handler ? [el("h2", {}, ["Handler ", jt(handler), `: runs per ${per}`]),
        lineChart("chart-handler-throughput", hs.points, [["started", "started"], ["succeeded", "succeeded"]], ""),
        el("h2", {}, ["Handler ", jt(handler), ": errors"]), lineChart("chart-handler-errors", hs.points, [["failed", "failed"]], ""),
        el("h2", {}, ["Handler ", jt(handler), ": run time"]), lineChart("chart-handler-runtime", hs.points,
          [["run_p50_ms", "p50"], ["run_p95_ms", "p95"]], "ms")] : el("p", { class: "muted" }, "Choose a handler for its charts.")];
  },

  // Batches (runs submitted together with on_complete / on_success callbacks), newest first.
  async batches(params) {
    const q = new URLSearchParams({ limit: "50" });
    if (params.get("cursor")) q.set("cursor", params.get("cursor"));
    const page = await api("GET", `/v1/batches?${q}`);
    return [el("h1", {}, "Batches"), table([
      ["Batch", (b) => el("a", { href: `#/batch/${b.id}` }, b.name ? jt(b.name) : b.id.slice(0, 8))],
      ["Created", (b) => el("span", { title: fmtTime(b.created_at) }, ago(b.created_at))],
      ["Members", (b) => b.members],
      ["Progress", (b) => el("progress", { value: b.succeeded + b.failed + b.cancelled, max: b.members || 1 })],
      ["Succeeded", (b) => b.succeeded], ["Failed", (b) => b.failed], ["Cancelled", (b) => b.cancelled],
      ["Waiting", (b) => b.waiting], ["Queues", (b) => b.queues.join(", ")],
      ["Settled", (b) => b.settled_at ? fmtTime(b.settled_at) : el("span", { class: "muted" }, "not yet")],
      ["Callbacks", (b) => [b.on_complete ? ["on complete ", runLink(b.on_complete)] : "", b.on_success ? [" on success ", runLink(b.on_success)] : ""]]],
    page.batches, "batches-table"),
    el("nav", { class: "pager", "aria-label": "pages" },
      el("button", { id: "next-page", disabled: !page.next, onclick: () => go("batches", params, { cursor: page.next }) }, "Older →"))];
  },

  async batch(params, id) {
    const b = await api("GET", `/v1/batches/${id}`);
    return [el("h1", {}, ["Batch ", jt(b.name || b.id)]), el("p", { class: "muted" }, b.id),
      el("div", { class: "grid", id: "batch-counts" }, Object.entries(b.counts).map(([k, n]) => [el("span", { class: "muted" }, k),
        el("span", { "data-count": k }, n)])),
      el("h2", {}, "Callbacks"), table([["Callback", (c) => c.kind], ["Run", (c) => runLink(c.id)], ["State", (c) => state(c.status)]],
        [["on complete", b.on_complete], ["on success", b.on_success]].filter(([, c]) => c).map(([kind, c]) => ({ ...c, kind })),
        "callbacks-table")];
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

// The dead letter, the review queue, the retries waiting and the scheduled runs: paged by the server's
// cursor (scoped before limited), filtered by queue and handler, with a bulk bar over everything that
// matches (counted by the server, one request to act) and over the rows ticked.
const LIST_VIEWS = {
  dead: { title: "Dead letter", note: "Runs that failed for good (retries exhausted, fatal errors, quarantined).",
    bulk: ["retry", "delete"], table: "dead-table", time: "finished_at" },
  review: { title: "Review queue", note: "Runs whose non-idempotent side effect may or may not have happened: check, then resolve.",
    bulk: ["resolve_succeeded", "resolve_failed", "retry", "delete"], table: "review-table", time: "finished_at" },
  retries: { title: "Retries waiting", note: "Runs that failed an attempt and wait for their next one (RETRY_WAIT).",
    bulk: ["run_now", "cancel"], table: "retries-table", time: "run_at" },
  scheduled: { title: "Scheduled", note: "Runs submitted with a delay or a time, not due yet.",
    bulk: ["run_now", "cancel"], table: "scheduled-table", time: "run_at" },
};

async function listView(list, route, params) {
  const v = LIST_VIEWS[list];
  const q = new URLSearchParams({ limit: params.get("limit") || "50" });
  for (const k of ["queue", "handler", "cursor"]) if (params.get(k)) q.set(k, params.get(k));
  const page = await api("GET", `/v1/ops/lists/${list}?${q}`);
  const rows = page.runs;
  const filter = {};
  for (const k of ["queue", "handler"]) if (params.get(k)) filter[k] = params.get(k);
  const shown = Object.entries(filter).map(([k, x]) => `${k} ${x}`).join(", ");
  const what = `${v.title.toLowerCase()}${shown ? " with " + shown : ""}`;
  const allowed = (a) => a !== "delete" || isAdmin();
  const sel = selected[list] || new Set();
  const bulkAll = () => { flushFilters(); const p = new URLSearchParams(location.hash.split("?")[1] || ""); const f = {};
    for (const k of ["queue", "handler"]) if (p.get(k)) f[k] = p.get(k); return f; };
  const rowCmds = (r) => {
    if (list === "review") return ["succeeded", "failed", "retry"].map((as) =>
      el("button", { onclick: () => confirmResolve(r, as) }, `Resolve as ${as}`));
    if (list === "dead") return el("button", { "data-row-action": "retry", onclick: () => confirmRun(r, "retry") }, "Retry");
    return el("button", { "data-row-action": "run_now", onclick: () => opsBulk(list, "ids", {}, [r.id], "run_now", `run ${r.id}`) }, "Run now");
  };
  return [el("h1", {}, v.title), el("p", { class: "muted" }, v.note),
    filterForm(`${list}-filter`, route, params, [["queue", "queue"], ["handler", "handler"]]),
    el("div", { class: "commands", id: "list-bulk" }, `All in ${what}: `,
      v.bulk.filter(allowed).map((a) => el("button", { "data-list-bulk": a, id: list === "dead" && a === "retry" ? "retry-all" : null,
        onclick: () => opsBulk(list, list, bulkAll(), [], a, what) }, bulkLabel(a, "all")))),
    sel.size ? el("div", { class: "commands", id: "selection" }, `${sel.size} selected: `,
      v.bulk.filter(allowed).map((a) => el("button", { "data-bulk-selected": a, onclick: () => actOnSelected(list, a) }, bulkLabel(a, sel.size))),
      el("button", { onclick: () => { sel.clear(); render(); } }, "Clear")) : null,
    el("p", { id: "bulk-result", role: "status" }, lastResult[list] || ""),
    table([
      ["", (r) => selectBox(list, r.id)],
      ["Id", (r) => runLink(r.id)], ["Handler", (r) => jt(r.handler)], ["Queue", (r) => r.queue], ["State", (r) => state(r.status)],
      ["Attempts", (r) => r.attempt],
      [v.time === "run_at" ? "Due" : "Finished", (r) => el("span", { title: ago(r[v.time]) }, fmtTime(r[v.time]))],
      ["Reason", (r) => jt(r.reason || "")],
      ["Error", (r) => [jt(r.last_error_class || ""), " ", longText(r.last_error, `${list}-${r.id}`)]],
      ["", rowCmds]], rows, v.table),
    el("nav", { class: "pager", "aria-label": "pages" },
      el("button", { id: "first-page", disabled: !params.get("cursor"), onclick: () => go(route, params, { cursor: "" }) }, "← First page"),
      el("button", { id: "next-page", disabled: !page.next, onclick: () => go(route, params, { cursor: page.next }) }, "Next page →"))];
}

// A run's timeline as the page has it: the events fetched so far (one per id) and the cursor to ask after.
const timeline = { id: null, events: [], cursor: null, ids: new Set() };

async function fetchTimeline(id) {
  let from = null;
  for (let i = 0; i < 5; i++) {
    const q = new URLSearchParams();
    if (timeline.cursor) q.set("after", timeline.cursor);
    if (from !== null) q.set("from_id", String(from));
    const t = await api("GET", `/v1/runs/${id}/timeline${q.toString() ? "?" + q : ""}`);
    if (timeline.id !== id) return;
    for (const e of t.events) if (!timeline.ids.has(e.id)) { timeline.ids.add(e.id); timeline.events.push(e); }
    timeline.cursor = t.cursor;
    if (!t.more) break;
    from = t.last_id;
  }
  timeline.events.sort((a, b) => Date.parse(a.at) - Date.parse(b.at) || a.id - b.id);
}

// A line chart as inline SVG: one polyline per series (gaps where a step has no value), the y axis
// from 0 to the largest value, the first and last times on the x axis; every point has a tooltip.
function lineChart(id, points, series, unit) {
  const NS = "http://www.w3.org/2000/svg";
  const s = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = visible(text);
    return e;
  };
  const W = 900, H = 180, L = 56, B = 22, T = 8;
  const max = Math.max(1, ...points.flatMap((p) => series.map(([k]) => p[k] ?? 0)));
  const x = (i) => L + (W - L - 8) * (points.length > 1 ? i / (points.length - 1) : 0);
  const y = (v) => T + (H - T - B) * (1 - v / max);
  const fmt = (v) => unit === "ms" ? (v >= 1000 ? `${(v / 1000).toFixed(1)} s` : `${Math.round(v)} ms`) : String(Math.round(v));
  const svg = s("svg", { id, class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": `${series.map(([, l]) => l).join(", ")}: peak ${fmt(max)}` });
  svg.append(s("line", { x1: L, y1: y(0), x2: W - 8, y2: y(0), class: "axis" }),
    s("line", { x1: L, y1: T, x2: L, y2: y(0), class: "axis" }),
    s("text", { x: L - 4, y: T + 10, "text-anchor": "end" }, fmt(max)), s("text", { x: L - 4, y: y(0), "text-anchor": "end" }, "0"));
  if (points.length) {
    svg.append(s("text", { x: L, y: H - 4 }, fmtTime(points[0].t)),
      s("text", { x: W - 8, y: H - 4, "text-anchor": "end" }, fmtTime(points[points.length - 1].t)));
  }
  series.forEach(([key, label], n) => {
    let run = [];
    const flush = () => {
      if (run.length) svg.append(s("polyline", { points: run.join(" "), class: `series s${n}`, "data-series": key }));
      run = [];
    };
    points.forEach((p, i) => {
      const v = p[key];
      if (v === null || v === undefined) { flush(); return; }
      run.push(`${x(i).toFixed(1)},${y(v).toFixed(1)}`);
      if (v) {
        const dot = s("circle", { cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 2.5, class: `series s${n}` });
        dot.append(s("title", {}, `${fmtTime(p.t)} ${label}: ${fmt(v)}`));
        svg.append(dot);
      }
    });
    flush();
  });
  const legend = el("p", { class: "legend" }, series.map(([key, label], n) => {
    const total = points.reduce((a, p) => a + (p[key] ?? 0), 0);
    return el("span", { class: `key s${n}` }, unit === "ms" ? label : `${label} (${total})`);
  }));
  return el("figure", { class: "chart" }, svg, legend);
}

function go(route, params, changes) {
  const q = new URLSearchParams(params);
  for (const [k, v] of Object.entries(changes)) if (v) q.set(k, v); else q.delete(k);
  location.hash = `#/${route}${q.toString() ? "?" + q : ""}`;
}

function timelineNote(events) {
  const ckpts = events.filter((e) => e.type === "checkpointed");
  return ckpts.length ? el("p", { class: "muted" }, `${ckpts.length} checkpoint events not shown (latest ${fmtTime(ckpts[ckpts.length - 1].at)}).`) : null;
}

// The DAG as SVG: one column per depth (longest path from a root), edges as lines. Names longer
// than a box are cut with an ellipsis; the full name is the node's tooltip.
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
  const W = 200, H = 46, BOX = 170, pos = {};
  Object.entries(cols).forEach(([c, ns]) => ns.forEach((n, i) => (pos[n.name] = [20 + c * W, 20 + i * H])));
  const width = 40 + (Object.keys(cols).length) * W, height = 40 + Math.max(...Object.values(cols).map((c) => c.length)) * H;
  const NS = "http://www.w3.org/2000/svg";
  const s = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text) e.textContent = visible(text);
    return e;
  };
  const svg = s("svg", { width, height, id: "workflow-graph", role: "img", "aria-label": "workflow graph" });
  nodes.forEach((n) => (n.depends_on || []).filter((u) => pos[u]).forEach((u) => svg.append(s("line", {
    x1: pos[u][0] + BOX, y1: pos[u][1] + 15, x2: pos[n.name][0], y2: pos[n.name][1] + 15, class: "edge" }))));
  nodes.forEach((n) => {
    const [x, y] = pos[n.name];
    const a = s("a", { href: `#/run/${n.id}` });
    const label = `${n.name} · ${n.status}`;
    const shown = label.length > 24 ? `${label.slice(0, 23)}…` : label;
    a.append(s("title", {}, label), s("rect", { x, y, width: BOX, height: 30, rx: 5, class: `node ${n.status}`, "data-group": groupsOf(n.status) }),
      s("text", { x: x + 6, y: y + 19 }, shown));
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
  if (reason !== null) await act(queue, `/v1/queues/${enc(queue)}/${verb}`, { reason }, `${verb} ${queue}`);
}

async function confirmStopWorker(w) {
  const reason = await ask(`Stop worker ${w.id}?`, `It stops claiming, finishes or releases the ${w.running.length} ` +
    `runs it holds (its grace period), then exits. Serving: ${w.queues.join(", ")}.`);
  if (reason === null) return;
  try {
    await api("POST", `/v1/workers/${enc(w.id)}/stop`, { reason });
    lastResult.workers = `asked ${w.id} to stop: it drains at its next heartbeat`;
  } catch (e) { lastResult.workers = `stop ${w.id} refused: ${e.message}`; }
  await render();
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

// -- bulk actions: counted by the server, confirmed with the count's handle ----------------------
// POST /v1/ops/bulk/count stores the runs that match (with their versions) under a handle and says how
// many (a 200: the API's own count answers 428, which a browser logs as an error); the confirmation
// names the handle and the number, and the server acts on exactly those runs, skipping any that moved.
const VERB = { retry: "Retry", cancel: "Cancel", pause: "Pause", resume: "Resume", restart: "Restart",
  run_now: "Run now", delete: "Delete", resolve_succeeded: "Resolve", resolve_failed: "Resolve" };
const RESOLVED_AS = { resolve_succeeded: "succeeded", resolve_failed: "failed" };

// "Retry all…", "Retry 3", "Resolve all as failed…", "Resolve 3 runs as succeeded?" (`n`: "all", a number, or
// with `ask` the confirmation's title).
function bulkLabel(action, n, ask = false) {
  const as = RESOLVED_AS[action] ? ` as ${RESOLVED_AS[action]}` : "";
  if (ask) return `${VERB[action]} ${n} runs${as}?`;
  return n === "all" ? `${VERB[action]} all${as}…` : `${VERB[action]} ${n}${as}`;
}
const RUN_FILTERS = ["queue", "status", "handler", "tenant", "concurrency_key", "idempotency_key", "arg", "since", "until", "id"];

async function opsBulk(key, list, filter, ids, action, what) {
  const body = { action, list, filter, ids: ids || [] };
  let counted;
  try { counted = await api("POST", "/v1/ops/bulk/count", body); } catch (e) {
    lastResult[key] = `${VERB[action]} refused: ${e.message}`;
    return render();
  }
  if (!counted.acting) {
    lastResult[key] = counted.matched ? `no run of the ${counted.matched} matching takes ${action}` : "no run matches";
    return render();
  }
  const sample = counted.sample.slice(0, 10).join(", ") + (counted.acting > 10 ? " …" : "");
  const reason = await ask(bulkLabel(action, counted.acting, true), `${what}: ${counted.acting} runs counted ` +
    `(ids ${sample}). Exactly these, each only if it has not moved since this count` +
    (action === "delete" ? "; they leave every list for the archive, their history stays." : "."));
  if (reason === null) return;
  try {
    const out = await api("POST", "/v1/ops/bulk", { ...body, handle: counted.handle, confirm: counted.acting, reason });
    lastResult[key] = `${action}: ${out.acted} of ${counted.acting} done` + (out.skipped.length
      ? `, ${out.skipped.length} skipped (moved meanwhile): ${out.skipped.slice(0, 3).map((x) => `${x.id} ${x.reason}`).join("; ")}` : "");
    if (selected[key]) selected[key].clear();
  } catch (e) { lastResult[key] = `${action} refused: ${e.message}`; }
  await render();
}

async function actOnSelected(view, verb) {
  const ids = [...(selected[view] || [])];
  await opsBulk(view, "ids", {}, ids, verb, `${ids.length} selected runs`);
}

// The runs list's filter (admin): what the filter box shows is applied first, then counted.
function bulkBar(params) {
  if (!isAdmin()) return null;
  const status = params.get("status");
  const verbs = ["pause", "cancel", "retry", "resume", "delete"].filter((v) => !status || COMMANDS[v].includes(status));
  return el("div", { class: "commands", id: "bulk-bar" }, "All runs matching the filter: ",
    verbs.map((v) => el("button", { "data-bulk": v, onclick: () => bulkByFilter(v) }, `${VERB[v]} all…`)));
}

async function bulkByFilter(verb) {
  flushFilters();  // the box, not an older URL, is what the operator sees
  const q = new URLSearchParams(location.hash.split("?")[1] || "");
  const filter = {};
  for (const k of RUN_FILTERS) if (q.get(k)) filter[k] = k === "id" ? Number(q.get(k)) : q.get(k);
  const shown = Object.entries(filter).map(([k, v]) => `${k} ${v}`).join(", ") || "every run";
  await opsBulk("bulk", "runs", filter, [], verb, `runs with ${shown}`);
}

async function scheduleCommand(s, action) {
  const reason = await ask(`${action} schedule ${s.name}?`, action === "delete" ? "It fires no more; its runs stay." :
    action === "run-now" ? "One run now; its next scheduled fire does not move." : "");
  if (reason === null) return;
  const path = `/v1/schedules/${enc(s.name)}`;
  try {
    if (action === "delete") {
      await api("DELETE", `${path}?reason=${enc(reason)}`);
      if (location.hash.startsWith("#/schedule/")) location.hash = "#/schedules";
    }
    else {
      const out = await api("POST", `${path}/${action}`, { reason });
      if (action === "run-now") { lastResult.schedules = `${s.name} fired: run ${out.id}`; return render(); }
    }
    lastResult.schedules = `${action} ${s.name}: done`;
  } catch (e) { lastResult.schedules = `${action} ${s.name} refused: ${e.message}`; }
  await render();
}

// The edit form of a schedule, filled with what it is now; kept across refreshes while the operator types.
const EDITABLE = [["cron", "cron (0 3 * * *)"], ["interval_s", "or every N seconds", "number"], ["timezone", "timezone"],
  ["handler", "handler"], ["queue", "queue (empty: the handler's)"], ["priority", "priority (empty: the handler's)", "number"],
  ["args", "arguments (JSON list)"], ["kwargs", "keyword arguments (JSON object)"]];

function scheduleFormValue(s, f) {
  if (f === "args") return JSON.stringify((s.args_json && s.args_json.args) || []);
  if (f === "kwargs") return JSON.stringify((s.args_json && s.args_json.kwargs) || {});
  return s[f] === null || s[f] === undefined ? "" : String(s[f]);
}

function scheduleEditForm(s) {
  return el("form", { id: "schedule-edit", class: "filters", "data-keep": true, "aria-label": `edit schedule ${s.name}`,
    onsubmit: (ev) => { ev.preventDefault(); editSchedule(s, ev.target); } },
  EDITABLE.map(([f, label, type]) => el("label", {}, `${label} `, el("input", { name: f, value: scheduleFormValue(s, f),
    type: type || "text", step: type === "number" ? "any" : null }))),
  el("button", { type: "submit" }, "Save…"));
}

// Only what the operator changed goes to PATCH /v1/schedules/{name}. A cron line and an interval exclude
// each other: whichever was changed (and is not empty) is sent, and the server clears the other.
function scheduleChanges(s, form) {
  const f = Object.fromEntries(new FormData(form).entries());
  const body = {};
  const cronChanged = f.cron.trim() !== scheduleFormValue(s, "cron"), ivChanged = f.interval_s !== scheduleFormValue(s, "interval_s");
  if (cronChanged && f.cron.trim() && ivChanged && f.interval_s) throw new Error("give a cron line or an interval, not both");
  if (cronChanged && f.cron.trim()) body.cron = f.cron.trim();
  else if (ivChanged && f.interval_s) body.interval_s = Number(f.interval_s);
  else if ((cronChanged || ivChanged) && !f.cron.trim() && !f.interval_s) throw new Error("a schedule needs a cron line or an interval");
  for (const k of ["timezone", "handler"]) if (f[k].trim() !== scheduleFormValue(s, k)) body[k] = f[k].trim();
  if (f.queue.trim() !== scheduleFormValue(s, "queue")) body.queue = f.queue.trim() || null;
  if (f.priority !== scheduleFormValue(s, "priority")) body.priority = f.priority === "" ? null : Number(f.priority);
  for (const k of ["args", "kwargs"]) {
    if (f[k].trim() === scheduleFormValue(s, k)) continue;
    try { body[k] = JSON.parse(f[k]); } catch (e) { throw new Error(`${k}: ${e.message}`); }
    if (JSON.stringify(body[k]) === scheduleFormValue(s, k)) delete body[k];  // the same value, spelt differently
  }
  return body;
}

async function editSchedule(s, form) {
  let body;
  try { body = scheduleChanges(s, form); } catch (e) { lastResult.schedules = `edit ${s.name}: ${e.message}`; return render(); }
  const keys = Object.keys(body);
  if (!keys.length) { lastResult.schedules = `edit ${s.name}: nothing changed`; return render(); }
  const show = (v) => v === null || v === undefined || v === "" ? "(default)" : typeof v === "string" ? v : JSON.stringify(v);
  const lines = keys.map((k) => k === "cron" || k === "interval_s"
    ? `timing: ${s.cron ? "cron " + s.cron : "every " + s.interval_s + " s"} → ${body.cron ? "cron " + body.cron : "every " + body.interval_s + " s"}`
    : `${k}: ${k === "args" || k === "kwargs" ? scheduleFormValue(s, k) : show(s[k])} → ${show(body[k])}`);
  const reason = await ask(`Edit schedule ${s.name}?`, `${lines.join("; ")}. A new timing or timezone recomputes the next fire from now.`);
  if (reason === null) return;
  try {
    const out = await api("PATCH", `/v1/schedules/${enc(s.name)}`, { ...body, reason });
    lastResult.schedules = `updated ${s.name}: next fire ${fmtTime(out.next_fire_time)}`;
    form.removeAttribute("id");  // the next render shows the schedule as it now is, not the form as typed
  } catch (e) { lastResult.schedules = `edit ${s.name} refused: ${e.message}`; }
  await render();
}

async function createSchedule(form) {
  const f = Object.fromEntries([...new FormData(form).entries()].filter(([, v]) => v !== ""));
  const body = { name: f.name, handler: f.handler };
  for (const k of ["queue", "cron", "timezone"]) if (f[k]) body[k] = f[k];
  if (f.interval_s) body.interval_s = Number(f.interval_s);
  try { if (f.args) body.args = JSON.parse(f.args); } catch (e) { lastResult.schedules = `arguments: ${e.message}`; return render(); }
  const reason = await ask(`Create schedule ${body.name}?`, `${body.handler} ${body.cron ? "at " + body.cron : "every " + body.interval_s + " s"}.`);
  if (reason === null) return;
  try {
    await api("POST", "/v1/schedules", { ...body, reason });
    lastResult.schedules = `created ${body.name}`;
    form.reset();
  } catch (e) { lastResult.schedules = `create ${body.name} refused: ${e.message}`; }
  await render();
}

// A queue's concurrency (its max_running: runs leased at once over all workers), from the queues view.
async function setConcurrency(queue, form) {
  const raw = new FormData(form).get("value");
  const value = raw === "" || raw === null ? null : Number(raw);
  const reason = await ask(`Change the concurrency of ${queue}?`, value === null
    ? "No queue-wide limit: each worker's own concurrency applies." : `At most ${value} runs of ${queue} leased at once, over all workers.`);
  if (reason === null) return;
  try {
    await api("POST", `/v1/queues/${enc(queue)}/dispatch`, { setting: "max_running", value, reason });
    lastResult.queues = `concurrency of ${queue}: ${value === null ? "no limit" : value}`;
    form.reset();
  } catch (e) { lastResult.queues = `concurrency of ${queue} refused: ${e.message}`; }
  await render();
}

async function changeDispatch(queue, form) {
  const f = Object.fromEntries(new FormData(form).entries());
  const body = { setting: f.setting, value: f.value === "" ? null : Number(f.value) };
  if (f.setting === "weight") body.tenant = f.tenant;
  if (f.setting === "limit") body.key = f.key;
  if (f.setting === "rate") {  // a rate is text (100/1s); no key: the whole queue's
    delete body.value;
    body.rate = f.rate === "" ? null : f.rate;
    if (f.key) body.key = f.key;
  }
  const shown = f.setting === "rate" ? body.rate : body.value;
  const reason = await ask(`Change ${f.setting} of ${queue}?`, `${f.setting}${body.tenant ? " of tenant " + body.tenant : ""}` +
    `${body.key ? " of key " + body.key : ""} → ${shown === null ? "the default" : shown}.`);
  if (reason === null) return;
  try {
    await api("POST", `/v1/queues/${enc(queue)}/dispatch`, { ...body, reason });
    lastResult[`dispatch:${queue}`] = `${f.setting} changed`;
  } catch (e) { lastResult[`dispatch:${queue}`] = `refused: ${e.message}`; }
  await render();
}

// -- the live event stream ------------------------------------------------------------------
// One stream per tab: GET /v1/events/stream (unfiltered: the token's scope decides what comes) read with
// fetch, so the token goes in the Authorization header, never in a URL, and parsed as Server-Sent Events.
// It is opened at login and closed at logout. Each event is kept for the events view (the latest
// EVENTS_KEPT) and marks the view shown as changed when it concerns it; a changed view is rebuilt at most
// every RENDER_GAP_MS. When the stream fails or ends it is reopened after a pause (growing to 30 s);
// meanwhile every view refreshes by the 2 s poll.
const EVENTS_KEPT = 500;
const live = {
  controller: null, status: "off", why: "", reload: false, retry: null, delay: 2000, events: [], ids: new Set(),
  listKey: null, on: false,
  merge(rows, replace) {
    if (replace) { this.events = []; this.ids = new Set(); }
    for (const e of rows) if (!this.ids.has(e.id)) { this.ids.add(e.id); this.events.push({ ...e, t: Date.parse(e.at) }); }
    this.events.sort((a, b) => b.t - a.t || b.id - a.id);  // as GET /v1/events orders them: newest first
    if (this.events.length > EVENTS_KEPT) {
      for (const e of this.events.splice(EVENTS_KEPT)) this.ids.delete(e.id);
    }
  },
};

function startLive() {
  if (live.on) return;
  live.on = true;
  openLive();
}

function stopLive() {
  if (live.controller) live.controller.abort();
  clearTimeout(live.retry);
  Object.assign(live, { on: false, controller: null, retry: null, status: "off", why: "", events: [], ids: new Set(),
    listKey: null, delay: 2000 });
}

async function openLive() {
  const ctl = new AbortController();
  live.controller = ctl;
  live.status = "connecting";
  let why = "closed";
  try {
    const resp = await fetch("/v1/events/stream", { signal: ctl.signal,
      headers: { Authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY) || ""}`, Accept: "text/event-stream" } });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value.replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const msg = { event: "message", data: "" };
        for (const line of buf.slice(0, cut).split("\n")) {
          if (!line || line.startsWith(":")) continue;
          const at = line.indexOf(":");
          const field = at < 0 ? line : line.slice(0, at), value = at < 0 ? "" : line.slice(at + 1).replace(/^ /, "");
          if (field === "data") msg.data += (msg.data ? "\n" : "") + value; else msg[field] = value;
        }
        buf = buf.slice(cut + 2);
        if (live.controller !== ctl) return;
        onLive(msg);
        if (msg.event === "end") why = JSON.parse(msg.data || "{}").reason || "ended";
      }
    }
  } catch (e) {
    if (ctl.signal.aborted) return;
    why = e.message;
  }
  if (live.controller !== ctl || !live.on) return;
  const again = why === "duration";  // the server's regular end: straight back
  Object.assign(live, { controller: null, status: "off", why: again ? "" : why });
  live.retry = setTimeout(() => { live.retry = null; if (live.on) openLive(); }, again ? 0 : live.delay);
  live.delay = again ? live.delay : Math.min(live.delay * 2, 30000);
  changed();
}

function onLive(msg) {
  if (msg.event === "ready") {  // subscribed: everything recorded from now on comes; reload what came before
    Object.assign(live, { status: "live", why: "", reload: true, delay: 2000 });
    changed();
  } else if (msg.event === "fleet") {
    const e = JSON.parse(msg.data);
    live.merge([e]);
    if (concerns(e)) changed();
  } else if (msg.event === "gap") {
    live.reload = true;
    changed();
  }
}

// Whether an event can change the view shown: a run's page changes with its own events only.
function concerns(e) {
  const [path] = (location.hash.slice(2) || "queues").split("?");
  const [name, id] = path.split("/");
  return name !== "run" || String(e.run_id) === id;
}

// -- routing, live rebuilds and the fallback poll ---------------------------------------------
let lastRender = 0, pending = null, forget = false;

function changed() {  // rebuild the view soon: at once if the last rebuild is old enough, else after the gap
  if (pending) return;
  const wait = Math.max(0, lastRender + RENDER_GAP_MS - Date.now());
  pending = setTimeout(() => { pending = null; render(); }, wait);
}

function tick() {  // once a second: the poll while the stream is down, a slow refresh while it is up
  if (!me || pending) return;
  const [name] = (location.hash.slice(2) || "queues").split("?")[0].split("/");
  const every = live.status === "live" ? (LIVE_REFRESH_MS[name] || LIVE_REFRESH_MS.default) : POLL_MS;
  if (Date.now() - lastRender >= every) render();
}

let rendering = false, again = false;
async function render() {
  if (!me || $("confirm").open) return;
  if (rendering) { again = true; return; }  // one more pass after this one: a command's result is never lost
  rendering = true;
  again = false;
  lastRender = Date.now();
  if (pending) { clearTimeout(pending); pending = null; }
  try {
    const [path, query] = (location.hash.slice(2) || "queues").split("?");
    const [name, id] = path.split("/");
    const view = views[name] || views.queues;
    document.querySelectorAll("#nav a").forEach((a) => {
      const here = a.getAttribute("href") === `#/${name}`;
      a.classList.toggle("active", here);
      if (here) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
    });
    try {
      const content = (await view(new URLSearchParams(query || ""), id)).flat(Infinity)
        .filter((c) => c !== null && c !== undefined && c !== false);
      if ($("confirm").open) return;
      const frag = document.createDocumentFragment();
      frag.append(...content);
      const active = document.activeElement;
      const sel = active && typeof active.selectionStart === "number" ? [active.selectionStart, active.selectionEnd] : null;
      if (lastRoute === path && !forget) {  // the same view: what the operator is filling in stays as it is
        frag.querySelectorAll("[data-keep][id]").forEach((fresh) => {
          const old = document.getElementById(fresh.getAttribute("id"));  // not .id: a form's field named id shadows it
          if (old && $("view").contains(old)) fresh.replaceWith(old);
        });
      }
      forget = false;
      $("view").replaceChildren(frag);
      lastRoute = path;
      document.body.dataset.renders = String(Number(document.body.dataset.renders || 0) + 1);  // tests wait on it
      if (active && active !== document.body && document.contains(active) && document.activeElement !== active) {
        active.focus();
        if (sel) try { active.setSelectionRange(...sel); } catch (e) { /* not a text field */ }
      }
      showError(null);
    } catch (e) { showError(e); }
  } finally {
    rendering = false;
    if (again) render();
  }
}

function start() {
  clearInterval(tickTimer);
  startLive();
  render();
  tickTimer = setInterval(tick, 1000);
}

$("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  if (await login($("token").value.trim())) start();
});
$("logout").addEventListener("click", logout);
// A hash the filter form set keeps the form as typed; any other (Back, Forward, a link, a typed URL)
// shows the URL's filter in the box: pending changes are dropped and the forms are rebuilt from the URL.
window.addEventListener("hashchange", () => {
  if (location.hash !== ownHash) {
    for (const [timer] of filterTimers.values()) clearTimeout(timer);
    filterTimers.clear();
    forget = true;
  }
  ownHash = null;
  render();
});
document.addEventListener("fencepost:refresh", () => render());  // a rebuild on request (tests)

(async () => {
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved && await login(saved)) start();
  else logout();
})();
