"""`fencepost workflow show / retry`."""

from __future__ import annotations

import sys

import click

from fencepost.cli.common import async_command, json_option, operator, print_json, table, to_json
from fencepost.core.config import Settings
from fencepost.core.states import FAILED_FOR_GOOD, Status
from fencepost.core.views import Workflow
from fencepost.workflows import layers

__all__ = ["draw", "workflow"]

_MARK = {"SUCCEEDED": "✔", "FAILED": "✘", "TIMED_OUT": "✘", "CANCELLED": "⊘", "RUNNING": "▶", "STOPPING": "▶",
         "PENDING": "◌", "RETRY_WAIT": "↻", "BLOCKED": "·", "PAUSED": "‖", "STOPPED": "■"}
_WITH_REASON = FAILED_FOR_GOOD - {Status.TIMED_OUT}  # shown with why they ended (a timeout says it)
_COLOUR = {"SUCCEEDED": "green", "FAILED": "red", "TIMED_OUT": "red", "CANCELLED": "yellow", "RUNNING": "cyan",
           "STOPPING": "cyan", "RETRY_WAIT": "magenta"}


def draw(wf: Workflow, *, colour: bool = False) -> list[str]:
    """The graph as text: one band per depth, each node with its state and upstreams."""
    nodes = wf["nodes"]
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n["status"]] = counts.get(n["status"], 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    out = [f"workflow {wf['id']}" + (f" ({wf['name']})" if wf.get("name") else "") + f": {len(nodes)} nodes, {summary}"]
    width = max((len(n["name"]) for n in nodes), default=4)
    for depth, band in enumerate(layers(nodes)):
        shown = band if len(band) <= 40 else [*band[:20], None, *band[-5:]]
        for i, n in enumerate(shown):
            lead = f"{depth:>3} ┃ " if i == 0 else "    ┃ "
            if n is None:
                out.append(f"{lead}… {len(band) - 25} more at this depth")
                continue
            st = n["status"]
            label = f"{_MARK.get(st, '?')} {st:<10}"
            if colour and st in _COLOUR:
                label = click.style(label, fg=_COLOUR[st])
            ups = n["depends_on"]
            shown_ups = ", ".join(ups) if len(ups) <= 6 else f"{', '.join(ups[:6])} +{len(ups) - 6}"
            arrow = f"  ◀ {shown_ups}" if ups else ""
            why = f" ({n['reason']})" if n.get("reason") and st in _WITH_REASON else ""
            out.append(f"{lead}{n['name']:<{width}}  {label} run {n['id']}{why}{arrow}")
    return out


@click.group()
def workflow() -> None:
    """DAG workflows."""


SHORT = 8
"""`workflow ls` prints ids cut to this many characters; every command accepts any unique prefix."""


@workflow.command("ls")
@click.option("--limit", type=int, default=50, show_default=True)
@json_option
@async_command
async def ls(settings: Settings, limit: int, as_json: bool) -> None:
    """Recent workflows, newest first (ids shortened; `workflow show` takes any unique prefix)."""
    async with operator(settings) as op:
        rows = await op.workflows(limit=limit)
    if as_json:
        print_json(rows)
        return
    table([{**to_json(r), "id": str(r.id)[:SHORT], "created_at": r.created_at} for r in rows],
          ["id", "name", "nodes", "created_at"])


@workflow.command("show")
@click.argument("workflow_id")
@json_option
@async_command
async def show(settings: Settings, workflow_id: str, as_json: bool) -> None:
    """Draw the graph with the state of every node (WORKFLOW_ID: the id or a unique prefix of it)."""
    async with operator(settings) as op:
        wf = await op.workflow(await op.workflow_id(workflow_id))
    if as_json:
        print_json(wf)
        return
    for line in draw(wf, colour=sys.stdout.isatty()):
        click.echo(line)


@workflow.command("retry")
@click.argument("workflow_id")
@click.option("--recompute", multiple=True, help="Re-run this node and all its descendants (repeatable).")
@click.option("--reason", default="")
@async_command
async def retry(settings: Settings, workflow_id: str, recompute: tuple[str, ...], reason: str) -> None:
    """Re-run failed/stopped/cancelled nodes and their descendants; succeeded nodes are kept."""
    async with operator(settings) as op:
        done = await op.retry_workflow(await op.workflow_id(workflow_id), recompute=recompute, reason=reason)
    if not any(done.values()):
        click.echo("nothing to retry")
    for k, v in done.items():
        if v:
            click.echo(f"{k}: {', '.join(v)}")
