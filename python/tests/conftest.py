"""Fixtures: real servers with the dlock module, started by the tests themselves, and a TCP proxy
for link faults (LinkProxy).

The module is found through ``DLOCK_MODULE``, else the newest of
``<repo>/target/{release,debug,debug/deps}/libdlock.so``. ``DLOCK_SERVER`` names the
server binary (default ``redis-server``; Valkey's ``valkey-server`` works the same)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import redis

REPO = Path(__file__).resolve().parents[2]


def module_path() -> Path:
    configured = os.environ.get("DLOCK_MODULE")
    if configured:
        return Path(configured).resolve()
    built = [
        path
        for path in (
            REPO / "target/release/libdlock.so",
            REPO / "target/debug/libdlock.so",
            REPO / "target/debug/deps/libdlock.so",
        )
        if path.is_file()
    ]
    if not built:
        pytest.fail("no libdlock.so: run `cargo build --release` or set DLOCK_MODULE")
    # The newest build: `cargo test` leaves a fresh debug one beside an older release one.
    return max(built, key=lambda path: path.stat().st_mtime)


def server_binary() -> str:
    return os.environ.get("DLOCK_SERVER", "redis-server")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def cmd(client: Any, *args: Any) -> Any:
    """A raw command (redis-py's ``execute_command``), awaitable for asyncio clients."""
    return client.execute_command(*args)


def fields(reply: Any) -> dict[Any, Any]:
    """A field/value reply as a dict: RESP3 maps already are, RESP2 gives a flat list."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2]))


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.01) -> bool:
    """Polls ``predicate`` until it holds or ``timeout`` seconds passed; its last answer."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return predicate()
        time.sleep(step)


class Server:
    """One redis-server (or valkey-server) with the module, on a free port, in its own dir."""

    def __init__(self, *extra: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="dlock-py-")
        self._real_dir = os.path.realpath(self.dir)  # as the server's CONFIG GET dir says it
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._extra = extra
        for _attempt in range(5):
            self.port = free_port()
            if self._start(extra):
                return
        raise RuntimeError(f"could not start {server_binary()}; see {self.dir}/server.log")

    def _start(self, extra: tuple[str, ...]) -> bool:
        log = open(os.path.join(self.dir, "server.log"), "ab")  # noqa: SIM115 (kept by Popen)
        self.process = subprocess.Popen(
            [
                server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.dir,
                "--save",
                "",
                "--appendonly",
                "no",
                "--loadmodule",
                str(module_path()),
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 10
        probe = redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    return False  # e.g. the port was taken meanwhile
                try:
                    # This server (its dir is ours), not another one on the port: runs of the
                    # tests at once (pytest-xdist's workers, the Redis and Valkey runs) start
                    # servers at once, and a server that finds its port taken exits, maybe not
                    # before this ping reached the one that took it.
                    if probe.ping() and probe.config_get("dir").get("dir") == self._real_dir:
                        return True
                except redis.RedisError:
                    pass
                time.sleep(0.02)
        finally:
            probe.close()
        self.process.kill()
        return False

    def client(self, **options: Any) -> redis.Redis:
        return redis.Redis(port=self.port, **options)

    def stop_process(self) -> None:
        """``kill -STOP``: the server stays connected but answers nothing."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def continue_process(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """``kill -9``: the server is gone at once, its connections refused from then on."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def restart(self) -> None:
        """Starts the server again after :meth:`kill`, on the same port, in the same dir (a
        Cluster node reads its ``nodes.conf`` there)."""
        if not self._start(self._extra):
            raise RuntimeError(f"could not restart {server_binary()}; see {self.dir}/server.log")

    def info(self) -> dict[str, Any]:
        with self.client() as probe:
            info: dict[str, Any] = probe.info("dlock")
            return info

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class LinkProxy:
    """A TCP proxy in front of a server, for link faults (the Rust test kit's ``LinkProxy``,
    reduced to what these tests need): every open connection goes silent, or the requests that
    contain some bytes are held back. One daemon thread per direction of each connection."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._accepted = 0
        # Connections numbered below this forward nothing more but stay open (half-open).
        self._silent_below = 0
        # Requests containing these bytes are held back this long before they go on.
        self._held_back: tuple[bytes, float] | None = None
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="link-proxy", daemon=True).start()

    def silence_open_connections(self) -> None:
        """Every connection open now swallows what is sent either way, and nothing is closed
        (the peer vanished without a FIN). New connections work."""
        with self._lock:
            self._silent_below = self._accepted + 1

    def hold_back_requests_containing(self, needle: bytes, delay: float) -> None:
        """Requests (client to server) that contain ``needle`` reach the server ``delay``
        seconds late, and what follows on their connection (its close too) after them."""
        with self._lock:
            self._held_back = (needle, delay)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(("127.0.0.1", self._target))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._accepted += 1
                number = self._accepted
                self._sockets += [client, server]
            for source, sink, requests in ((client, server, True), (server, client, False)):
                threading.Thread(
                    target=self._forward, args=(source, sink, number, requests), daemon=True
                ).start()

    def _forward(
        self, source: socket.socket, sink: socket.socket, number: int, requests: bool
    ) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = source.recv(65536)
                if not data:
                    break
                with self._lock:
                    silent = number < self._silent_below
                    held_back = self._held_back if requests else None
                if silent:
                    continue
                if held_back is not None and held_back[0] in data:
                    time.sleep(held_back[1])
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@pytest.fixture(scope="session")
def shared_server() -> Iterator[Server]:
    server = Server()
    yield server
    server.close()


@pytest.fixture
def server(shared_server: Server) -> Server:
    """The session's server, emptied and its counters reset for each test."""
    with shared_server.client() as admin:
        admin.flushall()
        admin.config_resetstat()
    return shared_server


@pytest.fixture
def own_server() -> Iterator[Server]:
    """A server of the test's own, for tests that stop or kill it."""
    server = Server()
    yield server
    server.close()


class Pair:
    """A primary and its replica, not a Cluster: a client stays at the primary's address while a
    failover turns it into a replica (:meth:`demote`) and back (:meth:`promote_back`)."""

    def __init__(self) -> None:
        # A full sync starts at once, not after Redis's 5 s wait for more replicas.
        self.primary = Server("--repl-diskless-sync-delay", "0")
        self.replica = Server("--repl-diskless-sync-delay", "0")
        self._follow(self.replica, self.primary)

    @staticmethod
    def _follow(replica: Server, primary: Server) -> None:
        """``replica`` replicates ``primary``; returns once its link is up."""
        with replica.client() as admin:
            cmd(admin, "REPLICAOF", "127.0.0.1", primary.port)

            def linked() -> bool:
                return bool(admin.info("replication").get("master_link_status") == "up")

            assert wait_until(linked, 10), f"{replica.port} never synced with {primary.port}"

    def hold(self, resource: str, ttl_ms: int) -> int:
        """A lease of ``holder`` on ``resource``, made on the primary; returns its fence once
        the replica has it."""
        with self.primary.client() as admin:
            fence: int = cmd(admin, "DLOCK.ACQUIRE", resource, "holder", ttl_ms)
        with self.replica.client() as probe:

            def replicated() -> bool:
                return bool(fields(cmd(probe, "DLOCK.INFO", resource) or []).get(b"fence") == fence)

            assert wait_until(replicated, 5), "the holder's lease never reached the replica"
        return fence

    def readonly_answers(self) -> int:
        """How many requests the primary refused with ``READONLY`` (while a replica)."""
        with self.primary.client() as probe:
            stats: dict[str, Any] = probe.info("errorstats")
        return int(stats.get("errorstat_READONLY", {}).get("count", 0))

    def demote(self) -> None:
        """The replica becomes the primary, and the primary its replica."""
        with self.replica.client() as admin:
            cmd(admin, "REPLICAOF", "NO", "ONE")
        self._follow(self.primary, self.replica)

    def promote_back(self) -> None:
        with self.primary.client() as admin:
            cmd(admin, "REPLICAOF", "NO", "ONE")
        self._follow(self.replica, self.primary)

    def close(self) -> None:
        self.primary.close()
        self.replica.close()


@pytest.fixture
def pair() -> Iterator[Pair]:
    started = Pair()
    yield started
    started.close()


@pytest.fixture
def r(server: Server) -> Iterator[redis.Redis]:
    client = server.client()
    yield client
    client.close()
