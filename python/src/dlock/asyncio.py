"""The asyncio client: :class:`Locks` for ``redis.asyncio.Redis`` and
``redis.asyncio.cluster.RedisCluster``, with the same API as :class:`dlock.Locks`.

    async with dlock.asyncio.Locks(r).hold("invoice:123", ttl=30, timeout=10) as lease:
        await lease.fenced("SET", "invoice:123:total", "10")

One renewal task per ``Locks`` (not per lease) renews every held lease. A lost lease cancels the
body's task, and the block then raises :class:`dlock.LeaseLost` instead of ``CancelledError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncGenerator, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

import redis
import redis.asyncio
import redis.asyncio.cluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from . import _common as common
from . import _protocol as protocol
from ._async_channels import Channels, Watch
from ._common import (
    Features,
    Leader,
    LeaseState,
    LeaseView,
    Request,
    SetLeaseView,
    SetRequest,
    SetState,
)
from ._connections import connection_settings
from ._errors import NotAcquired, Stale
from ._metrics import Metrics, log
from ._protocol import Arg

__all__ = ["Hold", "Lease", "Locks", "SetHold", "SetLease"]


class _Connections:
    """dlock's own connections to one server (see ``dlock._connections``), for one event loop."""

    def __init__(self, connection_class: Any, kwargs: dict[str, Any], timeout: float) -> None:
        self.connection_class = connection_class
        # The caller's settings, as its client has them (another node of a Cluster: the same).
        self.kwargs = kwargs
        self._class = connection_class
        self._settings = connection_settings(kwargs, timeout, timeout)
        self._settings["retry"] = Retry(NoBackoff(), 0)
        self._timeout = timeout
        self._idle: list[Any] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        # The server's command options, read once (see Locks.features).
        self.features: Features | None = None
        # Ticket ACQUIREs in flight at once (see dlock._connections).
        self.ticket_requests = asyncio.BoundedSemaphore(common.TICKET_REQUESTS)
        self._channels: Channels | None = None

    def channels(self, sharded: bool) -> Channels:
        """The server's pub/sub connection of this ``Locks`` (made on first use)."""
        if self._channels is None:
            self._channels = Channels(self._class, self._settings, sharded, self._timeout)
        return self._channels

    async def _take(self) -> Any:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Connections belong to the loop that made them.
            self._idle, self._loop = [], loop
        if not self._idle:
            return self._class(**self._settings)
        connection = self._idle.pop()
        try:
            # Readable while idle: closed by the server (its `timeout`) or something stray.
            # can_read() from redis-py 8 on; can_read_destructive() before (deprecated since).
            readable = getattr(connection, "can_read", None) or connection.can_read_destructive
            if await readable():
                await self._drop(connection)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            await self._drop(connection)
        return connection

    async def _drop(self, connection: Any) -> None:
        with contextlib.suppress(Exception):  # already broken
            await connection.disconnect(nowait=True)

    async def call(self, args: Sequence[Any], timeout: float) -> Any:
        """One command and its reply within ``timeout``, no retry (see the threaded client)."""
        connection = await self._take()
        try:
            await asyncio.wait_for(connection.send_command(*args), timeout)
            reply = await asyncio.wait_for(connection.read_response(), timeout)
        except redis.ResponseError:
            self._idle.append(connection)
            raise
        except asyncio.TimeoutError:
            await self._drop(connection)
            raise redis.TimeoutError(f"dlock: no reply within {timeout:.3f} s") from None
        except BaseException:
            await self._drop(connection)
            raise
        if len(self._idle) < 8:
            self._idle.append(connection)
        else:
            await self._drop(connection)
        return reply

    async def call_alone(self, args: Sequence[Any], timeout: float) -> Any:
        """One command on a connection opened for it and closed after it (not one from the
        pool, which may have gone silent with the one that failed), within the request timeout
        to connect and ``timeout`` for the reply."""
        connection = self._class(**self._settings)
        try:
            await asyncio.wait_for(connection.send_command(*args), self._timeout)
            return await asyncio.wait_for(connection.read_response(), timeout)
        except asyncio.TimeoutError:
            raise redis.TimeoutError(f"dlock: no reply within {timeout:.3f} s") from None
        finally:
            await self._drop(connection)

    async def call_asking(
        self, args: Sequence[Any], timeout: float, wait: float | None = None
    ) -> Any:
        """After an ASK redirect: ``ASKING`` and the command on a connection opened for them and
        closed after them (see ``dlock._connections.Connections.call_asking``)."""
        settings = dict(self._settings)
        if wait is not None:
            settings["socket_timeout"] = wait + self._timeout
        connection = self._class(**settings)
        try:
            await asyncio.wait_for(connection.send_command("ASKING"), self._timeout)
            await asyncio.wait_for(connection.send_command(*args), self._timeout)
            await asyncio.wait_for(connection.read_response(), timeout)
            if wait is None:
                return await asyncio.wait_for(connection.read_response(), timeout)
            return await connection.read_response()
        except asyncio.TimeoutError:
            raise redis.TimeoutError(f"dlock: no reply within {timeout:.3f} s") from None
        finally:
            await self._drop(connection)

    async def call_blocking(self, args: Sequence[Any], wait: float) -> Any:
        """A command that blocks in the server up to ``wait``: a connection of its own, a
        socket timeout above the wait, no retries: one call is one server-side wait."""
        settings = dict(self._settings)
        settings["socket_timeout"] = wait + self._timeout
        connection = self._class(**settings)
        try:
            await connection.send_command(*args)
            return await connection.read_response()
        finally:
            await self._drop(connection)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            await self._drop(connection)
        if self._channels is not None:
            await self._channels.close()


