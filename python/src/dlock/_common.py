"""What the threaded and the asyncio clients share: server features, the commands as sent, the
lease's state and its renewal schedule. No I/O here."""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar, Union

import redis

from . import _protocol as protocol
from ._errors import LeaseLost, NotAcquired, Unsupported
from ._metrics import Metrics
from ._protocol import (
    MAX_PERMITS,
    Arg,
    Leader,
    _text,
    channel_name,
    leader_from_info,
    token_tag,
    wakes,
)

__all__ = ["MAX_PERMITS", "Leader", "channel_name", "leader_from_info", "token_tag", "wakes"]

Meta = Union[str, bytes]

# Options of the second version of the commands; each is sent only to a server that advertises it.
OPTION_TOKENS = protocol.OPTIONS

# How long one server-side wait lasts at most when the caller waits without limit: each is one
# WAIT with the same token, so a lost reply costs nothing but a retry (between two of them the
# waiter leaves the queue for a round trip).
UNLIMITED_WAIT_SLICE = 3600.0

# How a Locks waits for a held lock: "block" (one ACQUIRE … WAIT on a connection of its own per
# waiter) or "tickets" (ACQUIRE … QUEUE on the pooled connections, woken by the resource's channel).
WAIT_MODES = ("block", "tickets")

# At most this many ticket ACQUIREs of one Locks are in flight at once (per server), so that many
# waiters woken by one message share a handful of pooled connections.
TICKET_REQUESTS = 4

# A WAIT that answered nil earlier than this before the caller's deadline was cut short, not timed
# out: a newer wait by the same token, CLIENT UNBLOCK, the key migrated to another node (MIGRATE
# answers its waiters nil), deleted, renamed or swapped away, a demoted primary whose copy of the
# holder's lease ran out. The caller waits again, with the same token, for what is left, on the node
# that serves the resource by then, after WAIT_AGAIN_PAUSE: a server that keeps ending the wait at
# once costs one request per 10 ms until the deadline, not a busy loop.
CUT_SHORT = 0.05
WAIT_AGAIN_PAUSE = 0.01


def check_wait(wait: str, ticket_ttl: float) -> None:
    """A ``Locks``' waiting options, checked when it is made."""
    if wait not in WAIT_MODES:
        raise ValueError(f"dlock: wait must be one of {WAIT_MODES}, not {wait!r}")
    if ticket_ttl <= 0:
        raise ValueError("dlock: ticket_ttl must be positive")


def new_token() -> str:
    """A fresh owner token: 128 random bits, made before the first send and kept for retries."""
    return secrets.token_hex(16)


def millis(seconds: float) -> int:
    """A duration as the server is told it: whole milliseconds, at least 1 (rounded down, so a
    lease is never longer than asked)."""
    return max(1, int(seconds * 1000))


def millis_up(seconds: float) -> int:
    """A wait as the server is told it: whole milliseconds rounded up, at least 1."""
    return max(1, math.ceil(seconds * 1000))


def _tokens_in(doc: object, found: set[str]) -> None:
    """Collects every argument ``token`` (keyword) anywhere in a COMMAND DOCS entry, in RESP2
    (flat name/value lists) or RESP3 (maps) form."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if _text(key) == "token":
                word = _text(value)
                if word is not None:
                    found.add(word.upper())
            else:
                _tokens_in(value, found)
    elif isinstance(doc, (list, tuple)):
        items = list(doc)
        for index, item in enumerate(items):
            if _text(item) == "token" and index + 1 < len(items):
                word = _text(items[index + 1])
                if word is not None:
                    found.add(word.upper())
            else:
                _tokens_in(item, found)


@dataclass(frozen=True)
class Features:
    """The options of the dlock commands this server advertises (``COMMAND DOCS``)."""

    acquire: frozenset[str] = frozenset()
    renew: frozenset[str] = frozenset()
    release: frozenset[str] = frozenset()

    @classmethod
    def from_docs(cls, reply: object) -> Features:
        """Reads ``COMMAND DOCS DLOCK.ACQUIRE DLOCK.RENEW DLOCK.RELEASE``'s reply."""
        entries: dict[str, object] = {}
        if isinstance(reply, dict):
            for name, doc in reply.items():
                entries[(_text(name) or "").lower()] = doc
        elif isinstance(reply, (list, tuple)):
            items = list(reply)
            for index in range(0, len(items) - 1, 2):
                entries[(_text(items[index]) or "").lower()] = items[index + 1]

        def tokens(name: str) -> frozenset[str]:
            found: set[str] = set()
            _tokens_in(entries.get(name), found)
            return frozenset(found & set(OPTION_TOKENS))

        return cls(
            acquire=tokens("dlock.acquire"),
            renew=tokens("dlock.renew"),
            release=tokens("dlock.release"),
        )


@dataclass(frozen=True)
class Mode:
    """The kind of lease an acquire asks for: exclusive (a lock, or a writer of a read-write
    lock), shared without a limit (a reader) or shared with ``limit`` permits (a semaphore)."""

    shared: bool = False
    limit: int | None = None

    @property
    def name(self) -> str:
        """As ``DLOCK.INFO`` shows it: ``exclusive`` or ``shared``."""
        return "shared" if self.shared else "exclusive"

    def keywords(self) -> tuple[str, ...]:
        """The ACQUIRE options this mode needs the server to have."""
        if not self.shared:
            return ()
        return ("SHARED",) if self.limit is None else ("SHARED", "LIMIT")


