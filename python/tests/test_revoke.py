"""An operator's ``DLOCK.REVOKE`` against a real server (threaded and asyncio): the holder hears
of it on the resource's channel and loses the lease at once, with reason ``revoked`` and the
operator's reason as its detail; a revocation of another lease leaves it alone; and where the
channel cannot be heard, the next renewal still reports the loss."""

from __future__ import annotations

import asyncio
import logging
import statistics
import threading
import time
from typing import Any, Callable

import pytest
import redis
import redis.asyncio

import dlock
import dlock.asyncio
from conftest import Server, cmd, fields, wait_until
from dlock import _protocol as protocol

# Revocations measured per test: the median and the worst are printed, never asserted.
REVOCATIONS = 20


def listeners(r: redis.Redis, resource: str) -> int:
    """Subscribers of ``resource``'s channel."""
    reply = cmd(r, "PUBSUB", "NUMSUB", protocol.channel_name(resource))
    return int(reply[1])


def until_listeners(r: redis.Redis, resource: str, n: int) -> None:
    """Waits until ``resource``'s channel has ``n`` subscribers (a holder subscribes after its
    grant returned)."""
    assert wait_until(lambda: listeners(r, resource) == n, 5, step=0.001), (
        f"{resource}: {listeners(r, resource)} subscribers, not {n}"
    )


def revoke(
    r: redis.Redis, resource: str, *, fence: int | None = None, reason: str | None = None
) -> int:
    args: list[Any] = ["DLOCK.REVOKE", resource]
    if fence is not None:
        args += ["FENCE", fence]
    if reason is not None:
        args += ["REASON", reason]
    return int(cmd(r, *args))


def text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def calls(r: redis.Redis, command: str) -> int:
    """How many times the server ran ``command``."""
    stats = r.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def when_lost(lease: dlock.Lease) -> Callable[[], float]:
    """Starts a thread that notes when ``lease`` is lost; the call returned waits for it and
    says when (``time.monotonic()``)."""
    noted: list[float] = []

    def note() -> None:
        if lease.lost.wait(10):
            noted.append(time.monotonic())

    thread = threading.Thread(target=note, daemon=True)
    thread.start()

    def lost_at() -> float:
        thread.join()
        assert noted, "never lost"
        return noted[0]

    return lost_at


def report(flavour: str, latencies: list[float]) -> None:
    micros = sorted(round(latency * 1e6) for latency in latencies)
    print(
        f"{flavour}: {len(micros)} revocations, REVOKE reply to loss: median"
        f" {statistics.median(micros):.0f} µs, max {micros[-1]} µs"
    )


