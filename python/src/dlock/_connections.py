"""dlock's own connections, made with the settings of the caller's redis-py client (address,
credentials, TLS, protocol) but with dlock's timeouts and without redis-py's retries: a RENEW must
not hang on a silent server past the lease, and one WAIT must be exactly one server-side wait."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._channels import Channels
from ._common import TICKET_REQUESTS, Features

# Settings of the caller's connections that dlock's own must not copy.
_NOT_COPIED = ("retry", "retry_on_timeout", "retry_on_error", "cache", "cache_config")


def connection_settings(
    kwargs: dict[str, Any], socket_timeout: float, connect_timeout: float
) -> dict[str, Any]:
    settings = {key: value for key, value in kwargs.items() if key not in _NOT_COPIED}
    settings["socket_timeout"] = socket_timeout
    settings["socket_connect_timeout"] = connect_timeout
    settings["retry_on_timeout"] = False
    return settings


def node_pool_of(client: Any, resource: str) -> Any:
    """The redis-py connection pool that serves ``resource``: the client's own, or in a
    Cluster the pool of the primary that owns the resource's slot."""
    if isinstance(client, redis.RedisCluster):
        cluster: Any = client
        node = cluster.get_node_from_key(resource)
        if node is None or node.redis_connection is None:
            raise redis.exceptions.SlotNotCoveredError(f"dlock: no node serves {resource!r}")
        return node.redis_connection.connection_pool
    return client.connection_pool


class Connections:
    """A small pool of connections to one server, per address. Thread-safe."""

    def __init__(self, connection_class: Any, kwargs: dict[str, Any], timeout: float) -> None:
        self._class = connection_class
        self._settings = connection_settings(kwargs, timeout, timeout)
        self._settings["retry"] = Retry(NoBackoff(), 0)
        self._timeout = timeout
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        # The server's command options, read once (see Locks.features).
        self.features: Features | None = None
        # Ticket ACQUIREs in flight at once: waiters woken together share a few connections.
        self.ticket_requests = threading.BoundedSemaphore(TICKET_REQUESTS)
        self._channels: Channels | None = None

    def channels(self, sharded: bool) -> Channels:
        """The server's pub/sub connection of this ``Locks`` (made on first use)."""
        with self._lock:
            if self._channels is None:
                self._channels = Channels(self._class, self._settings, sharded, self._timeout)
            return self._channels

    def _take(self) -> Any:
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            return self._class(**self._settings)
        try:
            # Readable while idle: the server closed it (its `timeout`) or sent something stray.
            # Start afresh rather than lose the next request to it (send_command reconnects).
            if connection.can_read(timeout=0):
                connection.disconnect()
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            connection.disconnect()
        return connection

    def _give_back(self, connection: Any) -> None:
        with self._lock:
            if len(self._idle) < 8:
                self._idle.append(connection)
                return
        connection.disconnect()

    def call(self, args: Sequence[Any], timeout: float) -> Any:
        """Sends one command and reads its reply, waiting at most ``timeout`` for it (the socket
        timeout also bounds connecting and each later read). No retry: an error is raised as
        redis-py raises it, and the connection is dropped unless the server answered."""
        connection = self._take()
        try:
            connection.send_command(*args)
            if not connection.can_read(timeout=timeout):
                raise redis.TimeoutError(f"dlock: no reply within {timeout:.3f} s")
            reply = connection.read_response()
        except redis.ResponseError:
            self._give_back(connection)
            raise
        except BaseException:
            connection.disconnect()
            raise
        self._give_back(connection)
        return reply

    def call_alone(self, args: Sequence[Any], timeout: float) -> Any:
        """Sends one command on a connection opened for it and closed after it: not one from
        the pool, which may have gone silent with the connection that just failed. Connecting
        is bounded by the request timeout, the reply by ``timeout``."""
        connection = self._class(**self._settings)
        try:
            connection.send_command(*args)
            if not connection.can_read(timeout=timeout):
                raise redis.TimeoutError(f"dlock: no reply within {timeout:.3f} s")
            return connection.read_response()
        finally:
            connection.disconnect()

    def call_blocking(self, args: Sequence[Any], wait: float) -> Any:
        """Sends a command that blocks in the server for up to ``wait`` seconds, on a connection
        of its own whose socket timeout is above the wait, without retries: one call is one
        server-side wait."""
        settings = dict(self._settings)
        settings["socket_timeout"] = wait + self._timeout
        connection = self._class(**settings)
        try:
            connection.send_command(*args)
            return connection.read_response()
        finally:
            connection.disconnect()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.disconnect()
        if self._channels is not None:
            self._channels.close()


class Nodes:
    """dlock's connections to each server the caller's client talks to."""

    def __init__(self, client: Any, timeout: float) -> None:
        self._client = client
        self._timeout = timeout
        self._by_address: dict[tuple[Any, ...], Connections] = {}
        self._lock = threading.Lock()

    def for_resource(self, resource: str) -> Connections:
        pool = node_pool_of(self._client, resource)
        kwargs: dict[str, Any] = dict(pool.connection_kwargs)
        address = (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), kwargs.get("db"))
        with self._lock:
            connections = self._by_address.get(address)
            if connections is None:
                connections = Connections(pool.connection_class, kwargs, self._timeout)
                self._by_address[address] = connections
            return connections

    def channels(self, resource: str) -> Channels:
        """The pub/sub connection to the server of ``resource`` (in a Cluster, to its shard:
        the module publishes there, and ``SSUBSCRIBE`` is used)."""
        sharded = isinstance(self._client, redis.RedisCluster)
        return self.for_resource(resource).channels(sharded)

    def refresh(self) -> None:
        """After MOVED/ASK: the caller's Cluster client learns the new slot map."""
        if isinstance(self._client, redis.RedisCluster):
            cluster: Any = self._client
            with contextlib.suppress(redis.RedisError):
                cluster.nodes_manager.initialize()

    def close(self) -> None:
        with self._lock:
            all_connections, self._by_address = list(self._by_address.values()), {}
        for connections in all_connections:
            connections.close()