EXCLUSIVE = Mode()
SHARED = Mode(shared=True)


def semaphore_mode(permits: int) -> Mode:
    """The mode of a semaphore with ``permits`` permits, checked before anything is sent."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise ValueError(f"dlock: permits must be an integer, not {permits!r}")
    if not 1 <= permits <= MAX_PERMITS:
        raise ValueError(f"dlock: permits must be from 1 to {MAX_PERMITS}, not {permits}")
    return Mode(shared=True, limit=permits)


@dataclass(frozen=True)
class Request:
    """What one ``with`` block asks for, checked when it is made (before anything is sent)."""

    resource: str
    ttl: float
    timeout: float | None
    meta: Meta | None
    max_hold: float | None
    mode: Mode = EXCLUSIVE

    def __post_init__(self) -> None:
        check_hold(self.ttl, self.timeout, self.max_hold)


def check_hold(ttl: float, timeout: float | None, max_hold: float | None) -> None:
    """The options of a block (``hold`` and the others, ``hold_all``), checked before anything
    is sent."""
    if ttl <= 0:
        raise ValueError("dlock: ttl must be positive")
    if timeout is not None and timeout < 0:
        raise ValueError("dlock: timeout must be 0 or more, or None")
    if max_hold is not None and max_hold <= 0:
        raise ValueError("dlock: max_hold must be positive")


# A set's ticket (``QUEUE ticket-ms``) lives as long as its wait, within these bounds (seconds).
SET_TICKET_MIN = 1.0
SET_TICKET_MAX = 30.0


@dataclass(frozen=True)
class SetRequest:
    """What one ``hold_all`` block asks for, checked when it is made (before anything is sent):
    1 to 64 resources, each once, in the caller's order."""

    resources: tuple[str, ...]
    ttl: float
    timeout: float | None
    meta: Meta | None
    max_hold: float | None

    def __post_init__(self) -> None:
        if not 1 <= len(self.resources) <= protocol.MAX_SET:
            raise ValueError(
                f"dlock: a set has 1 to {protocol.MAX_SET} resources, not {len(self.resources)}"
            )
        for resource in self.resources:
            if not isinstance(resource, str):
                raise TypeError(f"dlock: a resource is a str, not {resource!r}")
        seen: set[str] = set()
        for resource in self.resources:
            if resource in seen:
                raise ValueError(f"dlock: resource {resource!r} appears twice in the set")
            seen.add(resource)
        check_hold(self.ttl, self.timeout, self.max_hold)

    @property
    def name(self) -> str:
        """The set as log lines and errors name it: its members, comma-separated."""
        return ",".join(self.resources)

    def ticket(self) -> float | None:
        """The life of the set's ticket (seconds): its wait, from 1 s to 30 s; ``None`` without
        a wait (one ACQUIREALL, no place in line)."""
        if self.timeout == 0:
            return None
        wait = SET_TICKET_MAX if self.timeout is None else self.timeout
        return min(SET_TICKET_MAX, max(SET_TICKET_MIN, wait))


HoldT = TypeVar("HoldT")
SetHoldT = TypeVar("SetHoldT")


