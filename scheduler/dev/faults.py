"""The parts `fencepost loadtest chaos` and the tests break on purpose: a TCP proxy that can
blackhole a link (stop forwarding, keep both sockets open), reset it or move it; private
redis-server and PostgreSQL instances the harness may kill and restart (never the machine's shared
ones); and CPU starvation of a process (a cgroup v1 CPU quota when /sys/fs/cgroup/cpu is writable,
else nice 19 beside busy loops).

Everything here is started and stopped by pid; nothing is found by name."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis

from fencepost.core import hotreads

__all__ = ["PrivatePostgres", "PrivateRedis", "Starver", "TcpProxy", "descendants", "faketime_problem", "free_port",
           "offset_clock_dir"]

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class TcpProxy:
    """A loopback TCP forwarder to (host, port): the one proxy the chaos harness and the tests use to
    break a link on purpose.

    - Forward: `await TcpProxy(host, port).start()`, then connect to `url(...)` / `port`.
    - Blackhole: `pause()` holds bytes in either direction, not forwarded, and closes no socket, so
      a client sees a silent peer (timeouts), not a reset; connections made during the cut wait
      too. `resume()` delivers what was held, in order, as a healed partition does (late commands
      run late). `pause(drop=True)` discards what is sent during the cut instead (lost packets);
      `pause(existing_only=True)` stalls only the connections open now (a dead flow beside a
      healthy path: what a client's re-send would use).
    - Reset: `drop()` aborts every connection (the peer sees a reset at once).
    - Failover address: `switch(host, port)` points new connections elsewhere and aborts the current
      ones (a DNS name or virtual IP moving to a promoted replica; a dead port: an outage).
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._gates: dict[asyncio.StreamWriter, asyncio.Event] = {}
        """Per accepted connection: set while its bytes flow."""
        self._new = asyncio.Event()
        """Set while new connections are let through."""
        self._new.set()
        self._drop = False

    @property
    def paused(self) -> bool:
        return not self._new.is_set() or any(not g.is_set() for g in self._gates.values())

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._handle, HOST, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def url(self, like: str = f"redis://{HOST}/0") -> str:
        """`like` (a redis:// or postgresql:// URL) with this proxy's address."""
        u = urlsplit(like)
        cred = u.netloc.rsplit("@", 1)
        where = f"{HOST}:{self.port}"
        return urlunsplit(u._replace(netloc=f"{cred[0]}@{where}" if len(cred) == 2 else where))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._new.wait()  # a connection made during a cut waits, as a SYN to a dead route would
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        gate = asyncio.Event()
        if self._new.is_set():  # a cut that began while this connection was being made holds it too
            gate.set()
        self._gates[writer] = gate
        self._conns |= {writer, up_w}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    if not gate.is_set():
                        if self._drop:
                            continue  # lost, not held
                        await gate.wait()  # held, not dropped, while paused (reading stops: TCP buffers fill)
                    dst.write(data)
                    await dst.drain()
            except (OSError, RuntimeError, asyncio.IncompleteReadError):
                pass  # RuntimeError: uvloop's write to a transport the other side already closed
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        try:
            await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
        finally:
            self._conns -= {writer, up_w}
            self._gates.pop(writer, None)

    def pause(self, drop: bool = False, existing_only: bool = False) -> None:
        """Stop forwarding (both directions; new connections too unless existing_only); sockets stay open."""
        self._drop = drop
        for g in self._gates.values():
            g.clear()
        if not existing_only:
            self._new.clear()

    def resume(self) -> None:
        self._drop = False
        for g in self._gates.values():
            g.set()
        self._new.set()

    def drop(self) -> int:
        """Abort every connection now (a reset); returns how many sockets were open."""
        n = len(self._conns)
        for w in list(self._conns):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._conns.clear()
        return n

    def switch(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.drop()

    async def close(self) -> None:
        self.resume()
        self.drop()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)


class PrivateRedis:
    """One redis-server on a loopback port (a free one unless given), in a private directory,
    without persistence: the chaos harness's pair and the tests' servers (tests/servers.py)."""

    def __init__(self, binary: str, *, port: int | None = None, replicaof: int | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        """replicaof: the loopback port of its primary (or of a proxy in front of it); extra: more
        redis-server arguments (cluster mode, DEBUG allowed)."""
        self.binary, self.replicaof, self.extra = binary, replicaof, extra
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="fp-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def client(self, **kw: Any) -> aioredis.Redis:
        return aioredis.Redis(host=HOST, port=self.port, **{"socket_timeout": 5, **kw})

    async def start(self, timeout: float = 15.0) -> Self:
        args = [self.binary, "--bind", HOST, "--port", str(self.port), "--save", "", "--appendonly", "no",
                "--dir", self.dir, "--maxmemory-policy", "noeviction", "--repl-diskless-sync-delay", "0",
                "--repl-backlog-size", "64mb", "--client-output-buffer-limit", "replica", "0", "0", "0", *self.extra]
        if self.replicaof is not None:
            args += ["--replicaof", HOST, str(self.replicaof)]
        self.proc = self._launch(args)
        deadline = time.monotonic() + timeout
        r = self.client()
        try:
            while True:
                try:
                    await hotreads.ping(r)
                    if self.replicaof is None or (await hotreads.replication(r)).link_up:
                        return self
                except (OSError, aioredis.RedisError):
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start")
                await asyncio.sleep(0.05)
        finally:
            await r.aclose()

    @staticmethod
    def _launch(args: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self, sig: int | None = None) -> None:
        """Stop it by pid and wait (SIGKILL unless `sig`: no shutdown save, a crash); a signal it
        does not die of within 10 s is followed by SIGKILL."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL if sig is None else sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def cleanup(self) -> None:
        self.signal(signal.SIGCONT)
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivatePostgres:
    """A PostgreSQL cluster of its own (initdb in a temporary directory, a free port), so the
    harness can restart it; run as the `postgres` user when this process is root."""

    def __init__(self, bindir: str) -> None:
        self.bindir = bindir
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="fp-chaos-pg-")
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "log")

    @staticmethod
    def find() -> str | None:
        """The directory holding initdb and pg_ctl, or None."""
        for d in filter(None, [os.path.dirname(shutil.which("initdb") or ""),
                               *sorted(map(str, Path("/usr/lib/postgresql").glob("*/bin")), reverse=True)]):
            if os.access(os.path.join(d, "initdb"), os.X_OK) and os.access(os.path.join(d, "pg_ctl"), os.X_OK):
                return d
        return None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{HOST}:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    def start(self) -> PrivatePostgres:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        out = self._run(os.path.join(self.bindir, "initdb"), "-D", self.data, "-A", "trust", "-U", "postgres",
                        "--no-sync")
        if out.returncode != 0:
            raise RuntimeError(f"initdb failed: {out.stderr[-500:]}")
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"port = {self.port}\nlisten_addresses = '{HOST}'\nunix_socket_directories = '{self.dir}'\n"
                    # A commit is in the WAL the kernel holds before it is acknowledged (synchronous_commit
                    # on), so a restart, even -m immediate, loses nothing acknowledged; fsync off only
                    # trusts the kernel's page cache, which a process crash does not lose.
                    "fsync = off\nsynchronous_commit = on\nfull_page_writes = off\nmax_connections = 200\n"
                    "shared_buffers = 64MB\n")
        self._ctl("start")
        return self

    def _ctl(self, action: str, *extra: str) -> None:
        out = self._run(os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-l", self.log, "-w", "-t", "60",
                        action, *extra)
        if out.returncode != 0:
            raise RuntimeError(f"pg_ctl {action} failed: {out.stdout[-300:]}{out.stderr[-300:]}")

    def restart(self, mode: str = "fast") -> None:
        """Stop (fast: clients disconnected; immediate: a crash, recovery on start) and start."""
        self._ctl("restart", "-m", mode)

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            self._ctl("stop", "-m", "immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


class Starver:
    """Starves one process of CPU for a while: a cgroup v1 CPU quota (1 % of a core) when
    /sys/fs/cgroup/cpu is writable, else nice 19 beside one busy loop per core (nice 10, so the
    machine's other work is hurt less than the victim)."""

    CGROUP = "/sys/fs/cgroup/cpu"

    def __init__(self) -> None:
        self.group: str | None = None
        self.loops: list[subprocess.Popen[bytes]] = []
        self.how = ""

    @classmethod
    def cgroup_ok(cls) -> bool:
        return os.path.isfile(os.path.join(cls.CGROUP, "cpu.cfs_quota_us")) and os.access(cls.CGROUP, os.W_OK)

    def start(self, pid: int) -> str:
        if self.cgroup_ok():
            try:
                self.group = os.path.join(self.CGROUP, f"fencepost-chaos-{os.getpid()}-{pid}")
                os.makedirs(self.group, exist_ok=True)
                with open(os.path.join(self.group, "cpu.cfs_period_us"), "w") as f:
                    f.write("100000")
                with open(os.path.join(self.group, "cpu.cfs_quota_us"), "w") as f:
                    f.write("1000")
                for child in [pid, *_descendants(pid)]:
                    with contextlib.suppress(OSError), open(os.path.join(self.group, "cgroup.procs"), "w") as f:
                        f.write(str(child))
                self.how = "cgroup v1 cpu quota 1% of a core"
                return self.how
            except OSError:
                self.stop()
        for child in [pid, *_descendants(pid)]:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, child, 19)
        code = "import os\nos.nice(10)\nwhile True: pass\n"
        self.loops = [subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
                      for _ in range(os.cpu_count() or 1)]
        self.how = f"nice 19 beside {len(self.loops)} busy loops at nice 10"
        return self.how

    def stop(self, pid: int | None = None) -> None:
        for p in self.loops:
            with contextlib.suppress(OSError):
                p.kill()
            p.wait(10)
        self.loops = []
        if pid is not None:
            for child in [pid, *_descendants(pid)]:
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, child, 0)
        if self.group is not None:
            parent = os.path.join(self.CGROUP, "cgroup.procs")
            members: list[str] = []
            with contextlib.suppress(OSError), open(os.path.join(self.group, "cgroup.procs")) as f:
                members = f.read().split()
            for m in members:
                with contextlib.suppress(OSError), open(parent, "w") as f:
                    f.write(m)
            with contextlib.suppress(OSError):
                os.rmdir(self.group)
            self.group = None


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (its handler children), from /proc."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def descendants(pid: int) -> list[int]:
    return _descendants(pid)


_FAKETIME_PROBE = """
import asyncio, threading, time
time.sleep(0.05)
lock = threading.Lock()
lock.acquire()
lock.acquire(timeout=0.05)
threading.Event().wait(0.05)
asyncio.run(asyncio.sleep(0.05))
print("ok")
"""


def faketime_problem(offset: str = "-30s") -> str | None:
    """None when `faketime -f OFFSET python` runs the timed waits a worker uses (sleep, a lock with a
    timeout, Event.wait, asyncio.sleep) within 10 s; else why not, in one line."""
    if shutil.which("faketime") is None:
        return "faketime is not installed (apt-get install faketime)"
    try:
        out = subprocess.run(["faketime", "-f", offset, sys.executable, "-c", _FAKETIME_PROBE], capture_output=True,
                             text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return (f"faketime {offset} hangs this Python's timed waits (a Lock.acquire(timeout=) never returns "
                "under libfaketime's clock)")
    if out.returncode != 0 or "ok" not in out.stdout:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return f"faketime {offset} breaks this Python ({last[:120]})"
    return None


_OFFSET_CLOCK = """# Written by fencepost loadtest chaos: this process's wall clock is off by
# FENCEPOST_CHAOS_CLOCK_OFFSET_S seconds (time.time, time.time_ns); monotonic time is right.
import os as _os
import time as _time

_off = float(_os.environ.get("FENCEPOST_CHAOS_CLOCK_OFFSET_S", "0"))
if _off:
    _real, _real_ns = _time.time, _time.time_ns
    _time.time = lambda: _real() + _off
    _time.time_ns = lambda: _real_ns() + int(_off * 1e9)
"""


def offset_clock_dir() -> str:
    """A directory holding a sitecustomize.py that offsets a Python process's wall clock by
    $FENCEPOST_CHAOS_CLOCK_OFFSET_S (put it first on PYTHONPATH): the skew a test injects when
    faketime cannot run Python."""
    d = tempfile.mkdtemp(prefix="fp-chaos-clock-")
    with open(os.path.join(d, "sitecustomize.py"), "w") as f:
        f.write(_OFFSET_CLOCK)
    return d
