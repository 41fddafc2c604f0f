"""The resources' channels for the asyncio client (see ``dlock._channels``): one pub/sub
connection per server and ``Locks``, shared by every ticket waiter, observer and holder, read by
one task on the ``Locks``' event loop."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Callable

import redis
import redis.asyncio
import redis.asyncio.client

from ._channels import POLL, RECONNECT_PAUSE, BaseWatch, revocations
from ._metrics import log
from ._protocol import _text, channel_name


class Watch(BaseWatch[asyncio.Event]):
    """A :class:`dlock._channels.BaseWatch` whose ``event`` is an ``asyncio.Event`` (of the
    ``Locks``' event loop)."""

    def _new_event(self) -> asyncio.Event:
        return asyncio.Event()


class Channels:
    """The pub/sub connection to one server and the task that reads it, which runs while
    anyone watches a channel. For one event loop."""

    def __init__(
        self, connection_class: Any, settings: dict[str, Any], sharded: bool, timeout: float
    ) -> None:
        self._pool = redis.asyncio.ConnectionPool(connection_class=connection_class, **settings)
        self._sharded = sharded
        self._timeout = timeout
        self._watches: dict[str, set[Watch]] = {}
        self._ready: dict[str, asyncio.Event] = {}
        self._pubsub: Any = None
        self._task: asyncio.Task[None] | None = None
        # Subscriptions of holders, sent by tasks of their own (kept here until done).
        self._subscribing: set[asyncio.Task[None]] = set()
        # Held while the connection is made or subscriptions change.
        self._lock = asyncio.Lock()

    async def join(
        self,
        resource: str,
        tag: str | None = None,
        event: asyncio.Event | None = None,
        channel: str | None = None,
    ) -> Watch:
        """Registers a watch on ``resource``'s channel (a ticket waiter's: with its token's
        ``tag``; ``event``: one shared with other watches, else its own; ``channel``: another
        channel than the resource's, a ticket's own); returns once the server confirmed the
        subscription (or the request timeout passed)."""
        channel = channel or channel_name(resource)
        watch = Watch(channel, tag, event=event)
        watchers = self._watches.setdefault(channel, set())
        watchers.add(watch)
        ready = self._ready.setdefault(channel, asyncio.Event())
        if len(watchers) == 1:
            # The lock first: a connection being made may have read its list of channels
            # before this one came, and is known only once made.
            async with self._lock:
                if self._pubsub is not None:
                    try:
                        await self._subscribe(self._pubsub, [channel])
                    except Exception as error:  # a broken or closing connection: made again
                        log.debug("dlock: subscribing to %s failed: %s", channel, error)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="dlock-channels")
        try:
            await asyncio.wait_for(ready.wait(), self._timeout)
        except asyncio.TimeoutError:
            pass  # the watcher's own refreshes cover it
        except BaseException:  # cancelled: nobody will leave for this watch
            await self.leave(watch)
            raise
        # From here its first ACQUIRE may go before the subscription is confirmed.
        watch.joined = True
        return watch

    def hold(self, resource: str, fence: int, on_revoked: Callable[[str], None]) -> Watch:
        """Registers the holder of the lease of ``fence`` on ``resource``'s channel and returns
        at once: the subscription is sent by a task of its own, its confirmation not awaited.
        ``on_revoked`` is called, on the reading task, with the operator's reason when the
        channel says the lease was revoked."""
        channel = channel_name(resource)
        watch = Watch(channel, fence=fence, on_revoked=on_revoked)
        watch.joined = True
        watchers = self._watches.setdefault(channel, set())
        watchers.add(watch)
        self._ready.setdefault(channel, asyncio.Event())
        loop = asyncio.get_running_loop()
        if len(watchers) == 1:
            # Even while no connection is made: one that is being made may have read its list
            # of channels before this one came.
            task = loop.create_task(self._subscribe_soon(channel), name="dlock-subscribe")
            self._subscribing.add(task)
            task.add_done_callback(self._subscribing.discard)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="dlock-channels")
        return watch

    async def _subscribe_soon(self, channel: str) -> None:
        async with self._lock:
            pubsub = self._pubsub
            if pubsub is None or channel not in self._watches:
                return  # the next connection subscribes to every watched channel
            try:
                await self._subscribe(pubsub, [channel])
            except Exception as error:  # a broken or closing connection: it is made again
                log.debug("dlock: subscribing to %s failed: %s", channel, error)

    async def leave(self, watch: Watch) -> None:
        watchers = self._watches.get(watch.channel)
        if watchers is None:
            return
        watchers.discard(watch)
        if watchers:
            return
        del self._watches[watch.channel]
        del self._ready[watch.channel]
        if self._pubsub is not None:
            async with self._lock:
                try:
                    if self._sharded:
                        await self._pubsub.sunsubscribe(watch.channel)
                    else:
                        await self._pubsub.unsubscribe(watch.channel)
                except Exception as error:  # a broken or closing connection: it is made again
                    log.debug("dlock: unsubscribing from %s failed: %s", watch.channel, error)

    def subscribed(self) -> int:
        return len(self._watches)

    async def close(self) -> None:
        for subscribing in list(self._subscribing):
            subscribing.cancel()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            await self._close(pubsub)
        await self._pool.disconnect()

    async def _subscribe(self, pubsub: Any, channels: list[str]) -> None:
        if self._sharded:
            await pubsub.ssubscribe(*channels)
        else:
            await pubsub.subscribe(*channels)

    async def _close(self, pubsub: Any) -> None:
        try:
            await pubsub.aclose() if hasattr(pubsub, "aclose") else await pubsub.close()
        except Exception as error:  # already broken
            log.debug("dlock: closing the pub/sub connection: %s", error)

    def _wake(
        self, channel: str | None, payload: str | None = None, joined_only: bool = False
    ) -> None:
        """Wakes the watchers of ``channel`` (``None``: of every channel) that ``payload``
        concerns (``None``: all of them)."""
        groups = self._watches.values() if channel is None else [self._watches.get(channel, ())]
        for watchers in groups:
            for watch in watchers:
                if watch.fence is not None:
                    continue  # a holder: told of its revocation only
                if (watch.joined or not joined_only) and watch.heard(payload):
                    watch.event.set()

    async def _run(self) -> None:
        while True:
            await self._serve()
            pubsub, self._pubsub = self._pubsub, None
            if pubsub is not None:
                await self._close(pubsub)
            if not self._watches:
                return  # else someone joined while it closed: serve them

    async def _serve(self) -> None:
        while self._watches:
            pubsub = self._pubsub
            try:
                if pubsub is None:
                    async with self._lock:
                        pubsub = redis.asyncio.client.PubSub(self._pool)
                        await self._subscribe(pubsub, list(self._watches))
                        self._pubsub = pubsub
                message = await pubsub.get_message(timeout=POLL)
            except Exception as error:  # never let the task die: waiters would go unwoken
                log.debug("dlock: the pub/sub connection failed: %s", error)
                if self._pubsub is pubsub:
                    self._pubsub = None
                for ready in self._ready.values():
                    ready.clear()
                self._wake(None)
                if pubsub is not None:
                    await self._close(pubsub)
                await asyncio.sleep(RECONNECT_PAUSE)
                continue
            if message is not None:
                self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = _text(message.get("type"))
        channel = _text(message.get("channel"))
        if channel is None:
            return
        if kind in ("subscribe", "ssubscribe"):
            ready = self._ready.get(channel)
            first = ready is not None and not ready.is_set()
            if ready is not None:
                ready.set()
            # A (re)subscription: messages may have been missed. On the first, only the
            # watches whose first ACQUIRE went before it (their join stopped waiting).
            self._wake(channel, joined_only=first)
        elif kind in ("message", "smessage"):
            payload = _text(message.get("data"))
            self._wake(channel, payload)
            for on_revoked, reason in revocations(self._watches.get(channel, ()), payload):
                on_revoked(reason)