class Handles(Generic[HoldT, SetHoldT]):
    """The context managers both clients' ``Locks`` make (``with`` in :class:`dlock.Locks`,
    ``async with`` in :class:`dlock.asyncio.Locks`). Each yields a ``Lease`` (a ``SetLease`` for
    :meth:`hold_all`) with the same lifecycle: acquired on entry, renewed while the block runs,
    released when it exits."""

    def _hold(self, request: Request) -> HoldT:
        raise NotImplementedError

    def _hold_all(self, request: SetRequest) -> SetHoldT:
        raise NotImplementedError

    def hold_all(
        self,
        resources: Sequence[str],
        *,
        ttl: float = 30.0,
        timeout: float | None = 10.0,
        meta: Meta | None = None,
        max_hold: float | None = None,
    ) -> SetHoldT:
        """A context manager that acquires every one of ``resources`` (exclusive leases, one
        token, a fence each) or none of them (``DLOCK.ACQUIREALL``), keeps the set renewed while
        the block runs and releases it when the block exits. The set is one lease: the loss of
        any member (refused renewal, revocation, ...) is the loss of the whole set.

        ``resources``: 1 to 64 keys, each once (in Redis Cluster all in one slot: give them a
        common hash tag); the fences come in their order. ``timeout`` (seconds; ``0``: one try;
        ``None``: no limit): how long the set waits in the line of every member, holding
        nothing meanwhile, first come first served with single leases. Raises
        :class:`dlock.NotAcquired` when it passes first. ``ttl``, ``meta`` and ``max_hold`` as
        for :meth:`hold` (``meta`` is stored with every member)."""
        if isinstance(resources, (str, bytes)):
            raise TypeError("dlock: hold_all takes a list of resources, not one resource")
        return self._hold_all(SetRequest(tuple(resources), ttl, timeout, meta, max_hold))

    def hold(
        self,
        resource: str,
        *,
        ttl: float = 30.0,
        timeout: float | None = 10.0,
        meta: Meta | None = None,
        max_hold: float | None = None,
    ) -> HoldT:
        """A context manager that acquires ``resource`` (an exclusive lease) for ``ttl`` seconds,
        waiting in the server's queue at most ``timeout`` seconds (``0``: no wait; ``None``: no
        limit), keeps it renewed while the block runs and releases it when the block exits.

        Raises :class:`dlock.NotAcquired` when the timeout passes first. ``max_hold`` (seconds)
        bounds the whole hold: no renewal goes past it. ``meta`` describes the holder; it is
        sent to servers that support it (and left out for older ones)."""
        return self._hold(Request(resource, ttl, timeout, meta, max_hold))

    def write(
        self,
        resource: str,
        *,
        ttl: float = 30.0,
        timeout: float | None = 10.0,
        meta: Meta | None = None,
        max_hold: float | None = None,
    ) -> HoldT:
        """The writer's side of a read-write lock: an exclusive lease on ``resource``, the one
        :meth:`read` shares (the same as :meth:`hold`). It waits for the readers holding it to
        leave, and readers that come after it wait for it."""
        return self.hold(resource, ttl=ttl, timeout=timeout, meta=meta, max_hold=max_hold)

    def read(
        self,
        resource: str,
        *,
        ttl: float = 30.0,
        timeout: float | None = 10.0,
        meta: Meta | None = None,
        max_hold: float | None = None,
    ) -> HoldT:
        """The reader's side of a read-write lock: a shared lease on ``resource``
        (``DLOCK.ACQUIRE … SHARED``), held together with other readers, never with a writer.
        Every reader has its own token, fence and deadline. Raises :class:`dlock.Unsupported`
        on entry if the server has no shared leases. Options as for :meth:`hold`."""
        return self._hold(Request(resource, ttl, timeout, meta, max_hold, SHARED))

    def semaphore(
        self,
        name: str,
        permits: int,
        *,
        ttl: float = 30.0,
        timeout: float | None = 10.0,
        meta: Meta | None = None,
        max_hold: float | None = None,
    ) -> HoldT:
        """One permit of the counting semaphore ``name`` (a Redis key): a shared lease granted
        only while fewer than ``permits`` (1 to 1000000) live (``DLOCK.ACQUIRE … SHARED LIMIT
        permits``). Give every user of ``name`` the same ``permits``. Every permit has its own
        token, fence and deadline. Raises :class:`dlock.Unsupported` on entry if the server has
        no shared leases. Options as for :meth:`hold`."""
        mode = semaphore_mode(permits)
        return self._hold(Request(name, ttl, timeout, meta, max_hold, mode))

    def campaign(
        self,
        name: str,
        *,
        address: Meta,
        ttl: float = 10.0,
        timeout: float | None = None,
        max_hold: float | None = None,
    ) -> HoldT:
        """Leader election: waits until this candidate leads ``name`` (at most ``timeout``
        seconds; ``None``, the default: without limit), then holds the leadership while the
        block runs, as an exclusive lease whose ``META`` is ``address`` (what
        :meth:`observe` shows of the leader). ``lease.fence`` is the term's epoch: larger for
        every newer term; send it with the leader's writes. Leaving the block resigns; a
        leader that crashed is replaced once its ``ttl`` runs out."""
        return self._hold(Request(name, ttl, timeout, address, max_hold))


FEATURES_COMMAND: tuple[Arg, ...] = (
    "COMMAND",
    "DOCS",
    "DLOCK.ACQUIRE",
    "DLOCK.RENEW",
    "DLOCK.RELEASE",
)

# The commands as sent. Each version-2 option is added in exactly one place below, and only when
# the server advertises it.


def acquire_command(
    features: Features,
    resource: str,
    token: str,
    ttl_ms: int,
    wait_ms: int | None = None,
    claim_ms: int | None = None,
    meta: Meta | None = None,
    mode: Mode = EXCLUSIVE,
    queue_ms: int | None = None,
    notify: int | None = None,
) -> list[Arg]:
    """The ACQUIRE (``protocol.acquire_args``) with the options this server advertises."""
    if mode.shared:
        # No fallback: an exclusive lease instead of a shared one would be another lock.
        missing = [word for word in mode.keywords() if word not in features.acquire]
        if missing:
            raise Unsupported(resource, missing[0])
    return protocol.acquire_args(
        resource,
        token,
        ttl_ms,
        shared=mode.shared,
        limit=mode.limit,
        wait_ms=None if queue_ms is not None else wait_ms,
        queue_ms=queue_ms,
        claim_ms=claim_ms if "CLAIM" in features.acquire else None,
        meta=meta if "META" in features.acquire else None,
        notify=notify if "NOTIFY" in features.acquire else None,
    )


def renew_command(
    features: Features, resource: str, token: str, ttl_ms: int, fence: int
) -> list[Arg]:
    return protocol.renew_args(
        resource, token, ttl_ms, fence if "FENCE" in features.renew else None
    )


def release_command(features: Features, resource: str, token: str, fence: int) -> list[Arg]:
    return protocol.release_args(resource, token, fence if "FENCE" in features.release else None)


# What a failed request means: the class of the server's error reply (``protocol.class_of``,
# which reads redis-py's exception types and ``status_code``), or an error of this side.

# The caller's Cluster client knows no node for the resource's slot (its map is out of date, or a
# refresh of it reached no node): nothing was sent.
_NO_NODE: tuple[type[BaseException], ...] = tuple(
    getattr(redis.exceptions, name)
    for name in ("SlotNotCoveredError", "RedisClusterUnreachableError")
    if hasattr(redis.exceptions, name)
)

# Everything a request to a server can fail with: redis-py's errors, the Cluster client's own
# (``SlotNotCoveredError`` is not a ``RedisError``) and the socket's.
FAILURES: tuple[type[BaseException], ...] = (
    redis.RedisError,
    redis.exceptions.RedisClusterException,
    OSError,
)


