"""dlock's wire rules, written once for both clients (threaded and asyncio): channel names, the
hand-over tag, channel messages, the argument vector of every command form, error classes, and
reading ``DLOCK.INFO``. No I/O. ``protocol/vectors/*.json`` pins every rule here, as it pins the
Rust crate ``dlock-proto`` (``tests/test_protocol.py`` loads them); ``docs/protocol.md`` is the
contract in prose."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

import redis

Arg = Union[str, bytes, int, float]

ACQUIRE = "DLOCK.ACQUIRE"
RENEW = "DLOCK.RENEW"
RELEASE = "DLOCK.RELEASE"
FENCECHECK = "DLOCK.FENCECHECK"
FENCED = "DLOCK.FENCED"
INFO = "DLOCK.INFO"
ACQUIREALL = "DLOCK.ACQUIREALL"
RENEWALL = "DLOCK.RENEWALL"
RELEASEALL = "DLOCK.RELEASEALL"

# The option keywords of the version 2 commands.
OPTIONS = ("CLAIM", "FENCE", "LIMIT", "META", "NOTIFY", "QUEUE", "SHARED", "WAIT")

# The server's bound on a semaphore's permits (LIMIT n), on a token and on META.
MAX_PERMITS = 1_000_000
MAX_TOKEN_LEN = 512
MAX_META_LEN = 1_024
# The most resources in one set (``DLOCK.ACQUIREALL``, ``RENEWALL``, ``RELEASEALL``).
MAX_SET = 64


# Channels and their messages.


def channel_name(resource: str) -> str:
    """The channel where the server publishes ``resource``'s changes of ownership: a resource
    with braces keeps them, and its hash tag, behind ``dlock:key:`` (``invoice:{7}`` →
    ``dlock:key:invoice:{7}``), any other is wrapped in a tag (``invoice:7`` →
    ``dlock:{invoice:7}``), so it lives in the key's slot and no two resources share one."""
    if "{" in resource or "}" in resource:
        return "dlock:key:" + resource
    return "dlock:{" + resource + "}"


