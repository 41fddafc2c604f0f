"""dlock: lease locks with fencing tokens on Redis (or Valkey) with the dlock module, whose
renewal lives and dies with the work they protect.

    import redis, dlock

    locks = dlock.Locks(redis.Redis())
    with locks.hold("invoice:123", ttl=30, timeout=10) as lease:
        lease.fenced("SET", "invoice:123:total", "10")

``locks.read`` and ``locks.write`` are the two sides of a read-write lock, ``locks.semaphore`` a
counting semaphore; each yields the same ``Lease``. ``locks.hold_all`` takes several resources
at once, whole or not at all, and yields a ``SetLease``.
``dlock.asyncio.Locks`` is the same for ``redis.asyncio``.
"""

from ._common import Features, Leader
from ._errors import DlockError, LeaseLost, NotAcquired, Stale, Unsupported
from ._metrics import Metrics
from ._sync import Hold, Lease, Locks, SetHold, SetLease

__all__ = [
    "DlockError",
    "Features",
    "Hold",
    "Leader",
    "Lease",
    "LeaseLost",
    "Locks",
    "Metrics",
    "NotAcquired",
    "SetHold",
    "SetLease",
    "Stale",
    "Unsupported",
]

__version__ = "0.2.0"