def redirect(error: BaseException) -> tuple[str, str, int] | None:
    """Where a MOVED or ASK reply sends the request: ``("moved" or "ask", host, port)``, or
    ``None`` for any other error. The request was not run; it is sent again to the node named
    (after ``ASKING`` for an ASK, which holds for that one request only)."""
    if isinstance(error, redis.exceptions.MovedError):
        return ("moved", error.host, error.port)
    if isinstance(error, redis.exceptions.AskError):
        return ("ask", error.host, error.port)
    return None


# The error classes after which the server surely ran nothing (``protocol.error_class``): a
# redirect, a refusal for now (TRYAGAIN, LOADING, CLUSTERDOWN, MASTERDOWN), a demoted primary
# (READONLY). A wait the server ended (UNBLOCKED: its primary turned into a replica, or CLIENT
# UNBLOCK) is retried too, but may have been granted an instant before (the server undoes it).
RAN_NOTHING = ("redirect", "retry", "failover")
RETRIED = (*RAN_NOTHING, "unblocked")


def is_ambiguous(error: BaseException) -> bool:
    """An error that a retry with the same token may get past: the request may or may not have
    been carried out (a connection that failed, a timeout, a wait the server ended), or the server
    ran nothing for now (:data:`RAN_NOTHING`: a redirect, a slot in migration, a cluster
    that is down or failing over, a primary demoted to a replica, a server loading its data), or
    a Cluster client that knows no node for the slot yet. An ACQUIRE is retried until the
    caller's deadline, each time after a longer pause (:meth:`AcquirePlan.retry_pause`), with its
    token: it can never be granted twice."""
    if isinstance(error, (redis.AuthenticationError, redis.exceptions.AuthorizationError)):
        return False
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return True
    if protocol.class_of(error) in RETRIED or isinstance(error, _NO_NODE):
        return True
    # redis-py's own Cluster client gave up retrying (the base of ClusterDownError).
    return isinstance(error, redis.exceptions.ClusterError)


# A MOVED or ASK is followed to the node it names at most this many times per request (within
# the request's own timeout); then its error is retried like any ambiguous one.
MAX_REDIRECTS = 5

# At most one refresh of a Cluster client's slot map per this many seconds.
MAP_REFRESH_PAUSE = 0.1


def map_update(error: BaseException) -> str | None:
    """What a failure tells a Cluster client about its slot map: ``"moved"``, the slot has a new
    owner, the one the MOVED names (the map is updated with it); ``"stale"``, the map may be out
    of date (a failover or a migration in progress, a node that fails or answers no more, no node
    for the slot): a refresh is asked for; ``None`` for an ASK (the slot has not moved yet) and
    for any error that is the request's own."""
    found = redirect(error)
    if found is not None:
        return "moved" if found[0] == "moved" else None
    return "stale" if is_ambiguous(error) else None


def not_carried_out(error: BaseException) -> bool:
    """A failure after which the request surely did nothing in the server: a connection that was
    never made, nothing sent (no node for the slot), or a reply of a class in
    :data:`RAN_NOTHING`."""
    if protocol.class_of(error) in RAN_NOTHING or isinstance(error, _NO_NODE):
        return True
    cause = error.__cause__ or error.__context__
    return isinstance(cause, ConnectionRefusedError) or "Connection refused" in str(error)


def cross_slot(error: BaseException) -> redis.exceptions.ClusterCrossSlotError | None:
    """A fenced command refused because its keys are in more than one slot, as the error class
    ``cross_slot`` says it: redis-py's Cluster clients check a command's keys before sending it
    and raise their own ``RedisClusterException`` ("all keys must map to the same key slot")
    where a server would answer ``CROSSSLOT``; either way nothing ran."""
    if isinstance(error, redis.exceptions.RedisClusterException) and "same key slot" in str(error):
        return redis.exceptions.ClusterCrossSlotError(str(error))
    return None


def acquire_failure(error: BaseException, plan: AcquirePlan) -> str:
    """The ``acquire_failures`` reason of an acquire that raised ``error`` (the Rust client's
    names): ``held`` (:class:`dlock.NotAcquired`), ``unreachable`` (the retries ran out and no
    request can have reached a server: nothing was granted), ``unknown`` (a request may have
    been carried out, or the caller gave up with one out: the token was released), ``server``
    (the server refused the request, or any other error)."""
    if isinstance(error, NotAcquired):
        return "held"
    if is_ambiguous(error):
        return "unknown" if plan.reached_server else "unreachable"
    if not isinstance(error, Exception):  # interrupted: cancelled, KeyboardInterrupt
        return "unknown"
    return "server"


def as_int(reply: object) -> int | None:
    if reply is None:
        return None
    if isinstance(reply, int):
        return reply
    if isinstance(reply, (bytes, str)):
        return int(reply)
    raise redis.ResponseError(f"dlock: unexpected reply {reply!r}")


# A lease cut to end with max_hold ends up to this much before it (milliseconds round down).
MAX_HOLD_ROUNDING = 0.002

# Pause between retries of an acquire whose outcome was unknown: this long after the first
# failure, twice as long after each further one in a row, at most MAX_RETRY_PAUSE.
RETRY_PAUSE = 0.05
MAX_RETRY_PAUSE = 0.4