def test_a_revoked_holder_loses_its_lease_at_once_with_the_operators_reason(
    server: Server, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dlock")
    locks = dlock.Locks(server.client())
    latencies: list[float] = []
    try:
        for i in range(REVOCATIONS):
            resource = f"report:{i}"
            # Every other revocation without a reason: the detail is then empty.
            reason = f"stuck since 03:00, incident {i}" if i % 2 == 0 else None
            # A ttl far above the test: only the channel can end these leases in time.
            with (
                pytest.raises(dlock.LeaseLost) as raised,
                locks.hold(resource, ttl=60, timeout=0) as lease,
            ):
                lost_at = when_lost(lease)
                until_listeners(r, resource, 1)
                assert revoke(r, resource, reason=reason) == 1
                answered = time.monotonic()
                latencies.append(lost_at() - answered)
                assert lease.lost_reason == "revoked"
                assert lease.lost_detail == (reason or "")
                with pytest.raises(dlock.LeaseLost) as checked:
                    lease.check()
                assert (checked.value.reason, checked.value.detail) == ("revoked", reason or "")
            assert (raised.value.reason, raised.value.detail) == ("revoked", reason or "")
            until_listeners(r, resource, 0)  # left with the lease
    finally:
        locks.close()
    report("threaded", latencies)
    assert locks.metrics.get("leases_lost", "revoked") == REVOCATIONS
    assert locks.metrics.get("release_failures") == 0
    assert calls(r, "dlock.release") == 0, "nothing to release after a revocation"
    lost = [record.getMessage() for record in caplog.records if "lease lost" in record.getMessage()]
    assert lost[0].endswith("reason=revoked detail=stuck since 03:00, incident 0"), lost[0]


def test_asyncio_a_revoked_holders_block_is_cancelled_with_the_operators_reason(
    server: Server, r: redis.Redis
) -> None:
    async def scenario() -> list[float]:
        locks = dlock.asyncio.Locks(redis.asyncio.Redis(port=server.port))
        latencies: list[float] = []
        try:
            for i in range(REVOCATIONS):
                resource = f"report:{i}"
                reason = f"incident {i}"
                with pytest.raises(dlock.LeaseLost) as raised:
                    async with locks.hold(resource, ttl=60, timeout=0):
                        for _ in range(5000):
                            if listeners(r, resource) == 1:
                                break
                            await asyncio.sleep(0.001)
                        assert revoke(r, resource, reason=reason) == 1
                        answered = time.monotonic()
                        try:
                            await asyncio.sleep(60)  # the work, cancelled by the loss
                        finally:
                            latencies.append(time.monotonic() - answered)
                assert (raised.value.reason, raised.value.detail) == ("revoked", reason)
        finally:
            await locks.aclose()
        assert locks.metrics.get("leases_lost", "revoked") == REVOCATIONS
        return latencies

    latencies = asyncio.run(asyncio.wait_for(scenario(), 50))
    report("asyncio", latencies)
    assert calls(r, "dlock.release") == 0, "nothing to release after a revocation"


def test_revoking_another_readers_lease_leaves_this_one_held(
    server: Server, r: redis.Redis
) -> None:
    locks = dlock.Locks(server.client())
    try:
        with locks.read("report", ttl=60, timeout=0) as kept:
            with (
                pytest.raises(dlock.LeaseLost) as raised,
                locks.read("report", ttl=60, timeout=0) as revoked,
            ):
                until_listeners(r, "report", 1)
                assert revoke(r, "report", fence=revoked.fence, reason="one reader") == 1
                assert revoked.lost.wait(5), "the revoked reader was told"
                # The same reading thread had the message for both: the other was not told.
                assert not kept.lost.is_set()
            assert (raised.value.reason, raised.value.detail) == ("revoked", "one reader")
            kept.check()
        assert kept.lost_reason is None, "held to the end and released"
    finally:
        locks.close()
    assert locks.metrics.get("leases_lost", "revoked") == 1
    assert locks.metrics.get("release_failures") == 0


def test_a_revocation_the_holder_cannot_hear_is_reported_by_the_next_renewal(
    server: Server, r: redis.Redis
) -> None:
    # A user allowed the commands but no channel: the holder's subscription is refused.
    cmd(r, "ACL", "SETUSER", "worker", "on", ">secret", "~*", "+@all", "resetchannels")
    cmd(r, "ACL", "LOG", "RESET")
    worker = redis.Redis(port=server.port, username="worker", password="secret")
    locks = dlock.Locks(worker)
    channel = protocol.channel_name("report")

    def refused() -> bool:
        for entry in cmd(r, "ACL", "LOG"):
            seen = {text(key): text(value) for key, value in fields(entry).items()}
            if seen.get("reason") == "channel" and seen.get("object") == channel:
                return True
        return False

    try:
        with (
            pytest.raises(dlock.LeaseLost) as raised,
            locks.hold("report", ttl=0.6, timeout=0) as lease,
        ):
            # The holder did try to listen, and was refused.
            assert wait_until(refused, 5), f"no refused subscription to {channel}"
            assert revoke(r, "report", reason="unheard") == 1
            assert lease.lost.wait(5)
        assert raised.value.reason == "renewal_refused", "the renewal tells"
    finally:
        locks.close()
        worker.close()
        cmd(r, "ACL", "DELUSER", "worker")
