"""dlock's own errors. Errors of Redis itself (connection, timeouts, bad arguments) are redis-py's
exceptions and pass through unchanged."""

from __future__ import annotations

__all__ = ["DlockError", "LeaseLost", "NotAcquired", "Stale", "Unsupported"]


class DlockError(Exception):
    """The base of dlock's own errors; each carries the ``resource`` and, when there is one, the
    ``fence`` it concerns."""

    def __init__(self, message: str, resource: str, fence: int | None = None) -> None:
        super().__init__(message)
        self.resource = resource
        self.fence = fence


class NotAcquired(DlockError):
    """The lock stayed held by another owner until the caller's ``timeout`` passed.
    ``fence`` is ``None``: nothing was granted."""

    def __init__(self, resource: str, timeout: float | None) -> None:
        super().__init__(f"dlock: {resource!r} was not acquired within {timeout} s", resource, None)
        self.timeout = timeout


class LeaseLost(DlockError):
    """The lease ended before the work did: the server refused a renewal (expired, deleted,
    taken over), the lease's local expiry passed without an answered renewal (``unreachable``
    when the last renewal sent got no answer; ``stalled`` when none was waiting for one: the
    process did not run in time to send it, e.g. it was stopped, or a body blocked the event
    loop), ``max_hold`` passed, the RELEASE at the block's end found the lease gone
    (``ended``), or an operator revoked it (``DLOCK.REVOKE``). Work done after this point was
    not protected by the lease.

    ``reason`` is one of ``renewal_refused``, ``unreachable``, ``stalled``, ``max_hold``,
    ``ended``, ``revoked``; ``detail`` is the reason the operator gave for a revocation (``""``
    when none was), ``None`` for the other reasons.

    A set (:meth:`~dlock.Locks.hold_all`) is lost whole: ``resources`` and ``fences`` name every
    member, in the caller's order (a single lease: its resource and fence), and ``resource`` and
    ``fence`` are the first member's."""

    def __init__(
        self,
        resource: str,
        fence: int,
        reason: str,
        detail: str | None = None,
        *,
        members: tuple[tuple[str, int], ...] | None = None,
    ) -> None:
        said = f" ({detail})" if detail else ""
        if members is None:
            what = f"lease on {resource!r} (fence {fence})"
            members = ((resource, fence),)
        else:
            names = ", ".join(repr(member) for member, _ in members)
            fences = ", ".join(str(member_fence) for _, member_fence in members)
            what = f"set lease on {names} (fences {fences})"
        super().__init__(f"dlock: {what} lost: {reason}{said}", resource, fence)
        self.reason = reason
        self.detail = detail
        self.resources = tuple(member for member, _ in members)
        self.fences = tuple(member_fence for _, member_fence in members)


class Stale(DlockError):
    """A fenced write was refused because ``fence`` is no longer the live lease's: nothing was
    written. ``detail`` is the server's message."""

    def __init__(self, resource: str, fence: int, detail: str) -> None:
        super().__init__(f"dlock: stale fence, write refused: {detail}", resource, fence)
        self.detail = detail


class Unsupported(DlockError):
    """The server that serves ``resource`` does not advertise ``option``, which the request
    needs (``SHARED`` for :meth:`~dlock.Locks.read`, ``SHARED`` and ``LIMIT`` for
    :meth:`~dlock.Locks.semaphore`): its dlock module is too old. Nothing was sent."""

    def __init__(self, resource: str, option: str) -> None:
        super().__init__(
            f"dlock: the server that serves {resource!r} is too old for this request: its dlock"
            f" module does not support {option} on DLOCK.ACQUIRE (upgrade the module)",
            resource,
            None,
        )
        self.option = option