# After an acquire that failed on this side, the RELEASE of its token goes out once the failed
# connection is closed: what that connection carried reaches the server before its close, so the
# server has either granted (the RELEASE frees it) or drops the waiter with the connection. On
# another path (a proxy, a load balancer) the RELEASE may still overtake the ACQUIRE: if it found
# nothing, one more follows after this pause, and no more, so that a failed acquire returns in
# bounded time. A grant later still ends with its claim window (a hand-over) or its ttl.
FORGET_AGAIN_AFTER = 0.1


def forget_command(resource: str, token: str) -> list[Arg]:
    """The RELEASE of an attempt's token after its outcome stayed unknown or its wait ended:
    without ``FENCE`` (the fence is unknown); the token is that attempt's alone, so it frees no
    other grant. It also takes the token's ticket out of line, if one stands."""
    return protocol.release_args(resource, token, None)


def forget_set_command(resources: Sequence[str], token: str) -> list[Arg]:
    """The same for a set: ``RELEASEALL`` without ``FENCES``, which frees what the attempt's
    token holds of the set and takes its tickets out of every line."""
    return protocol.releaseall_args(resources, token, None)


def as_fences(reply: object, count: int) -> tuple[int, ...] | None:
    """An ``ACQUIREALL`` reply: the ``count`` fences in the caller's order, or ``None`` (nil:
    not granted)."""
    if reply is None:
        return None
    if isinstance(reply, (list, tuple)) and len(reply) == count:
        fences = tuple(as_int(fence) for fence in reply)
        if all(fence is not None for fence in fences):
            return tuple(fence for fence in fences if fence is not None)
    raise redis.ResponseError(f"dlock: unexpected reply {reply!r}")


