"""fencepost.testing's drain() runs `model="process"` handlers for real, in a child process spawned from the
registry's module as a worker's (`--app`): found among the loaded modules, or given as `app=`; without
one the outcome says how to give it."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput
from fencepost.core.registry import Registry
from fencepost.testing import Harness, find_app
from fencepost.worker.context import SyncContext
from tests.apps_process import boom, count, registry
from tests.test_testing_plugin import make_project

pytest_plugins = ["pytester"]


@pytest.fixture
def client_registry() -> Registry:
    return registry


def test_the_app_is_the_module_defining_the_registry() -> None:
    """This module and conftest-like importers hold it too: the defining module comes first."""
    assert globals()["registry"] is registry
    assert find_app(registry) == "tests.apps_process:registry"
    assert find_app(Registry()) is None  # no process handler: nothing to spawn, nothing searched


async def test_drain_runs_a_process_handler_in_a_child(settings: Settings, client: Client) -> None:
    fp = Harness(settings, registry, client)
    assert fp.app == "tests.apps_process:registry"
    run_id = await count.submit(client, 5)
    await fp.drain()
    out = await client.wait(run_id, timeout=10)
    assert out.status == "SUCCEEDED", out
    assert out.result["done"] == 5 and out.result["pid"] != os.getpid()
    progress = (await client.get(run_id))["progress"]  # reported in the child, recorded by the parent
    assert progress is not None and (progress["done"], progress["total"]) == (5, 5)


async def test_a_failing_process_handler_is_retried_to_its_end(settings: Settings, client: Client) -> None:
    fp = Harness(settings, registry, client, app="tests.apps_process:registry")
    run_id = await boom.submit(client)
    await fp.drain(skip_delays=True)
    out = await client.wait(run_id, timeout=10)
    assert out.status == "FAILED"
    attempts = await client.attempts(run_id)
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    assert {a["error_class"] for a in attempts} == {"ConnectionError"}


async def test_an_app_that_does_not_serve_the_registry_is_refused(settings: Settings, client: Client) -> None:
    with pytest.raises(InvalidInput) as bad:
        Harness(settings, registry, client, app="tests.apps:registry")
    assert bad.value.field == "app" and "no handler 'tp.boom'" in str(bad.value)
    with pytest.raises(InvalidInput) as bad:
        Harness(settings, registry, client, app="tests.no_such_module:registry")
    assert bad.value.field == "app"


async def test_without_an_app_the_outcome_says_how_to_give_one(settings: Settings) -> None:
    """A registry no module holds (made in a function): as before, the run fails, and says what to pass."""
    local = Registry()

    @local.job("tp.local", queue="tpq", model="process", max_retries=0)
    def local_job(ctx: SyncContext) -> int:
        return 1

    c = await Client(settings=settings).connect()
    try:
        await c.register(local)
        fp = Harness(settings, local, c)
        assert fp.app is None
        run_id = await local_job.submit(c)
        await fp.drain()
        out = await c.wait(run_id, timeout=10)
        assert out.status == "FAILED" and out.error_class == "NoProcessPool"
        assert out.error is not None and 'app="pkg.mod:registry"' in out.error
    finally:
        await c.close()


FAR_APP = '''
    import os

    from fencepost import Registry

    registry = Registry()


    @registry.job("far.where", queue="tpq", model="process")
    def where(ctx) -> str:
        import farapp
        return f"{os.getpid()}:{farapp.__file__}"
'''


async def _where_in_a_child(settings: Settings, module: Any, app: str) -> Path:
    """Drain a FAR_APP module's `where` through a Harness that found `app` by itself: the file the
    child, another process, imported the module from."""
    c = await Client(settings=settings).connect()
    try:
        await c.register(module.registry)
        fp = Harness(settings, module.registry, c)
        assert fp.app == app
        run_id = await module.where.submit(c)
        await fp.drain()
        out = await c.wait(run_id, timeout=10)
        assert out.status == "SUCCEEDED", out
        pid, path = out.result.split(":", 1)
        assert int(pid) != os.getpid()
        return Path(path)
    finally:
        await c.close()


async def test_the_child_imports_from_the_tests_sys_path(settings: Settings, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A module importable only through an entry the test process added to sys.path (not the working
    directory, not PYTHONPATH): the child imports it too (a spawned child starts with the parent's sys.path)."""
    far = tmp_path / "far"
    far.mkdir()
    (far / "farapp.py").write_text(textwrap.dedent(FAR_APP))
    monkeypatch.syspath_prepend(str(far))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    farapp = importlib.import_module("farapp")
    try:
        assert await _where_in_a_child(settings, farapp, "farapp:registry") == far / "farapp.py"
    finally:
        sys.modules.pop("farapp", None)


async def test_a_module_imported_off_sys_path(settings: Settings, tmp_path: Path) -> None:
    """As pytest's --import-mode=importlib imports a test module (by file, under a dotted name, sys.path
    untouched): the drain appends the folder holding its package to sys.path while it spawns, and only then."""
    (tmp_path / "offpath").mkdir()
    (tmp_path / "offpath" / "far_tests").mkdir()
    file = tmp_path / "offpath" / "far_tests" / "test_far.py"
    file.write_text(textwrap.dedent(FAR_APP).replace("import farapp", "import far_tests.test_far as farapp"))
    spec = importlib.util.spec_from_file_location("far_tests.test_far", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["far_tests.test_far"] = module
    path_before = list(sys.path)
    try:
        spec.loader.exec_module(module)
        assert await _where_in_a_child(settings, module, "far_tests.test_far:registry") == file
        assert sys.path == path_before
    finally:
        sys.modules.pop("far_tests.test_far", None)


APP = '''
    from fencepost import Registry

    registry = Registry()


    @registry.job("myapp.total", queue="myapp", model="process")
    def total(ctx, n: int) -> int:
        done = ctx.checkpoint_data or 0
        while done < n:
            done += 1
            ctx.checkpoint(done, processed=done)
        return done * 10
'''

CONFTEST = '''
    import pytest
    from myapp import registry


    @pytest.fixture
    def fencepost_registry():
        return registry
'''

TESTS = '''
    import os

    from myapp import total


    async def test_a_process_handler_under_drain(fencepost):
        assert fencepost.app == "myapp:registry"
        run_id = await total.submit(fencepost.client, 4)
        await fencepost.drain()
        out = await fencepost.client.wait(run_id, timeout=10)
        assert out.status == "SUCCEEDED" and out.result == 40
'''


def test_the_plugin_runs_process_handlers(pytester: pytest.Pytester, settings: Settings,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's project (its module found by itself, on the sys.path pytest gave the tests), on a real Redis
    and on fakeredis (the child reaches no store: its checkpoints go through the drain's worker)."""
    make_project(pytester, settings, monkeypatch, APP, CONFTEST, TESTS)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=300).assert_outcomes(passed=1)
    monkeypatch.setenv("FENCEPOST_REDIS_URL", "fakeredis://myapp")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=300).assert_outcomes(passed=1)
