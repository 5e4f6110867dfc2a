"""A new user's first hour, as the README tells it (issue 25): `fencepost demo`, then the README's
`app.py`, its producer (`async with Client() as client:`) and `fencepost worker --app app:registry`,
all with no URLs set, in a fresh project directory. Every entry point finds the same stores (the
project's embedded pair: fencepost.core.stores.resolve); with only a worker running (no
`fencepost reconciler`), what `client.wait()` reported is what `fencepost ls`, `queue ls` and
`status` show, and each of them, and the worker, says in one line that no recorder is recording.

One demo serves the module (it starts the pair; the tests reuse it). The environment is stripped of
FENCEPOST_* and PG*, so this runs the same on the bare-machine path (FENCEPOST_TEST_SERVERS=embedded)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, stop

CLI = [sys.executable, "-m", "fencepost.cli"]
SILENCE_S = 1
"""FENCEPOST_RECORDER_SILENCE_S for these tests (the default is the lag alert's 60 s)."""
SILENT = "no recorder has"
"""What the one-line warning says (fencepost.core.views.RecorderSilence.message)."""


def readme_block(starts: str) -> str:
    """The README's first ```python block whose text contains STARTS."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    found = [b for b in blocks if starts in b]
    assert found, f"README.md has no python block with {starts!r}: the first-hour test follows the README"
    return found[0]


def producer_script() -> str:
    """The README's producer as a script: its top-level `await`s (as in `python -m asyncio`) in an
    `async def main()`, as the README says to do in a script, and the run id printed for the checks."""
    body = readme_block("async with Client() as client:")
    lines = [f"    {line}" if line.strip() else "" for line in body.splitlines()]
    inner = "\n".join(lines).replace("    print(outcome.status, outcome.result)",
                                     "    print(outcome.status, outcome.result)\n        print('run', run_id)")
    return f"import asyncio\n\n\nasync def main() -> None:\n{inner}\n\n\nasyncio.run(main())\n"


@dataclass
class Project:
    path: Path
    env: dict[str, str]
    producer: subprocess.CompletedProcess[str]
    worker: subprocess.Popen[bytes]
    worker_log: Path

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], cwd=self.path, env=self.env, capture_output=True, text=True,
                              timeout=120)

    @property
    def run_id(self) -> int:
        m = re.search(r"^run (\d+)$", self.producer.stdout, re.M)
        assert m is not None, self.producer
        return int(m.group(1))


@pytest.fixture(scope="module")
def project() -> Iterator[Project]:
    """A fresh project directory (mode 700, as `mktemp -d` makes) after `fencepost demo --dir`, with the
    README's app.py and producer, a worker running, and the producer run once."""
    path = Path(tempfile.mkdtemp(prefix="fencepost-first-hour-"))
    runtime = Path(tempfile.gettempdir()) / f"fencepost-runtime-first-hour-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEPOST_", "PG"))}
    env.update(PYTHONPATH=str(path), FENCEPOST_EMBEDDED_RUNTIME=str(runtime),
               FENCEPOST_RECORDER_SILENCE_S=str(SILENCE_S))
    worker: subprocess.Popen[bytes] | None = None
    try:
        demo = subprocess.run([*CLI, "demo", "--jobs", "6", "--dir", str(path / ".fencepost")], cwd=path, env=env,
                              capture_output=True, text=True, timeout=240)
        assert demo.returncode == 0, demo.stdout + demo.stderr
        (path / "app.py").write_text(readme_block("# app.py"))
        (path / "producer.py").write_text(producer_script())
        log = path / "worker.log"
        with log.open("wb") as out:
            worker = subprocess.Popen([*CLI, "worker", "--app", "app:registry", "--queue", "emails",
                                       "--queue", "reports"], cwd=path, env=env, stdout=out, stderr=out)
        producer = subprocess.run([sys.executable, "producer.py"], cwd=path, env=env, capture_output=True,
                                  text=True, timeout=180)
        yield Project(path=path, env=env, producer=producer, worker=worker, worker_log=log)
    finally:
        stop([worker])
        subprocess.run([*CLI, "dev", "down", "--purge", "--dir", str(path / ".fencepost")], cwd=path, env=env,
                       capture_output=True, timeout=120)
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def _eventually(check: Callable[[], subprocess.CompletedProcess[str]], ok: Callable[[subprocess.CompletedProcess[str]], bool],
                timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
    """CHECK until OK(result) (the recorder's silence must first outlast SILENCE_S), at most TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while True:
        out = check()
        if ok(out) or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


@pytest.mark.slow
def test_the_readme_producer_runs_after_the_demo_with_no_urls_set(project: Project) -> None:
    """Client() with no URLs used redis://127.0.0.1:6379 and postgresql://postgres@127.0.0.1/postgres
    ('the Fencepost schema is missing' here, connection refused on a bare machine) while the CLI and
    the worker used ./.fencepost: now both find the project's embedded pair, the one the demo left."""
    out = project.producer
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCEEDED sent" in out.stdout, out.stdout
    assert "using the embedded servers in .fencepost/ (running;" in out.stderr, out.stderr


@pytest.mark.slow
def test_with_only_a_worker_the_cli_shows_the_live_state_and_says_no_recorder_records(project: Project) -> None:
    """The run client.wait() reported SUCCEEDED showed PENDING attempt 0 in `fencepost ls`, WAITING 1 in
    `queue ls` and `recorded_status PENDING` in `status`, and nothing said that no recorder ran."""
    assert project.producer.returncode == 0, project.producer.stderr
    rid = project.run_id

    listed = _eventually(lambda: project.cli("ls", "--queue", "emails", "--json"), lambda o: SILENT in o.stderr)
    assert listed.returncode == 0, listed.stderr
    (row,) = [r for r in json.loads(listed.stdout) if r["id"] == rid]
    assert (row["status"], row["attempt"]) == ("SUCCEEDED", 1), row
    warnings = [line for line in listed.stderr.splitlines() if SILENT in line]
    assert len(warnings) == 1 and "`fencepost reconciler`" in warnings[0], listed.stderr

    text = project.cli("ls", "--queue", "emails")
    assert re.search(rf"^{rid}\s+emails\.send\s+emails\s+SUCCEEDED\s+1\s", text.stdout, re.M), text.stdout

    queues = project.cli("queue", "ls", "--json")
    assert queues.returncode == 0 and SILENT in queues.stderr, queues.stderr
    (emails,) = [q for q in json.loads(queues.stdout) if q["queue"] == "emails"]
    # counted in Redis: nothing due or running; the reminder is delayed an hour (the outbox run waits for the
    # reconciler's relay, which is not running: Redis does not hold it, so it is not counted as due)
    assert (emails["due"], emails["active"], emails["delayed"]) == (0, 0, 1), emails

    status = project.cli("status", str(rid))
    assert status.returncode == 0 and SILENT in status.stderr, status.stderr
    assert re.search(r"^status\s+SUCCEEDED$", status.stdout, re.M), status.stdout
    assert re.search(r"^recorded_status\s+PENDING$", status.stdout, re.M), status.stdout  # the record, said as such
    assert re.search(r"^result\s+\"sent\"$", status.stdout, re.M), status.stdout

    deadline = time.monotonic() + 15
    while SILENT not in project.worker_log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert SILENT in project.worker_log.read_text(), project.worker_log.read_text()[-2000:]