class AcquirePlan:
    """The steps of one acquire, the same for both clients: a plain ACQUIRE first; while the
    caller's timeout allows, a WAIT for what is left of it (a fresh one only if a wait was cut
    short); after a grant from the queue, a plain ACQUIRE by the same token to learn (and claim)
    its deadline; ambiguous failures retried with the same token until the deadline."""

    def __init__(
        self,
        ttl: float,
        timeout: float | None,
        max_hold: float | None,
        request_timeout: float,
        ticket: float | None = None,
    ) -> None:
        self.token = new_token()
        # With tickets: the ticket's life (seconds), refreshed every third of it.
        self.ticket_ms = None if ticket is None else millis(ticket)
        self.queued = False
        self.started = time.monotonic()
        self.hold_end = None if max_hold is None else self.started + max_hold
        self.ttl_ms = millis(ttl if max_hold is None else min(ttl, max_hold))
        self.claim_ms = millis(max(1.0, 2 * request_timeout))
        if self.ticket_ms is not None:
            # A ticket's turn waits at least the ticket's life: a refresh then claims a turn
            # whose message was missed, and a turn told on the ticket's own channel starts on it.
            self.claim_ms = max(self.claim_ms, self.ticket_ms)
        self.wait_until = None if timeout is None else self.started + timeout
        # Ambiguous failures are retried with the same token until the caller's deadline (and one
        # more request's time); without a deadline, while they last no longer than this.
        self.request_timeout = request_timeout
        self.failing_for = max(5 * request_timeout, 1.0)
        self.failing_since: float | None = None
        self.failures = 0  # in a row, since the last answer
        self.reached_server = False
        self._wait_next = False
        # The server's longest wait, once it refused a longer one.
        self.max_wait_ms: int | None = None
        # With tickets told on their own channel: each ACQUIRE's send time by its NOTIFY number.
        self.sent_at: dict[int, float] = {}

    def left(self) -> float:
        if self.wait_until is None:
            return float("inf")
        return self.wait_until - time.monotonic()

    def next_wait_ms(self) -> int | None:
        """The WAIT of the next ACQUIRE in milliseconds, or ``None`` for a plain one."""
        if not self._wait_next:
            return None
        left = self.left()
        if left <= 0:
            return None
        wait_ms = millis_up(min(left, UNLIMITED_WAIT_SLICE))
        return wait_ms if self.max_wait_ms is None else min(wait_ms, self.max_wait_ms)

    def next_command(
        self, features: Features, request: Request
    ) -> tuple[list[Arg], int | None, int | None]:
        """The next ACQUIRE of this plan for ``request``, with its ``WAIT`` and its ``QUEUE`` in
        milliseconds (``None`` where it has none): the same for both clients."""
        queue_ms = self.next_queue_ms(features)
        wait_ms = None if queue_ms is not None else self.next_wait_ms()
        notify = None
        if queue_ms is not None and self.notifies(features):
            # Numbered, and its send time kept (taken before it goes: never late).
            notify = len(self.sent_at) + 1
            self.sent_at[notify] = time.monotonic()
        command = acquire_command(
            features,
            request.resource,
            self.token,
            self.ttl_ms,
            wait_ms=wait_ms,
            claim_ms=self.claim_ms,
            meta=request.meta,
            mode=request.mode,
            queue_ms=queue_ms,
            notify=notify,
        )
        return command, wait_ms, queue_ms

    def notifies(self, features: Features) -> bool:
        """Whether this plan's tickets are told of their grant on their own channel (the server
        takes ``NOTIFY``): they listen there instead of on the resource's channel."""
        return self.ticket_ms is not None and "NOTIFY" in features.acquire

    def channel(self, resource: str, features: Features) -> str:
        """The channel a ticket of this plan listens on: its own, or the resource's."""
        if self.notifies(features):
            return protocol.ticket_channel_name(resource, self.token)
        return protocol.channel_name(resource)

    def started_lease(
        self, resource: str, message: protocol.Granted, metrics: Metrics, mode: Mode
    ) -> LeaseState | None:
        """The lease a ticket's own channel announced, held from now on: its local expiry the
        named request's send time plus the window, its first renewal (the claim, which sets the
        full ttl) due at once. ``None`` (the next ACQUIRE claims the turn instead) when the
        request is not one of this plan's or less than a request timeout of the window is
        left."""
        expiry = protocol.granted_expiry(message, self.sent_at)
        if expiry is None or expiry <= time.monotonic() + self.request_timeout:
            return None
        state = LeaseState(
            resource,
            self.token,
            message.fence,
            self.ttl_ms,
            expiry - self.ttl_ms / 1000,
            self.hold_end,
            metrics,
            mode,
        )
        state.renew_now()
        return state

    def next_set_command(self, request: SetRequest) -> tuple[list[Arg], int | None]:
        """The next ``ACQUIREALL`` of this plan for a set, and its ``QUEUE`` in milliseconds
        (``None``: one plain try, without a wait). Every call of a wait is the same: the first
        takes a place in every member's line, the later ones refresh it and are granted once
        the set heads every line."""
        queue_ms = self.ticket_ms if self.queued or self.left() > 0 else None
        command = protocol.acquireall_args(
            request.resources, self.token, self.ttl_ms, queue_ms=queue_ms, meta=request.meta
        )
        return command, queue_ms

    def next_queue_ms(self, features: Features) -> int | None:
        """With tickets, the ``QUEUE`` of the next ACQUIRE (every ACQUIRE of a wait sends it:
        the first takes a place in line, the later ones refresh it and claim a grant), or
        ``None``: no tickets (``wait="block"``, a server without ``QUEUE``, or no time to
        wait)."""
        if self.ticket_ms is None or "QUEUE" not in features.acquire:
            return None
        if not self.queued and self.left() <= 0:
            return None  # timeout=0: one plain ACQUIRE, no place in line
        return self.ticket_ms

    def refresh_in(self) -> float:
        """How long a ticket waits for its channel before it is re-sent: a third of its life,
        and no later than the caller's deadline."""
        assert self.ticket_ms is not None
        return max(0.0, min(self.ticket_ms / 3000, self.left()))

    def retry_after(self, error: BaseException) -> bool:
        """Whether to retry after ``error`` (with the same token)."""
        reply = protocol.error_reply(error)
        limit = None
        if reply is not None and reply.startswith("ERR timeout-ms "):
            limit = protocol.upper_bound(reply)
        if limit is not None and self.max_wait_ms is None and limit > 0:
            # A wait longer than the server allows: wait in slices of its longest.
            self.max_wait_ms = limit
            self._wait_next = True
            return True
        if not is_ambiguous(error):
            return False
        self.reached_server |= not not_carried_out(error)
        self.failures += 1
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
        if self.wait_until is not None:
            if now >= self.wait_until + self.request_timeout:
                return False
        elif now >= self.failing_since + self.failing_for:
            return False
        self._wait_next = self.left() > 0
        return True

    def retry_pause(self) -> float:
        """How long to pause before the retry :meth:`retry_after` allowed: ``RETRY_PAUSE`` after
        one failure, doubled after each further one in a row up to ``MAX_RETRY_PAUSE`` (a
        failover takes seconds; many waiters need not knock every 50 ms), never much past the
        caller's deadline."""
        pause: float = RETRY_PAUSE * 2 ** min(max(self.failures - 1, 0), 8)
        return max(RETRY_PAUSE, min(pause, MAX_RETRY_PAUSE, self.left()))

    def answered(self, fence: int | None, waited: bool) -> str:
        """What this reply means: ``granted`` (ours, with a known deadline), ``confirm`` (granted
        from the queue at some instant during the wait: send a plain ACQUIRE by the same token
        next, whatever the time left), or ``nil`` (not granted: see :meth:`gives_up`)."""
        self.failing_since = None
        self.failures = 0
        if fence is not None:
            if waited:
                self._wait_next = False
                return "confirm"
            return "granted"
        self._wait_next = True
        return "nil"

    def lease(
        self, resource: str, fence: int, sent_at: float, metrics: Metrics, mode: Mode
    ) -> LeaseState:
        """The lease this plan was granted with ``fence`` by an ACQUIRE sent at ``sent_at``."""
        return LeaseState(
            resource, self.token, fence, self.ttl_ms, sent_at, self.hold_end, metrics, mode
        )

    def set_lease(
        self, resources: Sequence[str], fences: Sequence[int], sent_at: float, metrics: Metrics
    ) -> SetState:
        """The set this plan was granted with ``fences`` by an ACQUIREALL sent at ``sent_at``."""
        return SetState(
            tuple(resources),
            self.token,
            tuple(fences),
            self.ttl_ms,
            sent_at,
            self.hold_end,
            metrics,
        )

    def gives_up(self, waited: bool) -> bool:
        """After a nil: whether the caller's timeout has passed (a WAIT that ran to its end
        may leave a few milliseconds of rounding, which must not start another wait)."""
        return self.left() <= (CUT_SHORT if waited else 0)

    def wait_again_in(self, waited: bool) -> float:
        """After a nil that did not give up: the pause before the next ACQUIRE. None after a
        plain ACQUIRE (the WAIT follows at once); ``WAIT_AGAIN_PAUSE`` after a WAIT cut short
        (see ``CUT_SHORT``)."""
        return min(WAIT_AGAIN_PAUSE, max(0.0, self.left())) if waited else 0.0


# The lease's state and its renewal schedule.

