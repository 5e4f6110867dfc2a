"""The pytest plugin (issue 16) as a user's project meets it: installed with fencepost through the `pytest11`
entry point, so a conftest.py only provides the registry; loading it imports nothing heavy and starts
nothing; its fixtures give a client on the configured stores, drain() and a clock; `-p no:fencepost`
turns it off. Each case runs a tiny project in a fresh pytest process (pytester)."""

from __future__ import annotations

import textwrap

import pytest

from fencepost.core.config import Settings

pytest_plugins = ["pytester"]

APP = '''
    from fencepost import Registry

    registry = Registry()
    ATTEMPTS = []


    @registry.job("myapp.add", queue="myapp")
    async def add(ctx, a: int, b: int) -> int:
        return a + b


    @registry.job("myapp.flaky", queue="myapp", max_retries=3)
    async def flaky(ctx, fail_times: int) -> int:
        ATTEMPTS.append(ctx.attempt)
        if ctx.attempt <= fail_times:
            raise ConnectionError(f"attempt {ctx.attempt} fails")
        return ctx.attempt
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

    import pytest
    from fencepost import InvalidInput
    from myapp import add, flaky


    def test_loading_the_plugin_started_nothing(request):
        plugin = request.config.pluginmanager.get_plugin("fencepost")
        assert plugin is not None and plugin.__name__ == "fencepost.testing_plugin"
        children = [c for t in os.listdir("/proc/self/task")
                    for c in open(f"/proc/self/task/{t}/children").read().split()]
        assert children == [], "no server was started for a test that asked for no fixture"


    async def test_submit_drain_and_the_clock(fencepost):
        run_id = await add.submit(fencepost.client, 2, 3)
        with pytest.raises(InvalidInput):
            await add.submit(fencepost.client, 2, "three")
        later = await add.options(delay=3600).submit(fencepost.client, 1, 1)
        await fencepost.drain()
        assert (await fencepost.client.wait(run_id, timeout=10)).result == 5
        assert await fencepost.status(later) == "PENDING"
        await fencepost.clock.advance(3600)
        await fencepost.drain()
        assert await fencepost.status(later) == "SUCCEEDED"


    async def test_retries_run_to_their_end_by_skipping_time(fencepost):
        run_id = await flaky.submit(fencepost.client, 2)
        await fencepost.drain(skip_delays=True)
        out = await fencepost.client.wait(run_id, timeout=10)
        assert out.status == "SUCCEEDED" and out.result == 3
'''


def make_project(pytester: pytest.Pytester, settings: Settings, monkeypatch: pytest.MonkeyPatch,
                 app: str, conftest: str, tests: str) -> pytest.Pytester:
    """A user's project: its module `myapp` (`app`), its conftest.py and its tests (dedented); the stores
    are this test's own (a fresh database; each plugin test gets its own key prefix)."""
    pytester.makepyfile(myapp=textwrap.dedent(app), conftest=textwrap.dedent(conftest),
                        test_myapp=textwrap.dedent(tests))
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    monkeypatch.setenv("FENCEPOST_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("FENCEPOST_DATABASE_URL", settings.database_url)
    monkeypatch.delenv("FENCEPOST_PREFIX", raising=False)
    return pytester


@pytest.fixture
def project(pytester: pytest.Pytester, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """The project of this module's APP, CONFTEST (the registry fixture only) and TESTS."""
    return make_project(pytester, settings, monkeypatch, APP, CONFTEST, TESTS)


def test_the_entry_point_gives_a_project_the_fixtures(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=3)


def test_a_project_without_a_redis_server(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """FENCEPOST_REDIS_URL=fakeredis://...: the hot store is fakeredis in the test process (PostgreSQL only)."""
    monkeypatch.setenv("FENCEPOST_REDIS_URL", "fakeredis://myapp")
    result = project.runpytest_subprocess("-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=3)


def test_loading_it_starts_nothing_without_configured_stores(project: pytest.Pytester,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """No URLs configured: a test that requests no fixture starts no embedded server."""
    monkeypatch.delenv("FENCEPOST_REDIS_URL")
    monkeypatch.delenv("FENCEPOST_DATABASE_URL")
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-k", "started_nothing", timeout=300)
    result.assert_outcomes(passed=1, deselected=2)


def test_the_plugin_can_be_turned_off(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:fencepost", "-k", "drain_and",
                                          timeout=300)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'fencepost' not found*"])


def test_without_a_registry_fixture_the_error_says_what_to_define(project: pytest.Pytester) -> None:
    project.makepyfile(conftest="")
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-k", "drain_and", timeout=300)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*define a `fencepost_registry` fixture*"])
