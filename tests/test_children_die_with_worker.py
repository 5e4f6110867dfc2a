"""A worker's spawned children (process-model job children, the pulser) are gone within a second of
its SIGKILL even while they are still starting: a spawned child imports its target's module before
the target's first line runs (fencepost.worker and all it imports, 1-2 s on a loaded machine), and
it used to ask for its parent-death signal only after that (the chaos soak's children_outlived_worker:
the worker was killed while a fenced or timed-out child was being replaced). Real processes."""

from __future__ import annotations

import os
import signal
import time

from fencepost.core.config import Settings
from fencepost.dev.faults import descendants
from tests.conftest import spawn, stop


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_children_killed_while_they_start_die_within_a_second(settings: Settings) -> None:
    w = spawn(settings, "worker", "--app", "fencepost.dev.chaos:registry", "--queue", "kids", "--processes", "2")
    try:
        deadline = time.monotonic() + 60
        kids: list[int] = []
        while time.monotonic() < deadline:  # the pulser and the two job children, just spawned
            kids = descendants(w.pid)
            if len([k for k in kids if b"spawn_main" in open(f"/proc/{k}/cmdline", "rb").read()]) >= 3:
                break
            time.sleep(0.005)
        assert len(kids) >= 3, kids
        os.kill(w.pid, signal.SIGKILL)
        killed = time.monotonic()
        w.wait(10)
        while any(_alive(k) for k in kids) and time.monotonic() < killed + 1.0:
            time.sleep(0.01)
        alive = [k for k in kids if _alive(k)]
        for k in alive:  # clean up what the worker left behind
            os.kill(k, signal.SIGKILL)
        assert not alive, f"{len(alive)} of {len(kids)} children alive 1 s after their worker's SIGKILL"
    finally:
        stop([w])
