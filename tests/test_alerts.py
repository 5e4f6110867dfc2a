"""The alerting rules (docs/alerts/fencepost.rules.yml) pass `promtool check rules` and their unit
tests (`promtool test rules docs/alerts/fencepost.tests.yml`: every alert fires on bad synthetic
series and not on healthy ones); every alert carries severity and route labels and a runbook
that exists and says what to check and what to do; every metric the rules use is defined in
the code."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import need_tool

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "docs" / "alerts"
RULES = ALERTS / "fencepost.rules.yml"
TESTS = ALERTS / "fencepost.tests.yml"


@pytest.fixture(scope="module")
def promtool() -> str:
    return need_tool("promtool")  # skipped when missing (failed under FENCEPOST_TEST_REQUIRE_TOOLS=1)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=ALERTS, capture_output=True, text=True, timeout=120)


def test_promtool_check_rules(promtool: str) -> None:
    out = _run(promtool, "check", "rules", RULES.name)
    assert out.returncode == 0, f"promtool check rules failed:\n{out.stdout}\n{out.stderr}"
    assert "SUCCESS" in out.stdout


def test_promtool_unit_tests_fire_each_alert_on_bad_series_and_not_on_healthy_ones(promtool: str) -> None:
    out = _run(promtool, "test", "rules", TESTS.name)
    assert out.returncode == 0, f"promtool test rules failed:\n{out.stdout}\n{out.stderr}"


# -- structure (a light parse: PyYAML is not a dependency; promtool validated the YAML above) ----------
def _alerts() -> list[dict[str, str]]:
    """alert name -> its block's text, for the checks below."""
    text = RULES.read_text()
    blocks = re.split(r"\n(?=      - (?:alert|record): )", text)
    out = []
    for b in blocks:
        m = re.match(r"\s*- alert: (\w+)", b)
        if m:
            out.append({"name": m.group(1), "text": b})
    return out


def test_every_alert_has_routing_labels_and_an_existing_runbook_that_says_what_to_check_and_do() -> None:
    alerts = _alerts()
    assert len(alerts) >= 20
    for a in alerts:
        name, text = a["name"], a["text"]
        assert re.search(r"\n\s+severity: (critical|warning|info)\n", text), f"{name}: severity"
        route = re.search(r"\n\s+route: (page|notify|ticket|security)\n", text)
        assert route, f"{name}: route must be page, notify, ticket or security"
        for ann in ("summary", "description", "safe_action"):
            assert re.search(rf"\n\s+{ann}: ", text), f"{name}: annotation {ann}"
        url = re.search(r'runbook_url: "([^"]+)"', text)
        assert url and url.group(1) == f"docs/runbooks/{name}.md", f"{name}: runbook_url"
        page = ROOT / url.group(1)
        assert page.is_file(), f"{name}: {page} does not exist"
        body = page.read_text()
        assert "## What to check" in body and "## Safe actions" in body, f"{page}: sections"
        assert "`fencepost " in body, f"{page}: names no fencepost command"
        assert re.search(r"`fencepost_\w+", body), f"{page}: names no metric"
    names = {a["name"] for a in alerts}
    tested = set(re.findall(r"alertname: (\w+)", TESTS.read_text()))
    assert names <= tested, f"alerts without a promtool test: {sorted(names - tested)}"


def test_per_handler_alerts_route_to_the_declared_owner_and_policy_to_security() -> None:
    for a in _alerts():
        if "sum by (handler)" in a["text"]:
            assert "group_left (owner) fencepost:handler_owner" in a["text"], a["name"]
            assert '"owner", "unowned"' in a["text"], f"{a['name']}: must still fire when no worker exports the owner"
    policy = next(a for a in _alerts() if a["name"] == "FencepostPolicyViolation")
    assert "route: security" in policy["text"]


def test_the_seeds_alerts_all_exist() -> None:
    names = {a["name"] for a in _alerts()}
    seeds = {  # job-scheduler-semantics.txt "Error handling and alerting", issue 6
        "failure rate": "FencepostJobFailureRateHigh", "repeated failures": "FencepostRepeatedFailures",
        "dead-letter growth": "FencepostDeadLetterGrowing", "lease expiry": "FencepostLeaseExpiryRateHigh",
        "worker crash": "FencepostWorkerCrashRateHigh", "queue age": "FencepostQueueAgeHigh",
        "schedule lateness": "FencepostScheduleLate", "checkpoint lag": "FencepostCheckpointStale",
        "retry storm": "FencepostRetryStorm", "exhausted budget": "FencepostRetryBudgetExhausted",
        "error-budget burn": "FencepostErrorBudgetBurnFast", "stuck RUNNING": "FencepostRunStuckRunning",
        "stuck STOPPING": "FencepostRunStuckStopping", "stuck PAUSED": "FencepostRunStuckPaused",
        "policy": "FencepostPolicyViolation", "rate limit sustained": "FencepostRateLimitedSustained",
        "side effect review": "FencepostSideEffectNeedsReview", "breaker open": "FencepostBreakerOpen",
        "recorder lag": "FencepostRecorderLagHigh", "drift": "FencepostDriftFound",
        "leaked slots": "FencepostLeakedSlots",
    }
    missing = {k: v for k, v in seeds.items() if v not in names}
    assert not missing, missing


def test_every_metric_the_rules_use_is_defined_in_the_code() -> None:
    code = "\n".join(p.read_text() for d in ("worker", "reconciler", "scheduler") for p in (ROOT / d).rglob("*.py"))
    defined = set(re.findall(r'(?:Counter|Gauge|Histogram)\(\s*"(fencepost_\w+)"', code))
    used = set(re.findall(r"\b(fencepost_[a-z_]+)", RULES.read_text()))
    recorded = set(re.findall(r"record: (fencepost_\w+)", RULES.read_text()))
    unknown = set()
    for name in used - recorded:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name not in defined and base not in defined:
            unknown.add(name)
    assert not unknown, f"the rules use metrics no code defines: {sorted(unknown)}"
