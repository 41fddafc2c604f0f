"""The resources' channels for the threaded client: one pub/sub connection per server and
``Locks``, shared by every ticket waiter, observer and holder, read by one thread.

The server publishes every change of ownership of a resource (``acquired``, ``handoff``,
``released``, ``expired`` with a fence; ``handoff`` also with the tag of the new holder's token,
see ``token_tag``) on ``dlock:{resource}`` (see ``channel_name``); in a Cluster on the shard
channel (``SSUBSCRIBE`` on the key's node). A ticket waiter wakes only on a hand-over to its own
token (or an untagged one, from an older server); an observer on every message. A message only
wakes: whoever waits re-sends its ACQUIRE (or re-reads ``DLOCK.INFO``), so a lost message costs
one refresh interval, never a grant.

A holder listens on its resource's channel while it holds the lease (``hold``, which does not
wait for the subscription): ``revoked <fence> <reason>`` (``DLOCK.REVOKE``) with its lease's
fence tells it at once; one that came before the subscription is caught by the next renewal."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any, Callable, Generic, Protocol, TypeVar

import redis
import redis.client

from ._metrics import log
from ._protocol import Granted, _text, channel_name, granted, revoked, wakes

# Pause before the pub/sub connection is made again after it failed.
RECONNECT_PAUSE = 0.2

# How long the reading thread waits for a message before it looks at its registrations again.
POLL = 1.0


EventT = TypeVar("EventT")


class BaseWatch(Generic[EventT]):
    """One waiter's (or observer's) registration on a resource's channel: ``event`` is set on
    every message that concerns it (for an observer every message; for a ticket waiter, with
    ``tag``, a hand-over to its token), and on every (re)subscription (messages may have been
    missed). A holder's (with ``fence``) is never woken: ``on_revoked`` is called with the
    operator's reason when its lease is revoked. A set waiting in line watches each member's
    channel with one ``event`` shared by its watches. The threaded and the asyncio clients
    differ only in the kind of ``event``."""

    def __init__(
        self,
        channel: str,
        tag: str | None = None,
        fence: int | None = None,
        on_revoked: Callable[[str], None] | None = None,
        event: EventT | None = None,
    ) -> None:
        self.channel = channel
        # A ticket waiter's token's tag: woken by a hand-over to it only (see ``wakes``).
        self.tag = tag
        # A holder's lease's fence, and what its revocation calls.
        self.fence = fence
        self.on_revoked = on_revoked
        # Whether ``join`` returned (a watch still in it sends its first ACQUIRE after the
        # subscription is confirmed, and needs no wake for it).
        self.joined = False
        self.event: EventT = self._new_event() if event is None else event
        # On a ticket's own channel: the last ``granted`` message heard.
        self.granted: Granted | None = None

    def heard(self, payload: str | None) -> bool:
        """Keeps what ``payload`` tells this watch (a ``granted`` message on a ticket's own
        channel: its lease) and says whether it wakes it."""
        message = None if payload is None else granted(payload)
        if message is not None:
            self.granted = message
        return wakes(payload, self.tag)

    def _new_event(self) -> EventT:
        raise NotImplementedError


class Watch(BaseWatch[threading.Event]):
    """A :class:`BaseWatch` whose ``event`` is a ``threading.Event``."""

    def _new_event(self) -> threading.Event:
        return threading.Event()


class Channels:
    """The pub/sub connection to one server, and its reading thread, which runs while anyone
    watches a channel. Thread-safe."""

    def __init__(
        self, connection_class: Any, settings: dict[str, Any], sharded: bool, timeout: float
    ) -> None:
        self._pool = redis.ConnectionPool(connection_class=connection_class, **settings)
        self._sharded = sharded
        self._timeout = timeout
        self._lock = threading.Lock()
        self._watches: dict[str, set[Watch]] = {}
        # Per channel: set once the current connection confirmed its subscription.
        self._ready: dict[str, threading.Event] = {}
        self._pubsub: Any = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def join(
        self,
        resource: str,
        tag: str | None = None,
        event: threading.Event | None = None,
        channel: str | None = None,
    ) -> Watch:
        """Registers a watch on ``resource``'s channel (a ticket waiter's: with its token's
        ``tag``; ``event``: one shared with other watches, else its own; ``channel``: another
        channel than the resource's, a ticket's own) and returns once the server confirmed the
        subscription (or the request timeout passed: the watcher's own refreshes cover that)."""
        watch = Watch(channel or channel_name(resource), tag, event=event)
        ready = self._register(watch)
        try:
            ready.wait(self._timeout)
        except BaseException:  # interrupted: nobody will leave for this watch
            self.leave(watch)
            raise
        # From here its first ACQUIRE may go before the subscription is confirmed.
        watch.joined = True
        return watch

    def hold(self, resource: str, fence: int, on_revoked: Callable[[str], None]) -> Watch:
        """Registers the holder of the lease of ``fence`` on ``resource``'s channel and returns
        at once (the subscription is sent, its confirmation not awaited): ``on_revoked`` is
        called, on the reading thread, with the operator's reason when the channel says the
        lease was revoked."""
        watch = Watch(channel_name(resource), fence=fence, on_revoked=on_revoked)
        self._register(watch)
        watch.joined = True
        return watch

    def _register(self, watch: Watch) -> threading.Event:
        """Adds ``watch`` to its channel, subscribing to the channel if it is the first one, and
        starts the reading thread if none runs; the channel's confirmation event."""
        channel = watch.channel
        with self._lock:
            watchers = self._watches.setdefault(channel, set())
            watchers.add(watch)
            ready = self._ready.setdefault(channel, threading.Event())
            if len(watchers) == 1 and self._pubsub is not None:
                try:
                    self._subscribe(self._pubsub, [channel])
                except Exception as error:  # a broken or closing connection: it is made again
                    # The reading thread finds the connection broken and makes a new one.
                    log.debug("dlock: subscribing to %s failed: %s", channel, error)
            if self._thread is None:
                self._closed = False
                self._thread = threading.Thread(
                    target=self._run, name="dlock-channels", daemon=True
                )
                self._thread.start()
        return ready

    def leave(self, watch: Watch) -> None:
        with self._lock:
            watchers = self._watches.get(watch.channel)
            if watchers is None:
                return
            watchers.discard(watch)
            if watchers:
                return
            del self._watches[watch.channel]
            del self._ready[watch.channel]
            if self._pubsub is not None:
                try:
                    if self._sharded:
                        self._pubsub.sunsubscribe(watch.channel)
                    else:
                        self._pubsub.unsubscribe(watch.channel)
                except Exception as error:  # a broken or closing connection: it is made again
                    log.debug("dlock: unsubscribing from %s failed: %s", watch.channel, error)

    def subscribed(self) -> int:
        """How many channels are watched (for tests and metrics)."""
        with self._lock:
            return len(self._watches)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            self._close(pubsub)
        self._pool.disconnect()

    def _subscribe(self, pubsub: Any, channels: list[str]) -> None:
        if self._sharded:
            pubsub.ssubscribe(*channels)
        else:
            pubsub.subscribe(*channels)

    def _close(self, pubsub: Any) -> None:
        try:
            pubsub.close()
        except Exception as error:  # already broken
            log.debug("dlock: closing the pub/sub connection: %s", error)

    def _connect(self) -> Any:
        """A new pub/sub connection, subscribed to every watched channel (lock held)."""
        pubsub = redis.client.PubSub(self._pool)
        channels = list(self._watches)
        if channels:
            self._subscribe(pubsub, channels)
        return pubsub

    def _wake(
        self, channel: str | None, payload: str | None = None, joined_only: bool = False
    ) -> None:
        """Wakes the watchers of ``channel`` (``None``: of every channel) that ``payload``
        concerns (``None``: all of them). Lock held."""
        groups = self._watches.values() if channel is None else [self._watches.get(channel, ())]
        for watchers in groups:
            for watch in watchers:
                if watch.fence is not None:
                    continue  # a holder: told of its revocation only
                if (watch.joined or not joined_only) and watch.heard(payload):
                    watch.event.set()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._watches or self._closed:
                    self._thread = None
                    pubsub, self._pubsub = self._pubsub, None
                    if pubsub is not None:
                        self._close(pubsub)
                    return
                try:
                    if self._pubsub is None:
                        self._pubsub = self._connect()
                    pubsub = self._pubsub
                except Exception as error:  # a broken or closing connection: it is made again
                    log.debug("dlock: the pub/sub connection failed: %s", error)
                    pubsub = None
            try:
                if pubsub is None:
                    raise redis.ConnectionError("dlock: no pub/sub connection")
                message = pubsub.get_message(timeout=POLL)
            except Exception as error:  # never let the thread die: waiters would go unwoken
                log.debug("dlock: the pub/sub connection failed: %s", error)
                with self._lock:
                    if self._pubsub is pubsub:
                        self._pubsub = None
                    for ready in self._ready.values():
                        ready.clear()
                    self._wake(None)
                if pubsub is not None:
                    self._close(pubsub)
                time.sleep(RECONNECT_PAUSE)
                continue
            if message is not None:
                self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = _text(message.get("type"))
        channel = _text(message.get("channel"))
        if channel is None:
            return
        told: list[tuple[Callable[[str], None], str]] = []
        with self._lock:
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
                told = revocations(self._watches.get(channel, ()), payload)
        # Outside the lock: a loss runs the lease's callbacks.
        for on_revoked, reason in told:
            on_revoked(reason)


class Listener(Protocol):
    """What :func:`revocations` reads of a watch (the threaded and the asyncio ones)."""

    fence: int | None
    on_revoked: Callable[[str], None] | None


def revocations(
    watchers: Iterable[Listener], payload: str | None
) -> list[tuple[Callable[[str], None], str]]:
    """What to tell which holders among ``watchers`` if ``payload`` is a ``revoked`` message:
    the callback of each holder of the revoked fence, and the operator's reason."""
    said = revoked(payload) if payload is not None else None
    if said is None:
        return []
    fence, reason = said
    return [
        (watch.on_revoked, reason)
        for watch in watchers
        if watch.fence == fence and watch.on_revoked is not None
    ]
