"""Real Redis topologies on free 127.0.0.1 ports, for the failover tests and benchmarks: no containers.

* :class:`SentinelSet`: one primary, replicas, and sentinels (``redis-server --sentinel``)
  that promote a replica ``down_after_ms`` after the primary stops answering.
* :class:`ClusterSet`: a Redis Cluster of primaries with one replica each, made by
  ``redis-cli --cluster create``.

Each is a context manager that stops every process it started. Without
``redis-server`` (or ``redis-cli`` for a cluster) :func:`redis_executables`
raises ``Missing``; the tests skip on it, saying why.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

SERVICE = "caliber"


class Missing(RuntimeError):
    """A Redis executable this topology needs is not installed."""


def redis_executables(*, cli: bool = False) -> tuple:
    """``(redis-server, redis-cli or None)``; raises :class:`Missing` with the reason."""
    server = shutil.which("redis-server") or (Path("/usr/bin/redis-server").exists() and "/usr/bin/redis-server")
    if not server:
        raise Missing("redis-server is not installed (./scripts/test.sh installs Debian's redis-server as root)")
    tool = shutil.which("redis-cli") or (Path("/usr/bin/redis-cli").exists() and "/usr/bin/redis-cli") or None
    if cli and not tool:
        raise Missing("redis-cli is not installed (it comes with Debian's redis-server package)")
    return server, tool


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands to outgoing connections (clients, replicas, sentinels)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1, with port + 10000 free too (a cluster's bus).

    Ports come from below the ephemeral range: a port the kernel gave out by ``bind(0)`` can be
    handed to an outgoing connection before the server that was meant to listen on it starts.
    """
    import random

    top = max(10_100, min(_ephemeral_floor(), 65536) - 10_000)
    ports, held = [], []
    for port in random.sample(range(10_000, top), k=min(4000, top - 10_000)):
        if len(ports) == n:
            break
        pair = []
        try:
            for p in (port, port + 10_000):
                s = socket.socket()
                pair.append(s)
                s.bind(("127.0.0.1", p))
        except OSError:
            for s in pair:
                s.close()
            continue
        held.extend(pair)
        ports.append(port)
    for s in held:
        s.close()
    if len(ports) < n:
        raise RuntimeError(f"found {len(ports)} of {n} free port pairs below the ephemeral range")
    return ports


def _client(port: int):
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.3, socket_timeout=2.0)


def _until(check, *, timeout: float, what: str, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception:  # noqa: BLE001 (a server still starting answers with any redis-py error)
            pass
        if time.monotonic() > deadline:
            tail = ""
            if log is not None and log.exists():
                tail = ": " + log.read_text()[-600:]
            raise RuntimeError(f"{what} within {timeout:.0f} s{tail}")
        time.sleep(0.05)


def _online(port: int) -> int:
    """How many replicas of the server on ``port`` have finished their sync."""
    info = _client(port).info("replication")
    return sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
               and v.get("state") == "online")


