"""Every code block in README.md and docs/ runs as written, so the docs cannot drift from the code.

The convention (one test per document; blocks run in the order they appear):

- Every fenced block names its language; an unlabelled block fails the test (say `text`).
- ```python blocks run in one namespace per document, top-level `await` allowed, in a temporary
  working directory that is on sys.path. A block whose first line is `# name.py` is that file:
  it is written there (later blocks and commands import it) and imported once to prove it loads.
- ```sh blocks run with bash (`set -euo pipefail`) in the same directory. A line that starts a
  service (`fencepost worker|reconciler|api|trigger`) is started in the background instead and
  kept running for the rest of the document; at its end each one gets SIGTERM and must exit 0
  (a graceful stop) - so a service that could not start fails the test.
- ```json and ```yaml blocks must parse; ```text (output, diagrams, sketches) is not run.
- A block right after a line `<!-- doc-test: skip (why) -->` is not run; the reason is required
  (e.g. the README's two commands, which .ci/run runs from a fresh clone).

Environment: FENCEPOST_REDIS_URL, FENCEPOST_DATABASE_URL and FENCEPOST_PREFIX point at this test's
stores (a fresh database and key prefix), so `Client()` and every `fencepost` command use them.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import yaml

from fencepost.core.config import Settings
from tests.conftest import ROOT, log_tail, worker_env

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\S*)\s*$")
SKIP = re.compile(r"^<!--\s*doc-test:\s*skip\s*\((.+)\)\s*-->\s*$")
SERVICE = re.compile(r"^fencepost\s+(worker|reconciler|api|trigger)\b")
UP = re.compile(r"worker \S+ serving|reconciler started|trigger started|Uvicorn running|Application startup complete")
"""What each service logs once its signal handlers are installed."""
DOWN = re.compile(r"worker \S+ stopped|reconciler stopped|trigger stopped")
"""What a service logs when a block stopped it (`fencepost workers stop`): it is waited for, not signalled."""
RUN_TIMEOUT = 120.0


class Block(msgspec.Struct, frozen=True):
    """One fenced block: where it starts, its language, its text, and the skip reason if any."""

    line: int
    lang: str
    text: str
    skip: str | None = None


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file (fences at the start of a line, not nested)."""
    found: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start, lang = i, m.group(1)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{path.name}:{start + 1}: unclosed code block"
        prev = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.match(prev)
        found.append(Block(line=start + 1, lang=lang, text="\n".join(lines[start + 1:end]) + "\n",
                           skip=skip.group(1) if skip else None))
        i = end + 1
    return found


def _commands(text: str) -> list[str]:
    """Shell lines with `\\` continuations joined (comments and blank lines kept as they are)."""
    out: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    return out


