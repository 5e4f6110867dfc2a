"""Trace context and OpenTelemetry (the `otel` extra): a run submitted from a job continues its
trace with a span id of its own; with a tracer, spans for submit, claim-to-start, execution and
finish, parent and child runs linked (the child's submit is a child of the parent's execution);
without the extra, nothing is imported and submits work as before."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from fencepost.client import Client
from fencepost.core import tracing
from fencepost.core.config import Settings
from fencepost.core.registry import Registry
from fencepost.core.tracing import trace_id
from fencepost.worker.context import Context
from fencepost.worker.runtime import Worker, WorkerOptions
from tests.apps import registry as apps
from tests.conftest import ROOT, worker_env

sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind  # noqa: E402

registry = Registry()
Q = "oq"
_client: list[Client] = []


@registry.job("o.parent", queue=Q)
async def parent(ctx: Context) -> dict[str, Any]:
    """Submits a child run from inside the job; returns what it saw."""
    child = await _client[0].submit("o.child")
    return {"trace": ctx.trace, "child": child}


@registry.job("o.child", queue=Q)
async def child(ctx: Context) -> str | None:
    return ctx.trace


async def _drain(settings: Settings) -> None:
    await Worker(registry, WorkerOptions(queues=[Q], burst=True, processes=1), settings=settings).run()


def _ids(tp: str) -> str:
    """A traceparent without its flags (the SDK may set the random-trace-id flag besides sampled)."""
    return tp.rsplit("-", 1)[0]


def _span_id(tp: str) -> str:
    return tp.split("-")[2]


async def test_a_child_run_gets_a_span_id_of_its_own(client: Client, settings: Settings) -> None:
    """Issue 16: a child got exactly the parent's traceparent (same span id)."""
    await client.register(registry)
    _client[:] = [client]
    rid = await client.submit("o.parent")
    await _drain(settings)
    out = (await client.wait(rid, timeout=30)).result
    child_tp = (await client.wait(out["child"], timeout=30)).result
    parent_tp = (await client.get(rid))["trace_id"]
    assert out["trace"] == parent_tp, "without a tracer the handler sees the run's traceparent as submitted"
    assert trace_id(child_tp) == trace_id(parent_tp), "the child continues the parent's trace"
    assert _span_id(child_tp) != _span_id(parent_tp), "with a span id of its own"


async def test_spans_for_submit_claim_run_and_finish_linked_across_parent_and_child(
        client: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # the application's provider, without making it global for the rest of the test session
    monkeypatch.setattr(tracing, "_tracer", lambda: provider.get_tracer("fencepost"))
    await client.register(registry)
    _client[:] = [client]
    rid = await client.submit("o.parent")
    await _drain(settings)
    out = (await client.wait(rid, timeout=30)).result
    await client.wait(out["child"], timeout=30)
    spans = exporter.get_finished_spans()
    by = {(s.name, s.context.trace_id): s for s in spans}
    names = sorted(s.name for s in spans)
    assert names == sorted(f"fencepost.{k} o.{r}" for k in ("submit", "claim", "run", "finish")
                           for r in ("parent", "child")), names
    tid = spans[0].context.trace_id
    assert all(s.context.trace_id == tid for s in spans), "one trace from the first submit to the child's finish"
    p_submit, p_claim, p_run, p_finish = (by[(f"fencepost.{k} o.parent", tid)] for k in
                                          ("submit", "claim", "run", "finish"))
    c_submit, c_claim, c_run, c_finish = (by[(f"fencepost.{k} o.child", tid)] for k in
                                          ("submit", "claim", "run", "finish"))
    assert (p_submit.kind, p_run.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER)
    # the run carries its submit span; claim and run hang off it; finish off the run
    assert _ids((await client.get(rid))["trace_id"]) == f"00-{tid:032x}-{p_submit.context.span_id:016x}"
    assert p_claim.parent.span_id == p_submit.context.span_id and p_run.parent.span_id == p_submit.context.span_id
    assert p_finish.parent.span_id == p_run.context.span_id
    assert p_claim.start_time <= p_run.start_time
    # the child's submit is a child of the parent's execution; the child has new span ids throughout
    assert c_submit.parent.span_id == p_run.context.span_id
    assert c_claim.parent.span_id == c_submit.context.span_id == c_run.parent.span_id
    assert c_finish.parent.span_id == c_run.context.span_id
    assert _ids(out["trace"]) == f"00-{tid:032x}-{p_run.context.span_id:016x}", "the handler sees its execution span"
    assert p_run.attributes["fencepost.run_id"] == rid and p_run.attributes["fencepost.outcome"] == "ok"


async def test_without_the_extra_nothing_is_imported_and_submits_work(client: Client, settings: Settings) -> None:
    """`opentelemetry` made unimportable: tracing is off, a real submit through the CLI works."""
    await client.register(apps)
    code = ("import sys; sys.modules['opentelemetry'] = None\n"
            "from fencepost.core import tracing\n"
            "assert tracing.OTEL is False and tracing.start_run(None, 'h', 'q', 1, 1) is None\n"
            "tp = tracing.submit_traceparent(None, 'h', 'q')\n"
            "child = tracing.traceparent_var.set(tp) and tracing.submit_traceparent(None, 'h', 'q')\n"
            "assert child.split('-')[1] == tp.split('-')[1] and child.split('-')[2] != tp.split('-')[2]\n"
            "from fencepost.cli import main\n"
            "sys.argv = ['fencepost', 'submit', 't.echo', '--args', '[1]']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "assert not [m for m in sys.modules if m.startswith('opentelemetry') and sys.modules[m] is not None]\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=worker_env(settings), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().isdigit(), out.stdout


def test_a_provider_set_by_the_application_turns_tracing_on(settings: Settings) -> None:
    code = ("from fencepost.core import tracing\n"
            "assert tracing._tracer() is None  # the API without a provider: no spans made\n"
            "from opentelemetry import trace\n"
            "from opentelemetry.sdk.trace import TracerProvider\n"
            "trace.set_tracer_provider(TracerProvider())\n"
            "assert tracing._tracer() is not None\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=worker_env(settings), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
