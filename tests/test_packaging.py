"""Packaging (issue 12): the wheel installs one import name, `fencepost`, with its Lua, SQL,
static files and py.typed inside; an application with its own `worker.py`, `scheduler/` and
`reconciler.py` runs jobs on a worker from that wheel and neither side shadows the other; the
editable install maps the checkout without putting its root on sys.path; one version source."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fencepost import __version__
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import WaitTimeout
from tests.conftest import ROOT, log_tail

QUEUE = "appq"
GENERIC = ("worker", "scheduler", "reconciler")
# Folders of the repository the wheel maps into `fencepost` (pyproject [tool.setuptools] package-dir).
PACKAGE_DIRS = {"scheduler": "fencepost", "worker": "fencepost/worker", "reconciler": "fencepost/reconciler"}
DATA_DIRS = {"lua": ("fencepost/_lua", "*.lua"), "sql": ("fencepost/_sql", "*.sql"),
             "scheduler/api/static": ("fencepost/api/static", "*")}


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a process that must see only what its own interpreter installs:
    nothing from PYTHONPATH (conftest's worker_env points it at the checkout) or FENCEPOST_*."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("FENCEPOST_")}
    env.update(extra)
    return env


def _run(*cmd: str | Path, cwd: Path, timeout: float, **env: str) -> str:
    """Run a command to completion; on failure show its output (pip and build explain themselves)."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_clean_env(**env), capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                             f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")
    return proc.stdout


def _probe(python: Path, cwd: Path) -> dict[str, Any]:
    """Where `python`, started in `cwd`, finds fencepost and the three generic names."""
    code = textwrap.dedent("""
        import importlib.util, json, sys
        import fencepost, fencepost.worker, fencepost.reconciler
        from fencepost.core.resources import resource_dir

        def origin(name):
            spec = importlib.util.find_spec(name)
            return None if spec is None else (spec.origin or list(spec.submodule_search_locations or []))

        print(json.dumps({"fencepost": fencepost.__file__, "fencepost.worker": fencepost.worker.__file__,
                          "fencepost.reconciler": fencepost.reconciler.__file__,
                          "lua": str(resource_dir("lua")), "sql": str(resource_dir("sql")),
                          "generic": {n: origin(n) for n in ("worker", "scheduler", "reconciler")},
                          "sys.path": sys.path}))
    """)
    return json.loads(_run(python, "-c", code, cwd=cwd, timeout=60))


def _inside(path: str | Path, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root.resolve())