LOST_REASONS = ("renewal_refused", "unreachable", "stalled", "max_hold", "ended", "revoked")


class LeaseState:
    """A granted lease as this process sees it, and when it is due for renewal. Thread-safe.

    The local expiry is conservative: counted from *before* the ACQUIRE or RENEW was sent, so it
    is never later than the server's deadline."""

    def __init__(
        self,
        resource: str,
        token: str,
        fence: int,
        ttl_ms: int,
        sent_at: float,
        hold_end: float | None,
        metrics: Metrics,
        mode: Mode = EXCLUSIVE,
    ) -> None:
        self.resource = resource
        self.token = token
        self.fence = fence
        self.ttl_ms = ttl_ms
        self.mode = mode
        # Every (resource, fence) this lease covers: its one; a set's members.
        self.members: tuple[tuple[str, int], ...] = ((resource, fence),)
        # What log lines and metrics name it by (a set: its members and fences, comma-separated).
        self.name = resource
        self.fence_name: int | str = fence
        self.lost = threading.Event()
        self.granted_at = time.monotonic()
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._detail: str | None = None
        self._local_expiry = sent_at + ttl_ms / 1000
        self._next_renewal = sent_at + ttl_ms / 3000
        # Whether the last RENEW sent got no answer (still outstanding, or failed): at the local
        # expiry that is ``unreachable``; with none waiting for one, ``stalled``.
        self._unanswered = False
        self._hold_end = hold_end
        self._metrics = metrics
        self._on_lost: list[Callable[[], None]] = []

    @property
    def ttl(self) -> float:
        return self.ttl_ms / 1000

    @property
    def local_expiry(self) -> float:
        with self._lock:
            return self._local_expiry

    @property
    def reason(self) -> str | None:
        with self._lock:
            return self._reason

    @property
    def detail(self) -> str | None:
        with self._lock:
            return self._detail

    def on_lost(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._on_lost.append(callback)

    def due(self) -> float:
        """When the renewer must next look at this lease (monotonic seconds)."""
        with self._lock:
            if self._reason is not None:
                return float("inf")  # lost: nothing more to do
            due = min(self._next_renewal, self._local_expiry)
            if self._hold_end is not None:
                due = min(due, self._hold_end)
            return due

    def step(self, now: float) -> str | int | None:
        """What is due at ``now``: ``None`` nothing, a loss reason (str), or a RENEW with that
        many milliseconds (int)."""
        with self._lock:
            if self._reason is not None:
                return None
            ended = self._ended(now)
            if ended is not None:
                return ended
            if now < self._next_renewal:
                return None
            ttl_ms = self.ttl_ms
            if self._hold_end is not None:
                # Never past max_hold: the server's lease ends with the hold.
                ttl_ms = min(ttl_ms, max(1, int((self._hold_end - now) * 1000)))
            # The caller sends the RENEW now: unanswered until renewed() or renewal_failed().
            self._unanswered = True
            return ttl_ms

    def renew_timeout(self, now: float, request_timeout: float) -> float:
        """How long a RENEW may take: past the local expiry its answer no longer helps."""
        with self._lock:
            return max(0.001, min(request_timeout, self._local_expiry - now))

    def renewed(self, sent_at: float, ttl_ms: int) -> None:
        with self._lock:
            self._unanswered = False
            self._local_expiry = sent_at + ttl_ms / 1000
            self._next_renewal = time.monotonic() + self.ttl_ms / 3000

    def renewal_failed(self, refused: bool) -> None:
        self._metrics.renewal_failed(self.name, self.token, self.fence_name, refused)
        with self._lock:
            if refused:
                self._unanswered = False  # answered: the lease is gone
            else:
                # No answer (it stays unanswered for the local expiry); retry sooner, until then.
                self._next_renewal = time.monotonic() + self.ttl_ms / 10000

    def renew_now(self) -> None:
        with self._lock:
            self._next_renewal = time.monotonic()

    def lose(self, reason: str, detail: str | None = None) -> bool:
        """Marks the lease lost (once): counts and logs it, sets ``lost``, calls the callbacks.
        ``detail``: the operator's reason of a revocation. ``True`` if this call did it.

        Counted and logged first: whoever wakes on ``lost`` finds the loss in the metrics and
        the log already."""
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            self._detail = detail
            callbacks = list(self._on_lost)
        self._metrics.lost(self.name, self.token, self.fence_name, reason, detail)
        self.lost.set()
        for callback in callbacks:
            callback()
        return True

    def _ended(self, now: float) -> str | None:
        """Why the lease is over at ``now`` by the clock alone, if it is (lock held)."""
        if self._hold_end is not None and now >= self._hold_end - MAX_HOLD_ROUNDING:
            # Renewals near the end are cut to end with the hold, rounded down to milliseconds.
            return "max_hold"
        if now >= self._local_expiry:
            # The last RENEW sent got no answer, or none was waiting for one: the process did
            # not run in time to send the renewal that was due (a renewal found due now is not
            # sent: step() checks the expiry first).
            return "unreachable" if self._unanswered else "stalled"
        return None

    def expire(self) -> bool:
        """Marks the lease lost if the clock alone says it is over (its local expiry or
        ``max_hold`` passed, the renewer did not notice yet). ``True`` if it is lost."""
        if not self.lost.is_set():
            with self._lock:
                ended = self._ended(time.monotonic())
            if ended is not None:
                self.lose(ended)
        return self.lost.is_set()

    def check(self) -> None:
        if self.expire():
            raise self.error()

    def error(self) -> LeaseLost:
        """The :class:`dlock.LeaseLost` that reports this lost lease."""
        with self._lock:
            reason, detail = self._reason, self._detail
        return LeaseLost(self.resource, self.fence, reason or "unknown", detail)

    def renew_command(self, features: Features, ttl_ms: int) -> list[Arg]:
        """The RENEW of this lease for ``ttl_ms``."""
        return renew_command(features, self.resource, self.token, ttl_ms, self.fence)

    def release_command(self, features: Features) -> list[Arg]:
        """The RELEASE at the end of its block; its reply is how many of :attr:`members` it
        released."""
        return release_command(features, self.resource, self.token, self.fence)

    def revoked(self, reason: str) -> None:
        """The resource's channel said an operator revoked this lease, giving ``reason``."""
        self.lose("revoked", reason)

    def due_expiry(self) -> float:
        with self._lock:
            end = self._local_expiry
            if self._hold_end is not None:
                end = min(end, self._hold_end)
            return end


class SetState(LeaseState):
    """A granted set (``DLOCK.ACQUIREALL``): one token, a fence per member, renewed, lost and
    released whole. ``resource`` and ``fence`` are its first member's (a Cluster routes the set
    by it: every member is in its slot)."""

    def __init__(
        self,
        resources: tuple[str, ...],
        token: str,
        fences: tuple[int, ...],
        ttl_ms: int,
        sent_at: float,
        hold_end: float | None,
        metrics: Metrics,
    ) -> None:
        super().__init__(resources[0], token, fences[0], ttl_ms, sent_at, hold_end, metrics)
        self.resources = resources
        self.fences = fences
        self.members = tuple(zip(resources, fences))
        self.name = ",".join(resources)
        self.fence_name = ",".join(str(fence) for fence in fences)

    def error(self) -> LeaseLost:
        with self._lock:
            reason, detail = self._reason, self._detail
        return LeaseLost(
            self.resource, self.fence, reason or "unknown", detail, members=self.members
        )

    def renew_command(self, features: Features, ttl_ms: int) -> list[Arg]:
        """``RENEWALL … FENCES``: every member renewed, or none (the set is then lost)."""
        return protocol.renewall_args(self.resources, self.token, ttl_ms, self.fences)

    def release_command(self, features: Features) -> list[Arg]:
        """``RELEASEALL … FENCES``: fewer than every member released is the loss ``ended``."""
        return protocol.releaseall_args(self.resources, self.token, self.fences)


class StateView:
    """What both clients' leases and sets show of their state."""

    def __init__(self, state: LeaseState) -> None:
        self._state = state

    @property
    def token(self) -> str:
        """This lease's owner token (random, made before the first ACQUIRE)."""
        return self._state.token

    @property
    def ttl(self) -> float:
        """The lease's length in seconds; it is renewed every third of it."""
        return self._state.ttl

    @property
    def lost(self) -> threading.Event:
        """Set once the lease is lost: the work must stop, its writes are no longer protected."""
        return self._state.lost

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost (``renewal_refused``, ``unreachable``, ``stalled``,
        ``max_hold``, ``ended``, ``revoked``), or ``None``."""
        return self._state.reason

    @property
    def lost_detail(self) -> str | None:
        """The reason an operator gave when revoking the lease (``""`` when none was given), once
        :attr:`lost_reason` is ``revoked``; else ``None``."""
        return self._state.detail

    @property
    def local_expiry(self) -> float:
        """A conservative end of the lease on ``time.monotonic()``'s clock: never after the
        server's deadline."""
        return self._state.local_expiry

    def check(self) -> None:
        """Raises :class:`dlock.LeaseLost` if the lease is lost, or if its local expiry passed
        without a renewal answered (it counts as lost from then on)."""
        self._state.check()


class LeaseView(StateView):
    """What both clients' leases show of their state."""

    @property
    def resource(self) -> str:
        """The locked resource (the Redis key of the lock)."""
        return self._state.resource

    @property
    def fence(self) -> int:
        """The fencing token: send it with every write the lease protects."""
        return self._state.fence

    @property
    def mode(self) -> str:
        """``exclusive`` (:meth:`~dlock.Locks.hold`, :meth:`~dlock.Locks.write`) or ``shared``
        (:meth:`~dlock.Locks.read`, :meth:`~dlock.Locks.semaphore`), as ``DLOCK.INFO`` shows
        it."""
        return self._state.mode.name

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(resource={self.resource!r}, mode={self.mode}, "
            f"fence={self.fence}, lost={self.lost.is_set()})"
        )


class SetLeaseView(StateView):
    """What both clients' sets show of their state: a lease (``lost``, ``lost_reason``,
    ``check()``, ...) over several resources, each with a fence of its own."""

    def __init__(self, state: SetState) -> None:
        super().__init__(state)
        self._set = state

    @property
    def resources(self) -> tuple[str, ...]:
        """The set's resources, in the order they were asked for."""
        return self._set.resources

    @property
    def fences(self) -> tuple[int, ...]:
        """Each member's fencing token, in the order of :attr:`resources`."""
        return self._set.fences

    def fence(self, resource: str) -> int:
        """The fencing token of the member ``resource``: send it with every write that member
        protects. ``KeyError`` if ``resource`` is not in the set."""
        for member, fence in self._set.members:
            if member == resource:
                return fence
        raise KeyError(resource)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(resources={self.resources!r}, fences={self.fences!r}, "
            f"lost={self.lost.is_set()})"
        )