class Node:
    """One redis-server (no persistence: the replicas are the durability here)."""

    def __init__(self, exe: str, folder: Path, port: int, *extra: str):
        self.exe, self.port, self.folder, self.extra, self.proc = exe, port, folder, extra, None
        folder.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder), "--save", "",
             "--appendonly", "no", "--logfile", str(self.folder / "redis.log"),
             "--repl-diskless-sync-delay", "0", *self.extra],  # replicas sync at once, not after 5 s
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _until(lambda: _client(self.port).ping(), timeout=10, what=f"redis-server :{self.port} did not start",
               log=self.folder / "redis.log")

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to hand anything over."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class _Topology:
    """Started on entry and stopped on exit; a start that fails stops what it had started."""

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class SentinelSet(_Topology):
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels (quorum: a majority), in ``folder``.

    Parameters
    ----------
    folder : Path
    replicas, sentinels : int, default 2 and 3
    down_after_ms : int, default 1000
        The sentinels' ``down-after-milliseconds``.
    """

    def __init__(self, folder: Path, *, replicas: int = 2, sentinels: int = 3, down_after_ms: int = 1000):
        self.exe, _ = redis_executables()
        ports = free_ports(1 + replicas + sentinels)
        self.folder = folder
        self.nodes = [Node(self.exe, folder / f"node-{p}", p) for p in ports[:1 + replicas]]
        self.sentinel_ports = ports[1 + replicas:]
        self.down_after_ms, self.sentinels = down_after_ms, []

    def url(self, query: str = "") -> str:
        """``redis+sentinel://`` naming every sentinel and the service."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}" + (f"?{query}" if query else "")

    def start(self) -> None:
        primary = self.nodes[0]
        primary.start()
        for node in self.nodes[1:]:
            node.extra = ("--replicaof", "127.0.0.1", str(primary.port))
            node.start()
        want = len(self.nodes) - 1
        _until(lambda: _online(primary.port) == want, timeout=20, what="the replicas did not sync")
        quorum = len(self.sentinel_ports) // 2 + 1
        for port in self.sentinel_ports:
            folder = self.folder / f"sentinel-{port}"
            folder.mkdir(parents=True, exist_ok=True)
            conf = folder / "sentinel.conf"
            conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {folder}\nlogfile {folder / 'sentinel.log'}\n"
                            f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} {quorum}\n"
                            f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                            f"sentinel failover-timeout {SERVICE} 10000\n"
                            f"sentinel parallel-syncs {SERVICE} {want}\n")
            self.sentinels.append(subprocess.Popen([self.exe, str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.DEVNULL))
        others = len(self.sentinel_ports) - 1

        def ready():  # every sentinel knows every replica and every other sentinel (so it can vote)
            for port in self.sentinel_ports:
                c = _client(port)
                if (len(c.execute_command("SENTINEL", "REPLICAS", SERVICE)) != want
                        or len(c.execute_command("SENTINEL", "SENTINELS", SERVICE)) != others):
                    return False
            return True

        _until(ready, timeout=30, what="the sentinels did not discover each other and the replicas")

    def events(self) -> dict:
        """What the sentinels logged: ``failovers`` (the most ``+switch-master`` any one saw) and ``tilt``
        (``+tilt`` entries: a sentinel whose timer ran late, as on an overloaded machine, and stopped acting)."""
        switches, tilt = 0, 0
        for port in self.sentinel_ports:
            log = self.folder / f"sentinel-{port}" / "sentinel.log"
            text = log.read_text() if log.exists() else ""
            switches = max(switches, text.count("+switch-master"))
            tilt += text.count("+tilt")
        return {"failovers": switches, "tilt": tilt}

    def primary(self) -> Node:
        """The node the sentinels name as primary now."""
        host, port = _client(self.sentinel_ports[0]).execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                                                     SERVICE)
        return next(n for n in self.nodes if n.port == int(port))

    def stop(self) -> None:
        for proc in self.sentinels:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.sentinels:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for node in self.nodes:
            node.stop()


class ClusterSet(_Topology):
    """A Redis Cluster of ``primaries`` primaries with one replica each, in ``folder``.

    Parameters
    ----------
    folder : Path
    primaries : int, default 3
    node_timeout_ms : int, default 1000
        ``cluster-node-timeout``: how long a primary is unreachable before its replica takes over.
    """

    def __init__(self, folder: Path, *, primaries: int = 3, node_timeout_ms: int = 1000):
        self.exe, self.cli = redis_executables(cli=True)
        ports = free_ports(2 * primaries)
        self.nodes = [Node(self.exe, folder / f"node-{p}", p, "--cluster-enabled", "yes", "--cluster-config-file",
                           "nodes.conf", "--cluster-node-timeout", str(node_timeout_ms)) for p in ports]
        self.primaries_wanted = primaries

    def url(self, query: str = "") -> str:
        """``redis+cluster://`` naming every node (any reachable one is enough to start)."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"redis+cluster://{hosts}" + (f"?{query}" if query else "")

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        made = subprocess.run([self.cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                               "--cluster-replicas", "1", "--cluster-yes"], capture_output=True, text=True,
                              timeout=60)
        if made.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {made.stdout[-600:]}{made.stderr[-600:]}")

        def ok():
            for node in self.nodes:
                info = _client(node.port).execute_command("CLUSTER", "INFO").decode()
                if "cluster_state:ok" not in info:
                    return False
            primaries = [n for n in self.nodes if _client(n.port).info("replication")["role"] == "master"]
            return len(primaries) == self.primaries_wanted and all(_online(n.port) == 1 for n in primaries)

        _until(ok, timeout=30, what="the cluster did not reach cluster_state:ok with every replica in sync")

    def events(self) -> dict:
        """What the nodes logged: ``failovers`` (replicas that won an election and became primary)."""
        won = 0
        for node in self.nodes:
            log = node.folder / "redis.log"
            won += log.read_text().count("Failover election won") if log.exists() else 0
        return {"failovers": won}

    def slot_owner(self, slot: int) -> Node:
        """The node that serves ``slot`` now (read from a live node's CLUSTER SLOTS)."""
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                continue
            for start, end, primary, *_ in _client(node.port).execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return next(n for n in self.nodes if n.port == int(primary[1]))
        raise RuntimeError(f"no live node serves slot {slot}")

    def primaries(self) -> list[Node]:
        """The live nodes whose role is master."""
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None
                and _client(n.port).info("replication")["role"] == "master"]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