class _Nodes:
    """dlock's connections to each server (see ``dlock._connections.Nodes``), and what dlock
    tells the caller's Cluster client about its slot map."""

    def __init__(self, client: Any, timeout: float) -> None:
        self._client = client
        self._cluster = isinstance(client, redis.asyncio.cluster.RedisCluster)
        self._timeout = timeout
        self._by_address: dict[tuple[Any, ...], _Connections] = {}
        self._refresh_wanted = False
        self._refresher: asyncio.Task[None] | None = None

    def _connections(self, connection_class: Any, kwargs: dict[str, Any]) -> _Connections:
        address = (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), kwargs.get("db"))
        connections = self._by_address.get(address)
        if connections is None:
            connections = _Connections(connection_class, kwargs, self._timeout)
            self._by_address[address] = connections
        return connections

    async def for_resource(self, resource: str) -> _Connections:
        if self._cluster:
            try:
                await self._client.initialize()
                node = self._client.get_node_from_key(resource)
                if node is None:
                    raise redis.exceptions.SlotNotCoveredError(
                        f"dlock: no node serves {resource!r}"
                    )
            except common.FAILURES as error:
                await self.learn(error)
                raise
            return self._connections(node.connection_class, dict(node.connection_kwargs))
        pool = self._client.connection_pool
        return self._connections(pool.connection_class, dict(pool.connection_kwargs))

    def at(self, near: _Connections, host: str, port: int) -> _Connections:
        """The server a redirect names, with the settings of ``near`` (see
        ``dlock._connections.Nodes.at``)."""
        remap = getattr(getattr(self._client, "nodes_manager", None), "remap_host_port", None)
        if remap is not None:
            host, port = remap(host, port)
        return self._connections(near.connection_class, {**near.kwargs, "host": host, "port": port})

    async def channels(self, resource: str) -> Channels:
        return (await self.for_resource(resource)).channels(self._cluster)

    async def learn(self, error: BaseException) -> None:
        """What a failed request tells the caller's Cluster client about its slot map (see
        ``dlock._connections.Nodes.learn``)."""
        if not self._cluster:
            return
        update = common.map_update(error)
        if update == "moved" and await self._move_slot(error):
            return
        if update is not None:
            self.refresh_soon()

    async def _move_slot(self, error: BaseException) -> bool:
        manager = self._client.nodes_manager
        move = getattr(manager, "move_slot", None) or getattr(
            manager, "update_moved_exception", None
        )
        if move is None:
            return False
        try:
            moved = move(error)
            if inspect.isawaitable(moved):  # redis-py 8's move_slot is a coroutine
                await moved
        except Exception as failure:  # the client's own update of its map: refresh it instead
            log.debug("dlock: could not apply %r to the slot map: %s", error, failure)
            return False
        return True

    def refresh_soon(self) -> None:
        """Asks for a refresh of the caller's Cluster client's slot map, made by a task of its
        own (see ``dlock._connections.Nodes.refresh_soon``)."""
        self._refresh_wanted = True
        task, loop = self._refresher, asyncio.get_running_loop()
        if task is None or task.done() or task.get_loop() is not loop:
            self._refresher = loop.create_task(self._refresh(), name="dlock-cluster-map")

    async def _refresh(self) -> None:
        while self._refresh_wanted:
            self._refresh_wanted = False
            try:
                await self._client.nodes_manager.initialize()
            except Exception as error:  # no node answered: the next failure asks again
                log.debug("dlock: refreshing the Cluster slot map failed: %s", error)
            await asyncio.sleep(common.MAP_REFRESH_PAUSE)

    async def close(self) -> None:
        task, self._refresher = self._refresher, None
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        all_connections, self._by_address = list(self._by_address.values()), {}
        for connections in all_connections:
            await connections.close()


