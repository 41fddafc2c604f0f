"""Client-side figures (the eight a lock service should show) and ownership log lines."""

from __future__ import annotations

import logging
import threading

__all__ = ["Metrics"]

log = logging.getLogger("dlock")


class Metrics:
    """Counters and sums of one :class:`dlock.Locks`, safe to read from any thread.

    Subclass it and override :meth:`_inc` / :meth:`_observe` to feed another system
    (``dlock.prometheus.PrometheusMetrics`` does so for ``prometheus_client``).

    Names (counters, with a ``reason`` label where shown):

    - ``acquire_attempts``
    - ``acquire_failures{reason}``: ``held`` (:class:`dlock.NotAcquired`: another owner kept
      it), ``unreachable`` (no request can have reached a server: nothing granted), ``unknown``
      (a request may have been carried out: its token was released), ``server`` (the server
      refused it, e.g. ``LOCKMODE``, or anything else)
    - ``acquire_seconds`` (sum and count): from the first send to the grant
    - ``hold_seconds`` (sum and count): from the grant to the release or the loss
    - ``renewal_failures{reason}``: ``refused``, ``error``
    - ``release_failures``: RELEASEs whose outcome is unknown (no answer, a connection or
      server error) for a lease still believed live; one that finds the lease gone is the loss
      ``ended``, and the RELEASE after a loss already reported is not counted
    - ``leases_lost{reason}``: ``renewal_refused``, ``unreachable``, ``stalled``, ``max_hold``,
      ``ended``, ``revoked``
    - ``stale_writes``: fenced writes the server refused

    A set (:meth:`dlock.Locks.hold_all`) counts as one lease in every figure (its loss is one
    loss); its log lines name its members and their fences, comma-separated, in the caller's
    order (``resource=a,b fence=11,12``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, float] = {}

    def _inc(self, name: str, reason: str = "", amount: float = 1.0) -> None:
        key = f"{name}{{{reason}}}" if reason else name
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + amount

    def _observe(self, name: str, seconds: float) -> None:
        with self._lock:
            self._counters[f"{name}_sum"] = self._counters.get(f"{name}_sum", 0.0) + seconds
            self._counters[f"{name}_count"] = self._counters.get(f"{name}_count", 0.0) + 1

    def get(self, name: str, reason: str = "") -> float:
        """One figure, e.g. ``get("leases_lost", "renewal_refused")`` or
        ``get("hold_seconds_count")``; 0 when it never moved."""
        key = f"{name}{{{reason}}}" if reason else name
        with self._lock:
            return self._counters.get(key, 0.0)

    def snapshot(self) -> dict[str, float]:
        """Every figure that moved, by name (``name{reason}`` for labelled ones)."""
        with self._lock:
            return dict(self._counters)

    # The events, called by the client.

    def acquire_attempt(self) -> None:
        self._inc("acquire_attempts")

    def acquire_failed(self, reason: str) -> None:
        self._inc("acquire_failures", reason)

    def acquired(self, resource: str, token: str, fence: int | str, seconds: float) -> None:
        self._observe("acquire_seconds", seconds)
        log.info("dlock: lease acquired resource=%s owner=%s fence=%s", resource, token, fence)

    def renewal_failed(self, resource: str, token: str, fence: int | str, refused: bool) -> None:
        reason = "refused" if refused else "error"
        self._inc("renewal_failures", reason)
        log.warning(
            "dlock: renewal failed resource=%s owner=%s fence=%s reason=%s",
            resource,
            token,
            fence,
            reason,
        )

    def released(
        self, resource: str, token: str, fence: int | str, held: float, ok: bool | None
    ) -> None:
        """The end of a hold by the RELEASE of a lease believed live: ``ok`` ``True`` released;
        ``False`` the lease was already gone (the loss ``ended``, counted by :meth:`lost`, not
        a release failure); ``None`` the outcome is unknown (no answer, a connection or server
        error): a release failure."""
        self._observe("hold_seconds", held)
        if ok:
            log.info("dlock: lease released resource=%s owner=%s fence=%s", resource, token, fence)
        elif ok is None:
            self._inc("release_failures")
            log.warning(
                "dlock: release failed resource=%s owner=%s fence=%s", resource, token, fence
            )

    def ended(self, resource: str, token: str, fence: int | str, held: float) -> None:
        """The end of a hold whose loss was already reported: revoked (no RELEASE was sent), or
        lost before its block exited (its RELEASE was best effort, counted as nothing, whatever
        it answered)."""
        self._observe("hold_seconds", held)

    def lost(
        self, resource: str, token: str, fence: int | str, reason: str, detail: str | None = None
    ) -> None:
        """A lease lost; ``detail``: the operator's reason of a revocation."""
        self._inc("leases_lost", reason)
        if detail is not None:
            log.warning(
                "dlock: lease lost resource=%s owner=%s fence=%s reason=%s detail=%s",
                resource,
                token,
                fence,
                reason,
                detail,
            )
            return
        log.warning(
            "dlock: lease lost resource=%s owner=%s fence=%s reason=%s",
            resource,
            token,
            fence,
            reason,
        )

    def stale_write(self, resource: str, fence: int, detail: str) -> None:
        self._inc("stale_writes")
        log.warning(
            "dlock: stale operation rejected resource=%s incoming_fence=%d detail=%s",
            resource,
            fence,
            detail,
        )
