"""Run every peer's drain (tiny job, default settings) for W=1 and W=2 and print a table.

Each case is a separate ``run_peer.py`` subprocess on the peers' venv (``.venv-bench``), exactly
as ``bench/throughput.py`` calls it (which also runs Fencepost, interleaved, with CPU per job)::

    python bench/peers/run_all.py [--jobs 20000] [--peers pgqueuer saq] [-- run_peer.py options]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VENV_PY = HERE.parent.parent / ".venv-bench" / "bin" / "python"
PEERS = ("arq", "saq", "pgqueuer")


def run_case(python: str, peer: str, jobs: int, workers: int, extra: list[str]) -> dict[str, Any]:
    """Run one case and return its JSON line (or an error record)."""
    cmd = [python, str(HERE / "run_peer.py"), "--peer", peer, "--jobs", str(jobs), "--workers", str(workers), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"peer": peer, "workers": workers, "error": proc.stderr.strip()[-300:] or "no output"}
    return json.loads(lines[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--python", default=str(VENV_PY) if VENV_PY.exists() else sys.executable)
    ap.add_argument("--peers", nargs="+", default=list(PEERS), choices=PEERS)
    a, extra = ap.parse_known_args()  # anything else (e.g. --batch 100, --job noop) goes to run_peer.py
    print("| peer | W | submit jobs/s | drain jobs/s | CPU-us/job total | notes |\n|---|---|---|---|---|---|", flush=True)
    for peer in a.peers:
        for workers in (1, 2):
            r = run_case(a.python, peer, a.jobs, workers, extra)
            if "error" in r:
                print(f"| {peer} | {workers} | - | - | - | error: {r['error']} |", flush=True)
            else:
                print(f"| {peer} | {workers} | {r['submit_per_s']:,.0f} | {r['drain_per_s']:,.0f} "
                      f"| {r['cpu_us']['total']:,.0f} | {r['notes']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