async def _fenced(locks: Locks, resource: str, fence: int, command: tuple[Arg, ...]) -> Any:
    """``DLOCK.FENCED resource fence command…`` through the caller's client (see
    :meth:`Lease.fenced`)."""
    try:
        return await locks.client.execute_command(*protocol.fenced_args(resource, fence, command))
    except redis.ResponseError as error:
        if protocol.class_of(error) == "stale":
            locks.metrics.stale_write(resource, fence, str(error))
            raise Stale(resource, fence, str(error)) from error
        raise
    except redis.exceptions.RedisClusterException as error:
        crossed = common.cross_slot(error)
        if crossed is not None:
            raise crossed from error
        raise


class Lease(LeaseView):
    """A granted lease (see :class:`dlock.Lease`); :meth:`fenced` is a coroutine here."""

    def __init__(self, locks: Locks, state: LeaseState) -> None:
        super().__init__(state)
        self._locks = locks

    async def fenced(self, *command: Arg) -> Any:
        """Runs ``command`` in the server only if this lease's fence is still the live one
        (``DLOCK.FENCED``), through the caller's client; raises :class:`dlock.Stale` when the
        server refused it: nothing was written."""
        return await _fenced(self._locks, self.resource, self.fence, command)


class SetLease(SetLeaseView):
    """A granted set (see :class:`dlock.SetLease`); :meth:`fenced` is a coroutine here."""

    def __init__(self, locks: Locks, state: SetState) -> None:
        super().__init__(state)
        self._locks = locks

    async def fenced(self, resource: str, *command: Arg) -> Any:
        """Runs ``command`` in the server only if the fence of the member ``resource`` is still
        the live one; raises :class:`dlock.Stale` when the server refused it: nothing was
        written."""
        return await _fenced(self._locks, resource, self.fence(resource), command)


def _uncancel(task: asyncio.Task[Any]) -> None:
    uncancel = getattr(task, "uncancel", None)  # Python 3.11+
    if uncancel is not None:
        uncancel()


def _cancelling(task: asyncio.Task[Any]) -> int:
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return int(cancelling()) if cancelling is not None else 0


ViewT = TypeVar("ViewT", Lease, SetLease)


