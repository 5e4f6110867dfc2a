"""Deployment artefacts (issue 8): compose.yaml validated with `docker-compose config` (Debian's
docker-compose package; no engine needed), the Prometheus config it mounts, the Kubernetes
worker manifest, and the Little's-law scale hint (CLI and reconciler gauge)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import Submit
from fencepost.core.scaling import recommend
from tests.conftest import need_tool

ROOT = Path(__file__).resolve().parent.parent
LONG_RUNNING = ("redis", "postgres", "api", "trigger", "reconciler", "worker", "prometheus")


def compose_config() -> dict:
    exe = need_tool("docker-compose")
    out = subprocess.run([exe, "-f", "compose.yaml", "config"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"docker-compose config rejected compose.yaml:\n{out.stderr}{out.stdout}"
    return yaml.safe_load(out.stdout)


def test_compose_file_is_valid_and_complete() -> None:
    cfg = compose_config()
    services = cfg["services"]
    assert set(services) >= {"redis", "postgres", "migrate", "api", "trigger", "reconciler", "worker", "prometheus"}
    for name in LONG_RUNNING:
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    redis_cmd = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_cmd and "--maxmemory-policy noeviction" in redis_cmd
    assert services["api"]["command"][:2] == ["fencepost", "api"]
    assert services["trigger"]["command"][:2] == ["fencepost", "trigger"]
    mounts = " ".join(str(v) for v in services["prometheus"]["volumes"])
    assert "docs/alerts/fencepost.rules.yml" in mounts and "docs/deploy/prometheus.yml" in mounts
    for name in ("api", "trigger", "reconciler", "worker"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_prometheus_config_loads_the_alert_rules(tmp_path: Path) -> None:
    promtool = need_tool("promtool")
    conf = (ROOT / "docs/deploy/prometheus.yml").read_text()
    rules = "/etc/prometheus/rules/fencepost.rules.yml"  # where compose.yaml mounts the rule file
    assert rules in conf
    local = tmp_path / "prometheus.yml"
    local.write_text(conf.replace(rules, str(ROOT / "docs/alerts/fencepost.rules.yml")))
    out = subprocess.run([promtool, "check", "config", str(local)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_kubernetes_worker_manifest_autoscales_on_lag() -> None:
    docs = list(yaml.safe_load_all((ROOT / "docs/deploy/k8s-worker.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"Deployment", "HorizontalPodAutoscaler"}
    dep, hpa = kinds["Deployment"], kinds["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    names = {m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "External"}
    assert names == {"fencepost_queue_oldest_pending_seconds", "fencepost_scale_hint_workers"}
    pod = dep["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 30  # longer than the worker's --grace


def test_scale_hint_matches_the_hld_sizing() -> None:
    # HLD: 6K dispatches/s at peak x 2 s median run time = 12K runs in flight
    required, in_flight, exact, n = recommend(arrival_per_s=6000, mean_run_s=2.0, backlog=0, target_lag_s=10,
                                              concurrency=50, utilisation=0.8)
    assert (required, in_flight) == (6000, 12000) and n == 300 == math.ceil(exact)
    # a backlog adds the rate that drains it within the target lag
    assert recommend(arrival_per_s=0, mean_run_s=1.0, backlog=1000, target_lag_s=10, concurrency=10,
                     utilisation=1.0)[3] == 10
    with pytest.raises(ValueError):
        recommend(arrival_per_s=1, mean_run_s=1, backlog=0, target_lag_s=0, concurrency=1)


async def test_scale_hint_cli_and_reconciler_gauge(client: Client, settings: Settings) -> None:
    from fencepost.reconciler.scalehint import WORKERS, ScaleHints

    await client.submit_many([Submit(handler="t.noop")] * 40)
    args = [sys.executable, "-m", "fencepost.cli", "--database-url", settings.database_url, "scale-hint",
            "--queue", "tq", "--target-lag", "5", "--window", "300", "--run-time", "2", "--concurrency", "10"]
    out = subprocess.run([*args, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    h = json.loads(out.stdout)
    # 40 runs in 300 s, 40 due now: mu = 40/300 + 40/5; L = mu x 2; N = ceil(L / (10 x 0.8))
    expect = math.ceil((40 / 300 + 40 / 5) * 2 / 8)
    assert (h["created"], h["backlog"], h["replicas"]) == (40, 40, expect)
    text = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    assert "Little's law" in text and f"recommendation: {expect} worker replicas" in text

    hints = ScaleHints(client.stores)
    hints.target_lag_s, hints.concurrency = 5.0, 10
    await hints.observe(["tq"], force=True)
    # no finished attempts yet: the default 1 s run time -> ceil((40/300 + 8) x 1 / 8)
    assert WORKERS.labels("tq")._value.get() == math.ceil((40 / 300 + 8) / 8)