class DocRun:
    """Runs one document's blocks in a working directory with the test's stores."""

    def __init__(self, path: Path, workdir: Path, settings: Settings) -> None:
        self.path, self.workdir = path, workdir
        self.env = worker_env(settings, FENCEPOST_LOG_FORMAT="text")
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["PYTHONPATH"] = f"{workdir}{os.pathsep}{ROOT}"
        self.namespace: dict[str, object] = {"__name__": f"doc_{path.stem}"}
        self.services: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def where(self, block: Block) -> str:
        return f"{self.path.relative_to(ROOT)}:{block.line}"

    async def run(self, block: Block) -> None:
        if block.lang == "python":
            await self._python(block)
        elif block.lang == "sh":
            await asyncio.to_thread(self._sh, block)
        elif block.lang == "json":
            json.loads(block.text)
        elif block.lang == "yaml":
            yaml.safe_load(block.text)
        else:
            assert block.lang == "text", f"{self.where(block)}: unknown block language {block.lang!r}"

    async def _python(self, block: Block) -> None:
        first = block.text.splitlines()[0].strip() if block.text.strip() else ""
        if m := re.fullmatch(r"#\s*([A-Za-z_]\w*)\.py", first):
            (self.workdir / f"{m.group(1)}.py").write_text(block.text)
            importlib.invalidate_caches()
            sys.modules.pop(m.group(1), None)
            importlib.import_module(m.group(1))
            return
        code = compile(block.text, self.where(block), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(code, self.namespace)
        if asyncio.iscoroutine(result):
            await asyncio.wait_for(result, RUN_TIMEOUT)

    def _sh(self, block: Block) -> None:
        script: list[str] = []
        for line in [*_commands(block.text), None]:
            if line is not None and not SERVICE.match(line.strip()):
                script.append(line)
                continue
            if any(s.strip() and not s.strip().startswith("#") for s in script):
                out = subprocess.run(["bash", "-c", "set -euo pipefail\n" + "\n".join(script)], cwd=self.workdir,
                                     env=self.env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
                assert out.returncode == 0, (f"{self.where(block)}: exit {out.returncode}\n{chr(10).join(script)}\n"
                                             f"--- stdout ---\n{out.stdout[-3000:]}\n--- stderr ---\n{out.stderr[-3000:]}")
            script = []
            if line is not None:  # a service: in the background until the document ends
                log = self.workdir / f"service-{len(self.services)}.log"
                with log.open("ab") as f:
                    proc = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=self.workdir, env=self.env,
                                            stdout=f, stderr=subprocess.STDOUT)
                self.services.append((line.strip(), proc, log))

    def stop_services(self) -> list[str]:
        """SIGTERM every service once it is up (has logged that it started, after installing its signal
        handlers); the ones that did not exit 0, with their log tails."""
        for _, proc, log in self.services:
            deadline = time.monotonic() + 60
            while proc.poll() is None and not UP.search(log.read_text(errors="replace")) and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.poll() is None and not DOWN.search(log.read_text(errors="replace")):
                proc.send_signal(signal.SIGTERM)
        bad = []
        for line, proc, log in self.services:
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            if code != 0:
                bad.append(f"`{line}` exited {code}\n{log_tail(log)}")
        return bad


def test_every_block_names_its_language_and_a_skip_says_why() -> None:
    unlabelled = [f"{p.relative_to(ROOT)}:{b.line}" for p in DOCS for b in blocks(p) if not b.lang]
    assert not unlabelled, f"code blocks without a language (use text for output): {unlabelled}"
    known = {"python", "sh", "json", "yaml", "text"}
    odd = [f"{p.relative_to(ROOT)}:{b.line} {b.lang}" for p in DOCS for b in blocks(p) if b.lang not in known]
    assert not odd, f"code blocks in a language the doc test does not run: {odd}"


def test_the_index_of_the_tests_names_every_test_file_and_no_other() -> None:
    """docs/testing.md's index ("which file proves what") is a newcomer's map of tests/: a file added,
    renamed or removed without its line there would make the map lie."""
    text = (ROOT / "docs" / "testing.md").read_text().split("## The project's own tests", 1)[1]
    listed = set(re.findall(r"^\| `(test_\w+\.py)` \|", text, re.M))
    present = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    assert listed == present, (f"docs/testing.md's index lacks a line for {sorted(present - listed)} (add `| `file` | "
                               f"what it proves |` under its area) and names files that are gone: {sorted(listed - present)}")


@pytest.mark.slow
@pytest.mark.parametrize("doc", [p for p in DOCS if any(b.lang != "text" for b in blocks(p))],
                         ids=lambda p: str(p.relative_to(ROOT)))
async def test_doc_blocks_run_as_written(doc: Path, settings: Settings, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    run = DocRun(doc, tmp_path, settings)
    for key in ("FENCEPOST_REDIS_URL", "FENCEPOST_DATABASE_URL", "FENCEPOST_PREFIX"):
        monkeypatch.setenv(key, run.env[key])
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        for block in blocks(doc):
            if block.skip is None:
                await run.run(block)
    finally:
        bad = run.stop_services()
        for name in [n for n, m in list(sys.modules.items()) if getattr(m, "__file__", "") and
                     str(getattr(m, "__file__", "")).startswith(str(tmp_path))]:
            sys.modules.pop(name, None)
    assert not bad, "\n".join(bad)