class _Block(Generic[ViewT]):
    """An ``async with`` block over a lease or a set: acquired on entry, renewed by the
    ``Locks``' renewal task while it runs, its body cancelled at a loss, released when it
    exits."""

    def __init__(self, locks: Locks) -> None:
        self._locks = locks
        self._lease: ViewT | None = None
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exiting = False
        self._cancelled_body = False

    async def _acquire(self) -> tuple[LeaseState, ViewT]:
        raise NotImplementedError

    async def __aenter__(self) -> ViewT:
        if self._lease is not None:
            raise RuntimeError("dlock: a hold is entered once")
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        state, self._lease = await self._acquire()
        state.on_lost(self._lost)
        self._locks._renewer.add(state)
        return self._lease

    def _lost(self) -> None:
        """Called (from any thread) when the lease is lost: cancel the body, from its loop."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._cancel_body)

    def _cancel_body(self) -> None:
        if self._exiting or self._task is None or self._task.done() or self._cancelled_body:
            return
        self._cancelled_body = True
        self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._lease is not None
        assert self._task is not None
        self._exiting = True
        state = self._lease._state
        self._locks._renewer.remove(state)
        await self._locks._unlisten(state)
        # Our cancellation was delivered to the body if it ends with CancelledError.
        consumed = self._cancelled_body and isinstance(exc, asyncio.CancelledError)
        if consumed:
            _uncancel(self._task)
        finished = False
        while not finished:
            try:
                await self._locks._finish(state)
                finished = True
                if self._cancelled_body and not consumed:
                    # Our cancellation may still be pending (the body ended before it came):
                    # take it here, not in the caller's code after the block.
                    await asyncio.sleep(0)
            except asyncio.CancelledError:
                if not self._cancelled_body or consumed:
                    raise
                consumed = True
                _uncancel(self._task)
        if isinstance(exc, asyncio.CancelledError) and self._cancelled_body:
            if _cancelling(self._task) > 0:
                return None  # cancelled from outside as well: that cancellation goes on
            raise state.error() from exc
        if exc is None and state.lost.is_set():
            raise state.error()
        return None


class Hold(_Block[Lease]):
    """The async context manager :meth:`Locks.hold`, :meth:`Locks.read`, :meth:`Locks.write` and
    :meth:`Locks.semaphore` return."""

    def __init__(self, locks: Locks, request: Request) -> None:
        super().__init__(locks)
        self._request = request

    async def _acquire(self) -> tuple[LeaseState, Lease]:
        state = await self._locks._acquire(self._request)
        return state, Lease(self._locks, state)


class SetHold(_Block[SetLease]):
    """The async context manager :meth:`Locks.hold_all` returns."""

    def __init__(self, locks: Locks, request: SetRequest) -> None:
        super().__init__(locks)
        self._request = request

    async def _acquire(self) -> tuple[LeaseState, SetLease]:
        state = await self._locks._acquire_all(self._request)
        return state, SetLease(self._locks, state)


class Locks(common.Handles[Hold, SetHold]):
    """Lease locks for ``redis.asyncio`` clients; the same API and lifecycle as
    :class:`dlock.Locks`, with one renewal task per ``Locks`` and ``Locks`` used from one event
    loop at a time."""

    def __init__(
        self,
        client: Any,
        *,
        request_timeout: float = 2.0,
        release_timeout: float | None = None,
        metrics: Metrics | None = None,
        wait: str = "block",
        ticket_ttl: float = 6.0,
    ) -> None:
        common.check_wait(wait, ticket_ttl)
        self.client = client
        self.wait = wait
        self.ticket_ttl = ticket_ttl
        self.request_timeout = request_timeout
        self.release_timeout = request_timeout if release_timeout is None else release_timeout
        self.metrics = metrics if metrics is not None else Metrics()
        self._nodes = _Nodes(client, request_timeout)
        self._renewer = _Renewer(self)
        # Per held lease: the channel of each of its resources it listens on for its
        # revocation, and its watch there.
        self._listening: dict[LeaseState, list[tuple[Channels, Watch]]] = {}

    def _hold(self, request: Request) -> Hold:
        return Hold(self, request)

    def _hold_all(self, request: SetRequest) -> SetHold:
        return SetHold(self, request)

    async def features(self, resource: str = "dlock") -> Features:
        """The command options advertised by the server that serves ``resource``, read once per
        server and ``Locks`` (see :meth:`dlock.Locks.features`)."""
        connections = await self._nodes.for_resource(resource)
        if connections.features is None:
            try:
                reply = await connections.call(common.FEATURES_COMMAND, self.request_timeout)
            except redis.ResponseError:
                reply = None  # no COMMAND DOCS: version 1 only
            except common.FAILURES as error:
                await self._nodes.learn(error)
                raise
            connections.features = Features.from_docs(reply)
        return connections.features

    async def aclose(self) -> None:
        """Closes dlock's own connections (the caller's client stays open)."""
        await self._nodes.close()

    def observe(self, name: str, *, interval: float = 2.0) -> AsyncGenerator[Leader | None, None]:
        """The leaders of the election ``name`` as they change (see
        :meth:`dlock.Locks.observe`), as an async iterator: ``async for leader in
        locks.observe(name)``. The subscription ends when it is closed (``aclose()``, e.g.
        with ``contextlib.aclosing``)."""
        if interval <= 0:
            raise ValueError("dlock: interval must be positive")
        return self._observe(name, interval)

    async def _observe(self, name: str, interval: float) -> AsyncGenerator[Leader | None, None]:
        channels = await self._nodes.channels(name)
        watch = await channels.join(name)
        try:
            last: Leader | bool | None = False  # nothing yielded yet
            while True:
                watch.event.clear()
                try:
                    info = protocol.info_args(name)
                    reply = await self._call(name, info, self.request_timeout)
                    leader = common.leader_from_info(reply)
                except common.FAILURES as error:
                    log.debug("dlock: reading the leader of %s failed: %s", name, error)
                else:
                    if leader != last:
                        last = leader
                        yield leader
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(watch.event.wait(), interval)
        finally:
            await channels.leave(watch)

    async def _call(
        self,
        resource: str,
        args: Any,
        timeout: float,
        *,
        wait: float | None = None,
        alone: bool = False,
    ) -> Any:
        """Sends ``args`` to the server of ``resource`` and returns its reply, following MOVED
        and ASK (see :meth:`dlock.Locks._call`)."""
        deadline = time.monotonic() + timeout
        connections = None
        asking = False
        for hop in range(common.MAX_REDIRECTS + 1):
            left = max(0.001, deadline - time.monotonic())
            try:
                if connections is None:
                    connections = await self._nodes.for_resource(resource)
                if asking:
                    return await connections.call_asking(args, left, wait)
                if wait is not None:
                    return await connections.call_blocking(args, wait)
                if alone:
                    return await connections.call_alone(args, left)
                return await connections.call(args, left)
            except common.FAILURES as error:
                await self._nodes.learn(error)
                target = common.redirect(error)
                if (
                    target is None
                    or connections is None
                    or hop == common.MAX_REDIRECTS
                    or (wait is None and time.monotonic() >= deadline)
                ):
                    raise
                kind, host, port = target
                connections = self._nodes.at(connections, host, port)
                asking = kind == "ask"
        raise AssertionError("unreachable")

    async def _acquire(self, request: Request) -> LeaseState:
        self.metrics.acquire_attempt()
        started = time.monotonic()
        plan = common.AcquirePlan(
            request.ttl,
            request.timeout,
            request.max_hold,
            self.request_timeout,
            ticket=self.ticket_ttl if self.wait == "tickets" else None,
        )
        try:
            state = await self._try_acquire(request, plan)
        except BaseException as error:
            self.metrics.acquire_failed(common.acquire_failure(error, plan))
            raise
        self.metrics.acquired(
            request.resource, state.token, state.fence, time.monotonic() - started
        )
        return state

    async def _try_acquire(self, request: Request, plan: common.AcquirePlan) -> LeaseState:
        resource = request.resource
        watch: Watch | None = None
        channels: Channels | None = None
        try:
            while True:
                if plan.queued and plan.left() <= 0:
                    await self._withdraw(resource, common.forget_command(resource, plan.token))
                    raise NotAcquired(resource, request.timeout)
                if watch is not None:
                    watch.event.clear()  # a message from now on means: send again
                sent = time.monotonic()
                try:
                    # Read once per Locks; a failure to read them is retried like the ACQUIRE.
                    features = await self.features(resource)
                    command, wait_ms, queue_ms = plan.next_command(features, request)
                    if queue_ms is not None:
                        serving = await self._nodes.channels(resource)
                        if serving is not channels:
                            # Subscribed before the first ticket, and again where a failover or a
                            # migration moved the resource: no hand-over goes unheard.
                            if watch is not None and channels is not None:
                                await channels.leave(watch)
                                watch = None
                            channels = serving
                            tag = common.token_tag(plan.token)
                            channel = plan.channel(resource, features)
                            watch = await channels.join(resource, tag, channel=channel)
                            sent = time.monotonic()
                        plan.queued = True
                        connections = await self._nodes.for_resource(resource)
                        async with connections.ticket_requests:
                            reply = await self._call(resource, command, self.request_timeout)
                    elif wait_ms is None:
                        reply = await self._call(resource, command, self.request_timeout)
                    else:
                        wait = wait_ms / 1000
                        reply = await self._call(resource, command, self.request_timeout, wait=wait)
                    fence = common.as_int(reply)
                except asyncio.CancelledError:
                    # The caller gave up: a grant (or a ticket) under our token may exist.
                    forget = common.forget_command(resource, plan.token)
                    await asyncio.shield(self._forget(resource, forget))
                    raise
                except Exception as error:
                    if plan.retry_after(error):
                        await asyncio.sleep(plan.retry_pause())
                        continue
                    if plan.reached_server:
                        await self._forget(resource, common.forget_command(resource, plan.token))
                    raise
                answer = plan.answered(fence, waited=wait_ms is not None)
                if answer == "granted":
                    assert fence is not None
                    state = plan.lease(resource, fence, sent, self.metrics, request.mode)
                    # Before a ticket's watch leaves: the channel stays subscribed.
                    await self._listen(state)
                    return state
                if queue_ms is not None and watch is not None:
                    # In line: until a message for the resource, or the ticket's refresh.
                    try:
                        await asyncio.wait_for(watch.event.wait(), plan.refresh_in())
                    except asyncio.TimeoutError:
                        pass
                    except asyncio.CancelledError:
                        forget = common.forget_command(resource, plan.token)
                        await asyncio.shield(self._forget(resource, forget))
                        raise
                    # Told on its own channel: held from the message on, claimed by the renewer.
                    if watch.granted is not None:
                        started_state = plan.started_lease(
                            resource, watch.granted, self.metrics, request.mode
                        )
                        if started_state is not None:
                            await self._listen(started_state)
                            return started_state
                elif answer == "nil":
                    if plan.gives_up(waited=wait_ms is not None):
                        raise NotAcquired(resource, request.timeout)
                    pause = plan.wait_again_in(waited=wait_ms is not None)
                    if pause > 0:
                        await asyncio.sleep(pause)
        finally:
            if watch is not None and channels is not None:
                await channels.leave(watch)  # where it joined, wherever the resource is now

    async def _acquire_all(self, request: SetRequest) -> SetState:
        self.metrics.acquire_attempt()
        started = time.monotonic()
        plan = common.AcquirePlan(
            request.ttl, request.timeout, request.max_hold, self.request_timeout, request.ticket()
        )
        try:
            state = await self._try_acquire_all(request, plan)
        except BaseException as error:
            self.metrics.acquire_failed(common.acquire_failure(error, plan))
            raise
        self.metrics.acquired(state.name, state.token, state.fence_name, time.monotonic() - started)
        return state

    async def _try_acquire_all(self, request: SetRequest, plan: common.AcquirePlan) -> SetState:
        """``ACQUIREALL`` until it answers fences, waiting in every member's line (see
        :meth:`dlock.Locks._try_acquire_all`)."""
        resources = request.resources
        first = resources[0]
        forget = common.forget_set_command(resources, plan.token)
        woken = asyncio.Event()
        watches: list[tuple[Channels, Watch]] = []
        try:
            while True:
                if plan.queued and plan.left() <= 0:
                    await self._withdraw(first, forget)
                    raise NotAcquired(request.name, request.timeout)
                woken.clear()  # a message from now on means: send again
                sent = time.monotonic()
                try:
                    command, queue_ms = plan.next_set_command(request)
                    if queue_ms is not None:
                        serving = [await self._nodes.channels(resource) for resource in resources]
                        if [channels for channels, _ in watches] != serving:
                            # Subscribed to every member's channel before the first ticket, and
                            # again where a failover or a migration moved the set.
                            for channels, watch in watches:
                                await channels.leave(watch)
                            watches = []
                            for channels, resource in zip(serving, resources):
                                watch = await channels.join(resource, event=woken)
                                watches.append((channels, watch))
                            sent = time.monotonic()
                        plan.queued = True
                        async with (await self._nodes.for_resource(first)).ticket_requests:
                            reply = await self._call(first, command, self.request_timeout)
                    else:
                        reply = await self._call(first, command, self.request_timeout)
                    fences = common.as_fences(reply, len(resources))
                except asyncio.CancelledError:
                    # The caller gave up: a grant (or tickets) under our token may exist.
                    await asyncio.shield(self._forget(first, forget))
                    raise
                except Exception as error:
                    if plan.retry_after(error):
                        await asyncio.sleep(plan.retry_pause())
                        continue
                    if plan.reached_server:
                        await self._forget(first, forget)
                    raise
                answer = plan.answered(None if fences is None else fences[0], waited=False)
                if answer == "granted":
                    assert fences is not None
                    state = plan.set_lease(resources, fences, sent, self.metrics)
                    # Before the tickets' watches leave: the channels stay subscribed.
                    await self._listen(state)
                    return state
                if queue_ms is None:
                    raise NotAcquired(request.name, request.timeout)
                # In line: until a message on a member's channel, or the ticket's refresh.
                try:
                    await asyncio.wait_for(woken.wait(), plan.refresh_in())
                except asyncio.TimeoutError:
                    pass
                except asyncio.CancelledError:
                    await asyncio.shield(self._forget(first, forget))
                    raise
        finally:
            for channels, watch in watches:
                await channels.leave(watch)

    async def _listen(self, state: LeaseState) -> None:
        """Listens on the channel of each of the lease's resources for its revocation, without
        waiting for the subscription (see :meth:`dlock.Locks._listen`)."""
        listening: list[tuple[Channels, Watch]] = []
        for resource, fence in state.members:
            try:
                channels = await self._nodes.channels(resource)
            except common.FAILURES as error:  # no node known for the slot: renewals watch it
                log.debug("dlock: cannot listen on the channel of %s: %s", resource, error)
                continue
            listening.append((channels, channels.hold(resource, fence, state.revoked)))
        self._listening[state] = listening

    async def _unlisten(self, state: LeaseState) -> None:
        """Leaves the channels the lease listened on (unsubscribed if nobody else needs them)."""
        for channels, watch in self._listening.pop(state, []):
            await channels.leave(watch)

    async def _keep_listening(self, state: LeaseState) -> None:
        """After a renewal: listens where the resources are served now (see
        :meth:`dlock.Locks._keep_listening`)."""
        listening = self._listening.get(state)
        try:
            serving = [await self._nodes.channels(resource) for resource, _ in state.members]
        except common.FAILURES:
            return
        if listening is not None and [channels for channels, _ in listening] != serving:
            await self._unlisten(state)
            await self._listen(state)

    async def _withdraw(self, resource: str, command: list[Arg]) -> None:
        """At the caller's deadline: the tickets taken out of line, or whatever they were
        granted meanwhile released (see :meth:`dlock.Locks._withdraw`)."""
        try:
            async with (await self._nodes.for_resource(resource)).ticket_requests:
                await self._call(resource, command, self.release_timeout)
        except common.FAILURES as error:
            log.debug("dlock: could not withdraw a ticket on %s: %s", resource, error)
            await self._forget(resource, command)

    async def _forget(self, resource: str, command: list[Arg]) -> None:
        """See :meth:`dlock.Locks._forget`: the attempt's token (a grant, or tickets that may
        stand) released by ``command`` from a connection opened for it, once more after a
        short pause if the first found nothing."""
        for attempt in range(2):
            if attempt:
                await asyncio.sleep(common.FORGET_AGAIN_AFTER)
            try:
                released = common.as_int(
                    await self._call(resource, command, self.release_timeout, alone=True)
                )
            except common.FAILURES as error:
                log.debug("dlock: could not release an unknown grant on %s: %s", resource, error)
                return
            if released:
                log.debug("dlock: released a grant on %s the acquire never learned", resource)
                return

    async def _renew(self, state: LeaseState, ttl_ms: int) -> bool | None:
        sent = time.monotonic()
        try:
            command = state.renew_command(await self.features(state.resource), ttl_ms)
            renewed = common.as_int(
                await self._call(
                    state.resource, command, state.renew_timeout(sent, self.request_timeout)
                )
            )
        except common.FAILURES as error:
            # Not a refusal: tried again soon, on the node that serves the resource by then,
            # until the local expiry (see dlock.Locks._renew).
            log.debug("dlock: renewal of %s failed: %s", state.resource, error)
            state.renewal_failed(refused=False)
            return None
        if renewed == 1:
            state.renewed(sent, ttl_ms)
            await self._keep_listening(state)
            return True
        state.renewal_failed(refused=True)
        return False

    async def _finish(self, state: LeaseState) -> None:
        """Releases the lease when its block exits, bounded by ``release_timeout``. Never
        raises. A RELEASE whose outcome is unknown for a lease still believed live is a release
        failure (logged and counted); one that finds the lease gone is the loss ``ended``; after
        a loss already reported (a local expiry the renewer did not get to is one) the RELEASE
        is best effort, neither, whatever it answers. A revoked lease is not released: the
        server ended it (a set whose member was revoked is: its other members, best effort)."""
        if state.reason == "revoked" and len(state.members) == 1:
            self.metrics.ended(
                state.name, state.token, state.fence_name, time.monotonic() - state.granted_at
            )
            return
        live = not state.expire()
        outcome: bool | None = None
        try:
            command = state.release_command(await self.features(state.resource))
            released = common.as_int(
                await self._call(state.resource, command, self.release_timeout)
            )
            # A set: every member released, else one ended before the block did.
            outcome = released == len(state.members)
            if not outcome:
                # Gone before the block ended: the end of the work was not protected.
                state.lose("ended")
        except Exception as error:  # never raised over the body's own outcome
            log.debug("dlock: release of %s failed: %s", state.resource, error)
            if time.monotonic() >= state.due_expiry():
                state.lose("unreachable")
        held = time.monotonic() - state.granted_at
        if live:
            self.metrics.released(state.name, state.token, state.fence_name, held, outcome)
        else:
            self.metrics.ended(state.name, state.token, state.fence_name, held)


class _Renewer:
    """One task per :class:`Locks` renews every held lease when due; it ends when no lease is
    held and starts again with the next one."""

    def __init__(self, locks: Locks) -> None:
        self._locks = locks
        self._leases: set[LeaseState] = set()
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    def add(self, state: LeaseState) -> None:
        self._leases.add(state)
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run(), name="dlock-renewer")
        elif self._wake is not None:
            self._wake.set()

    def remove(self, state: LeaseState) -> None:
        self._leases.discard(state)
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        while self._leases:
            state = min(self._leases, key=LeaseState.due)
            delay = state.due() - time.monotonic()
            if delay > 0:
                wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    # Every held lease lost: sleep until one is added or removed.
                    await asyncio.wait_for(wake.wait(), None if delay == float("inf") else delay)
                continue
            try:
                await self._renew(state)
            except Exception:  # never let the task die: leases would go unrenewed
                log.exception("dlock: renewal of %s failed unexpectedly", state.name)
                state.renewal_failed(refused=False)

    async def _renew(self, state: LeaseState) -> None:
        action = state.step(time.monotonic())
        if isinstance(action, str):
            state.lose(action)
        elif action is not None:
            refused = await self._locks._renew(state, action) is False
            # A RENEW in flight when the block exited may be refused: not a loss.
            if refused and state in self._leases:
                state.lose("renewal_refused")