def token_tag(token: str) -> str:
    """The tag a ``handoff`` message names its new holder by: FNV-1a 32-bit of the token's
    UTF-8 bytes, as 8 lowercase hex digits."""
    tag = 0x811C9DC5
    for byte in token.encode():
        tag = ((tag ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{tag:08x}"


def wide_tag(token: str) -> str:
    """What a ticket's own channel is named by: FNV-1a 64-bit of the token's UTF-8 bytes, as 16
    lowercase hex digits (wide enough that two random tokens waiting at once never share it)."""
    tag = 0xCBF29CE484222325
    for byte in token.encode():
        tag = ((tag ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{tag:016x}"


def ticket_channel_name(resource: str, token: str) -> str:
    """The channel where the server tells the ticket of ``token`` on ``resource`` (sent with
    ``NOTIFY``) alone of its grant: the resource's channel, ``:`` and the token's wide tag
    (``dlock:{invoice:123}:af63dc4c8601ec8c`` for token ``a``), in the resource's slot."""
    return channel_name(resource) + ":" + wide_tag(token)


@dataclass(frozen=True)
class Granted:
    """A ``granted <fence> <request> <window-ms>`` message on a ticket's own channel: the lease
    of ``fence`` was handed to the ticket after the server read its ACQUIRE numbered
    ``request`` (``NOTIFY``), and runs ``window_ms`` from the hand-over unless claimed."""

    fence: int
    request: int
    window_ms: int


def granted(payload: str) -> Granted | None:
    """The :class:`Granted` of a ``granted`` message, or ``None`` for any other text."""
    words = payload.split(" ")
    if len(words) != 4 or words[0] != "granted":
        return None
    if not all(word.isascii() and word.isdigit() for word in words[1:]):
        return None
    fence, request, window_ms = (int(word) for word in words[1:])
    if max(fence, request, window_ms) >= 2**64:
        return None
    return Granted(fence, request, window_ms)


def granted_expiry(message: Granted, sent_at: dict[int, float]) -> float | None:
    """The earliest the lease a ``granted`` message announces may end, on the clock of
    ``sent_at`` (each ACQUIRE's send time by its ``NOTIFY`` number): the named request's send
    time plus the window (that request reached the server before the hand-over); ``None`` when
    the request is not one of the attempt's."""
    sent = sent_at.get(message.request)
    return None if sent is None else sent + message.window_ms / 1000


_QUIET = ("acquired", "renewed", "released", "expired")


def woken(payload: str) -> str | None:
    """Which ticket waiters a channel message wakes: ``""`` none (``acquired``, ``renewed``,
    ``released``, ``expired``: a release with a line always hands over), a tag (a ``handoff`` to
    that token), or ``None`` every one (a ``handoff`` without a tag from an older server, or a
    message this version does not understand)."""
    words = payload.split(" ")
    if len(words) == 2 and words[0] in _QUIET:
        return ""
    if len(words) == 3 and words[0] == "handoff":
        return words[2]
    return None


def revoked(payload: str) -> tuple[int, str] | None:
    """The fence and the reason of a ``revoked`` message (``revoked <fence> <reason>``, published
    by ``DLOCK.REVOKE``; the reason is empty when none was given), or ``None`` for any other
    message."""
    rest = payload[len("revoked ") :] if payload.startswith("revoked ") else None
    if rest is None:
        return None
    fence, _, reason = rest.partition(" ")
    if not (fence.isascii() and fence.isdigit()) or int(fence) >= 2**64:
        return None
    return int(fence), reason


def wakes(payload: str | None, tag: str | None) -> bool:
    """Whether a channel message ``payload`` wakes a watcher with ``tag`` (``None``: an observer,
    woken by every message)."""
    if tag is None or payload is None:
        return True
    whom = woken(payload)
    return whom is None or whom == tag


# The commands as sent: the options in the order the command pages list them.


def acquire_args(
    resource: str,
    token: str,
    ttl_ms: int,
    *,
    shared: bool = False,
    limit: int | None = None,
    wait_ms: int | None = None,
    queue_ms: int | None = None,
    claim_ms: int | None = None,
    meta: str | bytes | None = None,
    notify: int | None = None,
) -> list[Arg]:
    """``DLOCK.ACQUIRE resource token ttl-ms [SHARED [LIMIT n]] [WAIT ms | QUEUE ms [NOTIFY n]]
    [CLAIM ms] [META value]``. ``CLAIM`` goes only with a wait or a ticket (a grant answered at
    once is claimed by its answer) and never longer than the ttl (a longer window changes
    nothing); ``NOTIFY`` only with a ticket."""
    if wait_ms is not None and queue_ms is not None:
        raise ValueError("dlock: WAIT and QUEUE cannot be combined")
    args: list[Arg] = [ACQUIRE, resource, token, ttl_ms]
    if shared:
        args.append("SHARED")
        if limit is not None:
            args += ["LIMIT", limit]
    if queue_ms is not None:
        args += ["QUEUE", queue_ms]
        if notify is not None:
            args += ["NOTIFY", notify]
    elif wait_ms is not None:
        args += ["WAIT", wait_ms]
    if claim_ms is not None and (wait_ms is not None or queue_ms is not None):
        args += ["CLAIM", min(claim_ms, ttl_ms)]
    if meta is not None:
        args += ["META", meta]
    return args


def renew_args(resource: str, token: str, ttl_ms: int, fence: int | None) -> list[Arg]:
    """``DLOCK.RENEW resource token ttl-ms [FENCE fence]``: with the grant's fence whenever the
    server takes it, so a late or retried RENEW never extends a later grant of the token."""
    args: list[Arg] = [RENEW, resource, token, ttl_ms]
    if fence is not None:
        args += ["FENCE", fence]
    return args


def release_args(resource: str, token: str, fence: int | None) -> list[Arg]:
    """``DLOCK.RELEASE resource token [FENCE fence]``: without a fence (an attempt whose outcome
    is unknown) it frees that attempt's grant, whatever its fence, and takes its ticket out of
    line."""
    args: list[Arg] = [RELEASE, resource, token]
    if fence is not None:
        args += ["FENCE", fence]
    return args


def acquireall_args(
    resources: Sequence[str],
    token: str,
    ttl_ms: int,
    *,
    queue_ms: int | None = None,
    meta: str | bytes | None = None,
) -> list[Arg]:
    """``DLOCK.ACQUIREALL numkeys resource … token ttl-ms [QUEUE ticket-ms] [META value]``: every
    resource of the set, in the caller's order (its fences come back in that order), or none.
    A set never waits with ``WAIT`` (the server refuses it): it waits with ``QUEUE``."""
    args: list[Arg] = [ACQUIREALL, len(resources), *resources, token, ttl_ms]
    if queue_ms is not None:
        args += ["QUEUE", queue_ms]
    if meta is not None:
        args += ["META", meta]
    return args


def renewall_args(
    resources: Sequence[str], token: str, ttl_ms: int, fences: Sequence[int]
) -> list[Arg]:
    """``DLOCK.RENEWALL numkeys resource … token ttl-ms FENCES fence …``: every member renewed,
    or none, each only under the fence of its grant."""
    return [RENEWALL, len(resources), *resources, token, ttl_ms, "FENCES", *fences]


def releaseall_args(
    resources: Sequence[str], token: str, fences: Sequence[int] | None
) -> list[Arg]:
    """``DLOCK.RELEASEALL numkeys resource … token [FENCES fence …]``: without fences (an
    attempt whose wait ended, or whose outcome is unknown) it frees whatever that attempt's
    token holds of the set and takes its tickets out of every line."""
    args: list[Arg] = [RELEASEALL, len(resources), *resources, token]
    if fences is not None:
        args += ["FENCES", *fences]
    return args


def fencecheck_args(resource: str, fence: int) -> list[Arg]:
    return [FENCECHECK, resource, fence]


def info_args(resource: str) -> list[Arg]:
    return [INFO, resource]


def fenced_args(resource: str, fence: int, command: tuple[Arg, ...]) -> list[Arg]:
    """``DLOCK.FENCED resource fence command [arg …]``."""
    return [FENCED, resource, fence, *command]


# Error replies.

ERROR_CLASSES = (
    "redirect",
    "retry",
    "failover",
    "unblocked",
    "stale",
    "cross_slot",
    "mode_conflict",
    "unsupported",
    "auth",
    "wrong_type",
    "usage",
    "server",
)

_BY_CODE = {
    "MOVED": "redirect",
    "ASK": "redirect",
    "TRYAGAIN": "retry",
    "LOADING": "retry",
    "CLUSTERDOWN": "retry",
    "MASTERDOWN": "retry",
    "READONLY": "failover",
    "UNBLOCKED": "unblocked",
    "STALE": "stale",
    "CROSSSLOT": "cross_slot",
    "LOCKMODE": "mode_conflict",
    "NOAUTH": "auth",
    "WRONGPASS": "auth",
    "NOPERM": "auth",
    "WRONGTYPE": "wrong_type",
}

_UNEXPECTED_ARGUMENT = "ERR syntax error: unexpected argument '"
_SERVER_TROUBLE = ("ERR fence counter exhausted", "ERR internal error")


def unsupported_option(reply: str) -> str | None:
    """The option keyword an older server refused as an unknown argument, upper case."""
    if not reply.startswith(_UNEXPECTED_ARGUMENT) or not reply.endswith("'"):
        return None
    named = reply[len(_UNEXPECTED_ARGUMENT) : -1].upper()
    return named if named in OPTIONS else None


def upper_bound(reply: str) -> int | None:
    """The largest value a bounds error allows (``… between 0 and 86400000`` → 86400000)."""
    _, between, tail = reply.rpartition(" between ")
    _, found, upper = tail.partition(" and ")
    if not between or not found:
        return None
    digits = upper.split(" ")[0]
    return int(digits) if digits.isdigit() else None


def error_class(reply: str) -> str:
    """The class of an error reply (its whole text, code first): what the client does next."""
    code = reply.split(" ")[0]
    if code in _BY_CODE:
        return _BY_CODE[code]
    if code == "ERR":
        if unsupported_option(reply) is not None:
            return "unsupported"
        if reply.startswith(_SERVER_TROUBLE):
            return "server"
        return "usage"
    return "server"


def error_reply(error: BaseException) -> str | None:
    """The server's error reply as it was sent (code first), from redis-py's exception: its
    parser takes the code off the replies it has a type for and keeps it as ``status_code``
    (redis-py 6+; before that, the code of such a type is restored from the type). ``None``
    for an error of this side (a connection, a timeout)."""
    typed = _code_of_type(error)  # LOADING's type is a ConnectionError
    if not isinstance(error, redis.ResponseError) and typed is None:
        return None
    text = str(error)
    code = getattr(error, "status_code", None) or typed
    if code is None:
        first = text.split(" ")[0]
        code = first if first in _BY_CODE else "ERR"
    if text == code or text.startswith(code + " "):
        return text
    return f"{code} {text}"


def _code_of_type(error: BaseException) -> str | None:
    for kind, code in _TYPE_CODES:
        if isinstance(error, kind):
            return code
    return None


# The error types of redis-py whose code its parser takes off (most specific first).
_TYPE_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (redis.exceptions.MovedError, "MOVED"),
    (redis.exceptions.AskError, "ASK"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
    (redis.exceptions.MasterDownError, "MASTERDOWN"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
    (redis.exceptions.ClusterCrossSlotError, "CROSSSLOT"),
    (redis.exceptions.BusyLoadingError, "LOADING"),
    (redis.exceptions.ReadOnlyError, "READONLY"),
    (redis.exceptions.NoPermissionError, "NOPERM"),
    (redis.exceptions.OutOfMemoryError, "OOM"),
)


def class_of(error: BaseException) -> str | None:
    """The class of the server's error reply ``error`` carries; ``None`` for an error of this
    side."""
    if isinstance(error, redis.AuthenticationError):
        return "auth"  # NOAUTH and WRONGPASS share one type
    reply = error_reply(error)
    return None if reply is None else error_class(reply)


# Replies.


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return None


def _count(value: object) -> int:
    if isinstance(value, int):
        return value
    text = _text(value)
    return int(text) if text is not None and text.lstrip("-").isdigit() else 0


@dataclass(frozen=True)
class Holder:
    """One live shared lease in ``DLOCK.INFO``'s ``leases``."""

    token: str
    fence: int
    ttl_ms: int
    meta: str | None


@dataclass(frozen=True)
class Info:
    """What ``DLOCK.INFO`` shows, read by field name (later fields change nothing)."""

    owner: str | None
    fence: int | None
    ttl_ms: int
    waiters: int
    next_waiters: tuple[str, ...]
    tickets: int
    mode: str | None
    holders: int
    meta: str | None
    leases: tuple[Holder, ...]


def parse_info(reply: object) -> Info | None:
    """A ``DLOCK.INFO`` reply in RESP2 (a flat list of names and values) or RESP3 (a dict)
    shape; ``None`` for nil (no lease, nobody waiting)."""
    if reply is None:
        return None
    if isinstance(reply, dict):
        pairs = list(reply.items())
    elif isinstance(reply, (list, tuple)):
        items = list(reply)
        pairs = list(zip(items[::2], items[1::2]))
    else:
        raise redis.ResponseError(f"dlock: unexpected reply {reply!r}")
    info = {_text(key): value for key, value in pairs}

    def listed(name: str) -> list[object]:
        value = info.get(name)
        return list(value) if isinstance(value, (list, tuple)) else []

    fence = info.get("fence")
    leases = tuple(
        Holder(_text(lease[0]) or "", _count(lease[1]), _count(lease[2]), _text(lease[3]))
        for lease in listed("leases")
        if isinstance(lease, (list, tuple)) and len(lease) >= 4
    )
    return Info(
        owner=_text(info.get("owner")),
        fence=None if fence is None else _count(fence),
        ttl_ms=_count(info.get("ttl-ms")),
        waiters=_count(info.get("waiters")),
        next_waiters=tuple(t for t in map(_text, listed("next-waiters")) if t is not None),
        tickets=_count(info.get("tickets")),
        mode=_text(info.get("mode")),
        holders=_count(info.get("holders")),
        meta=_text(info.get("meta")),
        leases=leases,
    )


@dataclass(frozen=True)
class Leader:
    """Who leads an election (:meth:`dlock.Locks.observe`): the address its candidate gave
    (the lease's ``META``; ``None`` without one), its term's fence (larger for every newer
    term) and its lease's token."""

    address: str | None
    fence: int
    token: str


def leader_from_info(reply: object) -> Leader | None:
    """The leader ``DLOCK.INFO name`` shows: the holder of a live exclusive lease (a version 1
    server shows no mode, and its lease is exclusive), or ``None``."""
    info = parse_info(reply)
    if info is None or info.owner is None or info.fence is None:
        return None
    if info.mode is not None and info.mode != "exclusive":
        return None
    return Leader(info.meta, info.fence, info.owner)