# -- the built wheel ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel from a copy of the working tree: setuptools writes build/ and *.egg-info
    next to the sources, and a stale build/lib in the checkout could smuggle deleted modules in
    (or collide with another engineer's build)."""
    base = tmp_path_factory.mktemp("wheel")
    src, out = base / "src", base / "dist"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", ".fencepost*",
        "node_modules"))
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", out, src, cwd=src, timeout=600)
    (whl,) = out.glob("fencepost-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no system site-packages) with only the wheel and its dependencies (pip's cache)."""
    path = tmp_path_factory.mktemp("venv") / "venv"
    _run(sys.executable, "-m", "venv", path, cwd=path.parent, timeout=300)
    _run(path / "bin" / "python", "-m", "pip", "install", "-q", wheel, cwd=path.parent, timeout=900)
    return path


@pytest.mark.slow
def test_wheel_holds_one_import_name_with_every_module_and_data_file(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        dist_info = f"fencepost-{__version__}.dist-info"
        assert {n.split("/", 1)[0] for n in names} == {"fencepost", dist_info}, "exactly one import name"
        assert z.read(f"{dist_info}/top_level.txt").decode().split() == ["fencepost"]
        metadata = z.read(f"{dist_info}/METADATA").decode()
        assert f"\nVersion: {__version__}\n" in metadata, "setuptools reads fencepost.__version__"
        assert "fencepost = fencepost.cli:main" in z.read(f"{dist_info}/entry_points.txt").decode()
    assert "fencepost/py.typed" in names
    # every module of the three folders (a subpackage missing from `packages` works editable, not here)
    for folder, target in PACKAGE_DIRS.items():
        for py in (ROOT / folder).rglob("*.py"):
            rel = py.relative_to(ROOT / folder)
            if "__pycache__" not in rel.parts:
                assert f"{target}/{rel.as_posix()}" in names, f"{folder}/{rel} is missing from the wheel"
    for folder, (target, pattern) in DATA_DIRS.items():
        files = [p for p in (ROOT / folder).rglob(pattern) if p.is_file() and "__pycache__" not in p.parts]
        assert files, f"no {pattern} under {folder}/"
        for f in files:
            assert f"{target}/{f.relative_to(ROOT / folder).as_posix()}" in names, f"{folder}/{f.name} not in wheel"


# -- an application with its own worker.py, scheduler/ and reconciler.py ----------------------------
APP_FILES = {
    "worker.py": '"""The application\'s own worker module."""\nWHO = "app worker"\n',
    "scheduler/__init__.py": '"""The application\'s own scheduler package."""\nWHO = "app scheduler"\n',
    "reconciler.py": '"""The application\'s own reconciler module."""\nWHO = "app reconciler"\n',
    "jobs.py": textwrap.dedent(f'''
        """Handlers that report which worker/scheduler/reconciler and which fencepost they see."""
        import sys

        import reconciler  # the app's own modules, imported before and beside fencepost
        import scheduler
        import worker

        import fencepost
        from fencepost import Registry
        from fencepost.core.resources import resource_dir

        registry = Registry()


        def where():
            import reconciler, scheduler, worker  # looked up again inside the job

            return {{"worker": worker.__file__, "scheduler": scheduler.__file__,
                    "reconciler": reconciler.__file__, "who": [worker.WHO, scheduler.WHO, reconciler.WHO],
                    "fencepost": fencepost.__file__, "lua": str(resource_dir("lua")), "python": sys.executable}}


        @registry.job("app.where", queue="{QUEUE}")
        async def where_async(ctx):
            return where()


        @registry.job("app.where_in_process", queue="{QUEUE}", model="process", timeout=120)
        def where_in_process(ctx):
            return where()
    '''),
    "submit.py": textwrap.dedent('''
        """The producer: registers the handlers and prints the run ids (settings from FENCEPOST_*)."""
        import asyncio
        import json

        from fencepost import Client, Submit

        from jobs import registry


        async def main():
            async with Client() as client:
                await client.register(registry)
                print(json.dumps(await client.submit_many(
                    [Submit(handler="app.where"), Submit(handler="app.where_in_process")] * 2)))


        asyncio.run(main())
    '''),
}


@pytest.fixture
def app_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    app = tmp_path_factory.mktemp("app")
    assert not _inside(app, ROOT)
    for rel, text in APP_FILES.items():
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        (app / rel).write_text(text)
    return app


@pytest.fixture
def wheel_worker(venv: Path, app_dir: Path, settings: Settings) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`fencepost worker --app jobs:registry` from the venv, started in the app directory."""
    log = app_dir / "worker.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([str(venv / "bin" / "fencepost"), "worker", "--app", "jobs:registry",
                                 "--queue", QUEUE, "--processes", "1", "--concurrency", "4"],
                                cwd=app_dir, env=_clean_env(**_fencepost_env(settings)), stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        yield proc, log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _fencepost_env(settings: Settings) -> dict[str, str]:
    return {"FENCEPOST_REDIS_URL": settings.redis_url, "FENCEPOST_DATABASE_URL": settings.database_url,
            "FENCEPOST_PREFIX": settings.prefix, "FENCEPOST_LOG_FORMAT": "json",
            "FENCEPOST_BACKOFF_BASE_MS": str(settings.backoff_base_ms),
            "FENCEPOST_BACKOFF_CAP_MS": str(settings.backoff_cap_ms)}


@pytest.mark.slow
async def test_app_with_its_own_worker_scheduler_reconciler_runs_jobs_on_the_wheel(
        venv: Path, app_dir: Path, wheel_worker: tuple[subprocess.Popen[bytes], Path], settings: Settings) -> None:
    proc, log = wheel_worker
    python = venv / "bin" / "python"
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=app_dir,
                     timeout=60).strip())
    assert not [n for n in GENERIC if (site / n).exists() or (site / f"{n}.py").exists()], \
        f"the wheel claimed a generic name in {site}"
    # (iii) `import fencepost` in that venv resolves inside site-packages, not the checkout
    probe = _probe(python, app_dir)
    for name in ("fencepost", "fencepost.worker", "fencepost.reconciler", "lua", "sql"):
        assert _inside(probe[name], site) and not _inside(probe[name], ROOT), (name, probe[name])
    assert str(ROOT) not in probe["sys.path"]
    # the producer side: `@registry.job` and submit in the app, with the app's modules imported first
    run_ids = json.loads(_run(python, "submit.py", cwd=app_dir, timeout=120, **_fencepost_env(settings)))
    assert len(run_ids) == 4
    async with Client(settings=settings) as client:
        for run_id in run_ids:
            try:
                outcome = await client.wait(run_id, timeout=90)
            except WaitTimeout as exc:
                raise AssertionError(f"{exc}; worker {'running' if proc.poll() is None else 'exited'}:\n"
                                     f"{log_tail(log)}") from None
            # (i) the jobs ran to SUCCEEDED on the wheel's worker (async and process-pool handlers)
            assert outcome.status == "SUCCEEDED", (outcome, log_tail(log))
            seen = outcome.result
            # (ii) inside the job, the app's own modules, not Fencepost's
            assert Path(seen["worker"]) == app_dir / "worker.py"
            assert Path(seen["scheduler"]) == app_dir / "scheduler" / "__init__.py"
            assert Path(seen["reconciler"]) == app_dir / "reconciler.py"
            assert seen["who"] == ["app worker", "app scheduler", "app reconciler"]
            # ... and Fencepost, its Lua scripts included, from the venv
            assert _inside(seen["fencepost"], site) and _inside(seen["lua"], site), seen
            assert Path(seen["python"]).parent == venv / "bin", seen  # (a venv's python links to the base one)
    assert proc.poll() is None, f"the worker exited early:\n{log_tail(log)}"


@pytest.mark.slow
def test_wheel_install_has_no_generic_names_and_prints_its_version(venv: Path, tmp_path: Path) -> None:
    probe = _probe(venv / "bin" / "python", tmp_path)
    assert probe["generic"] == {"worker": None, "scheduler": None, "reconciler": None}
    out = _run(venv / "bin" / "fencepost", "--version", cwd=tmp_path, timeout=60)
    assert out.split() == ["fencepost", __version__]


# -- the editable install (the main venv) ------------------------------------------------------------
def test_editable_install_maps_the_checkout_without_putting_its_root_on_sys_path(tmp_path: Path) -> None:
    """Run from outside the checkout: pytest's own sys.path (pythonpath = ".") holds the root."""
    probe = _probe(Path(sys.executable), tmp_path)
    assert Path(probe["fencepost"]) == ROOT / "scheduler" / "__init__.py"
    assert Path(probe["fencepost.worker"]) == ROOT / "worker" / "__init__.py"
    assert Path(probe["fencepost.reconciler"]) == ROOT / "reconciler" / "__init__.py"
    assert Path(probe["lua"]) == ROOT / "lua" and Path(probe["sql"]) == ROOT / "sql"
    assert (ROOT / "scheduler" / "py.typed").is_file()
    assert probe["generic"]["worker"] is None, "the editable install put the checkout root on sys.path"
    for name, origin in probe["generic"].items():  # a venv inside the checkout is not the checkout's sources
        places = [origin] if isinstance(origin, str) else origin or []
        assert not any(_inside(p, ROOT) and not _inside(p, Path(sys.prefix)) for p in places), \
            f"`import {name}` outside the checkout finds {origin}"
    assert ROOT.resolve() not in {Path(p).resolve() for p in probe["sys.path"] if p}


def test_one_version_source_fencepost_version_prints_it(tmp_path: Path) -> None:
    out = _run(sys.executable, "-m", "fencepost", "--version", cwd=tmp_path, timeout=60)
    assert out.split() == ["fencepost", __version__]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in pyproject["project"]["dynamic"] and "version" not in pyproject["project"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fencepost.__version__"}
