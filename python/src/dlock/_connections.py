"""dlock's own connections, made with the settings of the caller's redis-py client (address,
credentials, TLS, protocol) but with dlock's timeouts and without redis-py's retries: a RENEW must
not hang on a silent server past the lease, and one WAIT must be exactly one server-side wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import _common as common
from ._channels import Channels
from ._common import TICKET_REQUESTS, Features
from ._metrics import log

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
        if node is None:
            raise redis.exceptions.SlotNotCoveredError(f"dlock: no node serves {resource!r}")
        # A node the client has not talked to yet (a replica just promoted) has no client of
        # its own until asked for one.
        node_client = node.redis_connection or cluster.get_redis_connection(node)
        return node_client.connection_pool
    return client.connection_pool


class Connections:
    """A small pool of connections to one server, per address. Thread-safe."""

    def __init__(self, connection_class: Any, kwargs: dict[str, Any], timeout: float) -> None:
        self.connection_class = connection_class
        # The caller's settings, as its client has them (another node of a Cluster: the same).
        self.kwargs = kwargs
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

    def call_asking(self, args: Sequence[Any], timeout: float, wait: float | None = None) -> Any:
        """After an ASK redirect: ``ASKING`` and the command, on a connection opened for them
        and closed after them (``ASKING`` holds for the next command of its connection only; an
        ASK comes only while a slot migrates). ``wait``: the command blocks in the server up to
        that long (see :meth:`call_blocking`)."""
        settings = dict(self._settings)
        if wait is not None:
            settings["socket_timeout"] = wait + self._timeout
        connection = self._class(**settings)
        try:
            connection.send_command("ASKING")
            connection.send_command(*args)
            for _reply in ("ASKING", "command"):
                if wait is None and not connection.can_read(timeout=timeout):
                    raise redis.TimeoutError(f"dlock: no reply within {timeout:.3f} s")
                reply = connection.read_response()
            return reply
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
    """dlock's connections to each server the caller's client talks to, and what dlock tells the
    caller's Cluster client about its slot map."""

    def __init__(self, client: Any, timeout: float) -> None:
        self._client = client
        self._cluster = isinstance(client, redis.RedisCluster)
        self._timeout = timeout
        self._by_address: dict[tuple[Any, ...], Connections] = {}
        self._lock = threading.Lock()
        # A refresh of the Cluster client's slot map is asked for (see refresh_soon).
        self._refresh_wanted = False
        self._refresher: threading.Thread | None = None

    def _connections(self, connection_class: Any, kwargs: dict[str, Any]) -> Connections:
        address = (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), kwargs.get("db"))
        with self._lock:
            connections = self._by_address.get(address)
            if connections is None:
                connections = Connections(connection_class, kwargs, self._timeout)
                self._by_address[address] = connections
            return connections

    def for_resource(self, resource: str) -> Connections:
        """The server that serves ``resource`` (in a Cluster: its slot's primary, as the
        caller's client knows it; when it knows none, a refresh of its map is asked for)."""
        try:
            pool = node_pool_of(self._client, resource)
        except common.FAILURES as error:
            self.learn(error)
            raise
        return self._connections(pool.connection_class, dict(pool.connection_kwargs))

    def at(self, near: Connections, host: str, port: int) -> Connections:
        """The server a redirect names, with the settings of ``near`` (another node of the same
        Cluster), after the caller's client's own address mapping (``address_remap``)."""
        remap = getattr(getattr(self._client, "nodes_manager", None), "remap_host_port", None)
        if remap is not None:
            host, port = remap(host, port)
        return self._connections(near.connection_class, {**near.kwargs, "host": host, "port": port})

    def channels(self, resource: str) -> Channels:
        """The pub/sub connection to the server of ``resource`` (in a Cluster, to its shard:
        the module publishes there, and ``SSUBSCRIBE`` is used)."""
        return self.for_resource(resource).channels(self._cluster)

    def learn(self, error: BaseException) -> None:
        """What a failed request tells the caller's Cluster client (see ``common.map_update``):
        a MOVED moves the slot to the node it names in the client's map (redis-py's own
        ``move_slot``, or ``update_moved_exception`` before redis-py 8), any other failure that
        may come from a change of the topology asks for a refresh of the map."""
        if not self._cluster:
            return
        update = common.map_update(error)
        if update == "moved" and self._move_slot(error):
            return
        if update is not None:
            self.refresh_soon()

    def _move_slot(self, error: BaseException) -> bool:
        manager = self._client.nodes_manager
        move = getattr(manager, "move_slot", None) or getattr(
            manager, "update_moved_exception", None
        )
        if move is None:
            return False
        try:
            move(error)
        except Exception as failure:  # the client's own update of its map: refresh it instead
            log.debug("dlock: could not apply %r to the slot map: %s", error, failure)
            return False
        return True

    def refresh_soon(self) -> None:
        """Asks for a refresh of the caller's Cluster client's slot map (``CLUSTER SLOTS``),
        made by a thread of its own: the refresh uses the client's timeouts, not dlock's, and no
        renewal waits for it. One at a time, at most one per ``common.MAP_REFRESH_PAUSE``; asked
        for while one runs, another follows it."""
        with self._lock:
            self._refresh_wanted = True
            if self._refresher is not None:
                return
            self._refresher = threading.Thread(
                target=self._refresh, name="dlock-cluster-map", daemon=True
            )
            self._refresher.start()

    def _refresh(self) -> None:
        while True:
            with self._lock:
                if not self._refresh_wanted:
                    self._refresher = None
                    return
                self._refresh_wanted = False
            try:
                self._client.nodes_manager.initialize()
            except Exception as error:  # no node answered: the next failure asks again
                log.debug("dlock: refreshing the Cluster slot map failed: %s", error)
            time.sleep(common.MAP_REFRESH_PAUSE)

    def close(self) -> None:
        with self._lock:
            all_connections, self._by_address = list(self._by_address.values()), {}
        for connections in all_connections:
            connections.close()
