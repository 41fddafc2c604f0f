"""Sets of resources (``locks.hold_all``: ``DLOCK.ACQUIREALL``, ``RENEWALL``, ``RELEASEALL``)
against a real server, threaded and asyncio: granted whole or not at all, waiting in every
member's line, renewed, lost and released whole."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio

import dlock
import dlock.asyncio
from conftest import Server, cmd, fields, wait_until
from dlock import _protocol as protocol

SET = ("{acct}:alice", "{acct}:bob")


def info(r: redis.Redis, resource: str) -> dict[str, Any]:
    reply = cmd(r, "DLOCK.INFO", resource)
    if reply is None:
        return {}
    return {
        (key.decode() if isinstance(key, bytes) else key): value
        for key, value in fields(reply).items()
    }


def owner(r: redis.Redis, resource: str) -> str | None:
    found = info(r, resource).get("owner")
    return found.decode() if isinstance(found, bytes) else found


def calls(r: redis.Redis, command: str) -> int:
    """How many times the server ran ``command``."""
    stats = r.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def listeners(r: redis.Redis, resource: str) -> int:
    return int(cmd(r, "PUBSUB", "NUMSUB", protocol.channel_name(resource))[1])


def test_the_commands_as_sent() -> None:
    assert protocol.acquireall_args(SET, "t", 30000) == [
        "DLOCK.ACQUIREALL", 2, *SET, "t", 30000
    ]  # fmt: skip
    assert protocol.acquireall_args(SET, "t", 30000, queue_ms=8000, meta="m")[-4:] == [
        "QUEUE", 8000, "META", "m"
    ]  # fmt: skip
    assert protocol.renewall_args(SET, "t", 30000, (11, 12)) == [
        "DLOCK.RENEWALL", 2, *SET, "t", 30000, "FENCES", 11, 12
    ]  # fmt: skip
    assert protocol.releaseall_args(SET, "t", (11, 12)) == [
        "DLOCK.RELEASEALL", 2, *SET, "t", "FENCES", 11, 12
    ]  # fmt: skip
    assert protocol.releaseall_args(SET, "t", None) == ["DLOCK.RELEASEALL", 2, *SET, "t"]


def test_a_set_is_checked_before_anything_is_sent() -> None:
    locks = dlock.Locks(redis.Redis(port=1))  # nothing listens there: nothing may be sent
    with pytest.raises(ValueError, match="appears twice"):
        locks.hold_all(["a", "b", "a"])
    with pytest.raises(ValueError, match="1 to 64"):
        locks.hold_all([])
    with pytest.raises(ValueError, match="1 to 64"):
        locks.hold_all([f"k{i}" for i in range(65)])
    with pytest.raises(TypeError, match="a list of resources"):
        locks.hold_all("ab")
    with pytest.raises(ValueError, match="ttl"):
        dlock.asyncio.Locks(redis.asyncio.Redis(port=1)).hold_all(["a"], ttl=0)


def test_a_set_is_granted_whole_renewed_and_released_whole(
    server: Server, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dlock")
    locks = dlock.Locks(server.client())
    try:
        with locks.hold_all(SET, ttl=0.6, timeout=0) as lease:
            assert lease.resources == SET
            first, second = lease.fences
            assert second > first > 0, "a fence per member, in the order asked"
            assert (lease.fence(SET[0]), lease.fence(SET[1])) == (first, second)
            with pytest.raises(KeyError):
                lease.fence("{acct}:carol")
            assert owner(r, SET[0]) == owner(r, SET[1]) == lease.token
            assert lease.fenced(SET[1], "SET", "{acct}:ledger", "1") == b"OK"
            time.sleep(0.9)  # past the ttl: renewals (RENEWALL) keep every member
            lease.check()
            assert int(cmd(r, "DLOCK.FENCECHECK", SET[0], first)) == 1
            assert int(cmd(r, "DLOCK.FENCECHECK", SET[1], second)) == 1
            assert calls(r, "dlock.renewall") >= 2
        assert lease.lost_reason is None
        assert r.exists(*SET) == 0, "every member released"
        assert calls(r, "dlock.releaseall") == 1
        assert calls(r, "dlock.release") == 0
    finally:
        locks.close()
    assert locks.metrics.get("hold_seconds_count") == 1
    assert locks.metrics.get("acquire_seconds_count") == 1
    assert locks.metrics.get("release_failures") == 0
    released = [m.getMessage() for m in caplog.records if "lease released" in m.getMessage()]
    assert released == [
        f"dlock: lease released resource={SET[0]},{SET[1]} owner={lease.token}"
        f" fence={first},{second}"
    ]


def test_a_set_with_a_held_member_is_not_acquired_and_takes_nothing(
    server: Server, r: redis.Redis
) -> None:
    locks = dlock.Locks(server.client())
    try:
        with locks.hold(SET[1], ttl=10) as held:
            with pytest.raises(dlock.NotAcquired), locks.hold_all(SET, ttl=10, timeout=0):
                pytest.fail("granted a set with a held member")
            assert r.exists(SET[0]) == 0, "nothing of the set was taken"
            assert owner(r, SET[1]) == held.token
            # With a wait that ends unsatisfied: its tickets leave every line.
            with pytest.raises(dlock.NotAcquired), locks.hold_all(SET, ttl=10, timeout=0.3):
                pytest.fail("granted a set with a held member")
            assert r.exists(SET[0]) == 0
            assert info(r, SET[1]).get("tickets", 0) == 0, "withdrawn from the held member's line"
            assert calls(r, "dlock.releaseall") == 1, "one RELEASEALL without FENCES withdrew it"
    finally:
        locks.close()
    assert locks.metrics.get("acquire_failures", "held") == 2


def test_a_waiting_set_keeps_its_place_and_is_granted_when_the_member_frees(
    server: Server, r: redis.Redis
) -> None:
    locks = dlock.Locks(server.client())
    granted: list[tuple[float, dlock.SetLease]] = []
    single: list[int] = []
    leave_set = threading.Event()

    def set_holder() -> None:
        # A ticket of 8 s is refreshed every 2.7 s: only a member's channel explains a prompt grant.
        with locks.hold_all(SET, ttl=10, timeout=8) as lease:
            granted.append((time.monotonic(), lease))
            leave_set.wait(10)

    def single_waiter() -> None:
        with locks.hold(SET[0], ttl=10, timeout=8) as lease:
            single.append(lease.fence)

    waiting_set = threading.Thread(target=set_holder, daemon=True)
    waiting_single = threading.Thread(target=single_waiter, daemon=True)
    try:
        with locks.hold(SET[1], ttl=10) as held:
            waiting_set.start()
            assert wait_until(lambda: info(r, SET[0]).get("tickets") == 1, 5)
            assert info(r, SET[0]).get("holders", 0) == 0, "the waiting set holds nothing"
            waiting_single.start()
            assert wait_until(lambda: info(r, SET[0]).get("waiters") == 1, 5)
            time.sleep(0.1)
            assert not single, "the single request waits behind the set, the member free or not"
        released = time.monotonic()
        assert wait_until(lambda: bool(granted), 2)
        granted_at, lease = granted[0]
        assert granted_at - released < 1.0, f"granted {granted_at - released:.3f} s after"
        assert lease.fences[1] > held.fence
        assert owner(r, SET[0]) == lease.token
        assert info(r, SET[0]).get("waiters") == 1
        leave_set.set()
        waiting_set.join(5)
        waiting_single.join(5)
        assert single, "the single waiter was granted once the set left"
        assert single[0] > max(lease.fences)
    finally:
        leave_set.set()
        locks.close()


def test_a_set_retried_through_a_pause_keeps_its_token_and_gets_one_grant(
    own_server: Server,
) -> None:
    """ACQUIREALLs that time out while the server is stopped are retried with the same token:
    when it comes back, the set is granted once, the same fences answered to every copy."""
    client = own_server.client()
    locks = dlock.Locks(client, request_timeout=0.2)
    try:
        locks.features()  # a pooled connection made before the pause: the ACQUIREALL goes out
        own_server.stop_process()
        resume = threading.Timer(1.0, own_server.continue_process)
        resume.start()
        with locks.hold_all(SET, ttl=5, timeout=3) as lease:
            resume.join()
            for resource, fence in zip(lease.resources, lease.fences):
                found = fields(cmd(client, "DLOCK.INFO", resource))
                assert (found[b"owner"], found[b"fence"]) == (lease.token.encode(), fence)
        assert client.exists(*SET) == 0
        assert calls(client, "dlock.acquireall") >= 2, "the copy sent before the pause arrived"
    finally:
        own_server.continue_process()
        client.close()
        locks.close()
    assert locks.metrics.get("acquire_failures", "unknown") == 0


def test_an_operators_del_of_one_member_loses_the_whole_set(server: Server, r: redis.Redis) -> None:
    locks = dlock.Locks(server.client())
    try:
        with (
            pytest.raises(dlock.LeaseLost) as raised,
            locks.hold_all(SET, ttl=0.6, timeout=0) as lease,
        ):
            assert r.delete(SET[1]) == 1
            deleted = time.monotonic()
            assert lease.lost.wait(2)
            assert time.monotonic() - deleted < 0.2 + 0.3, "noticed by the next renewal"
            assert lease.lost_reason == "renewal_refused"
            with pytest.raises(dlock.LeaseLost):
                lease.check()
        assert raised.value.reason == "renewal_refused"
        assert raised.value.resources == SET
        assert raised.value.fences == lease.fences
        assert r.exists(SET[0]) == 0, "the rest of the set released"
        with pytest.raises(dlock.Stale):
            lease.fenced(SET[0], "SET", "{acct}:ledger", "late")
        assert r.exists("{acct}:ledger") == 0
    finally:
        locks.close()
    assert locks.metrics.get("leases_lost", "renewal_refused") == 1, "one set, one loss"
    assert locks.metrics.get("release_failures") == 0


def test_revoking_one_member_loses_the_set_as_revoked(server: Server, r: redis.Redis) -> None:
    locks = dlock.Locks(server.client())
    try:
        with (
            pytest.raises(dlock.LeaseLost) as raised,
            locks.hold_all(SET, ttl=60, timeout=0) as lease,
        ):
            # A ttl far above the test: only the member's channel can end the set in time.
            assert wait_until(lambda: listeners(r, SET[1]) == 1, 5, step=0.001)
            fence = lease.fence(SET[1])
            assert int(cmd(r, "DLOCK.REVOKE", SET[1], "FENCE", fence, "REASON", "stuck")) == 1
            assert lease.lost.wait(2)
            assert (lease.lost_reason, lease.lost_detail) == ("revoked", "stuck")
        assert (raised.value.reason, raised.value.detail) == ("revoked", "stuck")
        assert r.exists(SET[0]) == 0, "the member not revoked was released"
        assert wait_until(lambda: listeners(r, SET[0]) + listeners(r, SET[1]) == 0, 2)
    finally:
        locks.close()
    assert locks.metrics.get("leases_lost", "revoked") == 1
    assert locks.metrics.get("release_failures") == 0


def test_a_member_gone_before_the_release_is_the_loss_ended(server: Server, r: redis.Redis) -> None:
    locks = dlock.Locks(server.client())
    try:
        with pytest.raises(dlock.LeaseLost) as raised, locks.hold_all(SET, ttl=60) as lease:
            # Released behind the client's back; the next renewal is 20 s away.
            assert int(cmd(r, "DLOCK.RELEASE", SET[0], lease.token)) == 1
        assert raised.value.reason == "ended"
        assert r.exists(*SET) == 0
    finally:
        locks.close()
    assert locks.metrics.get("leases_lost", "ended") == 1
    assert locks.metrics.get("release_failures") == 0


def test_asyncio_a_set_is_granted_whole_and_released_whole(server: Server, r: redis.Redis) -> None:
    async def scenario() -> None:
        client = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(client)
        try:
            async with locks.hold(SET[1], ttl=10):
                with pytest.raises(dlock.NotAcquired):
                    async with locks.hold_all(SET, ttl=10, timeout=0):
                        pytest.fail("granted a set with a held member")
                assert r.exists(SET[0]) == 0
            async with locks.hold_all(SET, ttl=0.6, timeout=0) as lease:
                assert owner(r, SET[0]) == owner(r, SET[1]) == lease.token
                assert await lease.fenced(SET[0], "SET", "{acct}:ledger", "1") == b"OK"
                await asyncio.sleep(0.9)
                lease.check()
            assert r.exists(*SET) == 0
            with pytest.raises(dlock.LeaseLost) as raised:
                async with locks.hold_all(SET, ttl=60, timeout=0) as lease:
                    assert int(cmd(r, "DLOCK.RELEASE", SET[1], lease.token)) == 1
            assert raised.value.reason == "ended", "a member gone before the release"
            assert r.exists(*SET) == 0
        finally:
            await locks.aclose()
            await client.aclose()
        assert locks.metrics.get("hold_seconds_count") == 3
        assert locks.metrics.get("leases_lost", "ended") == 1

    asyncio.run(asyncio.wait_for(scenario(), 20))
    assert calls(r, "dlock.renewall") >= 2
    assert calls(r, "dlock.releaseall") == 2


def test_asyncio_a_waiting_set_is_granted_when_the_member_frees(
    server: Server, r: redis.Redis
) -> None:
    async def scenario() -> None:
        client = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(client)
        try:
            async with locks.hold(SET[0], ttl=10) as held:

                async def set_holder() -> tuple[float, tuple[int, ...]]:
                    async with locks.hold_all(SET, ttl=10, timeout=8) as lease:
                        return time.monotonic(), lease.fences

                waiting = asyncio.ensure_future(set_holder())
                for _ in range(500):
                    if info(r, SET[1]).get("tickets") == 1:
                        break
                    await asyncio.sleep(0.01)
                assert info(r, SET[1]).get("tickets") == 1
                assert owner(r, SET[1]) is None, "the waiting set keeps the free member, not holds"
            released = time.monotonic()
            granted_at, fences = await asyncio.wait_for(waiting, 5)
            assert granted_at - released < 1.0, f"granted {granted_at - released:.3f} s after"
            assert fences[0] > held.fence
        finally:
            await locks.aclose()
            await client.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 20))
    assert r.exists(*SET) == 0


def test_asyncio_a_lost_member_cancels_the_body_and_raises_lease_lost(
    server: Server, r: redis.Redis
) -> None:
    async def scenario() -> None:
        client = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(client)
        try:
            with pytest.raises(dlock.LeaseLost) as raised:
                async with locks.hold_all(SET, ttl=60, timeout=0) as lease:
                    for _ in range(500):
                        if listeners(r, SET[0]) == 1:
                            break
                        await asyncio.sleep(0.01)
                    fence = lease.fence(SET[0])
                    assert int(cmd(r, "DLOCK.REVOKE", SET[0], "FENCE", fence)) == 1
                    await asyncio.sleep(10)  # the work, cancelled by the loss
            assert raised.value.reason == "revoked"
            assert r.exists(SET[1]) == 0, "the member not revoked was released"
            with pytest.raises(dlock.LeaseLost) as deleted:
                async with locks.hold_all(SET, ttl=0.6, timeout=0):
                    assert r.delete(SET[0]) == 1
                    await asyncio.sleep(10)  # cancelled by the refused renewal
            assert deleted.value.reason == "renewal_refused"
            assert r.exists(SET[1]) == 0
        finally:
            await locks.aclose()
            await client.aclose()
        assert locks.metrics.get("leases_lost", "revoked") == 1
        assert locks.metrics.get("leases_lost", "renewal_refused") == 1

    asyncio.run(asyncio.wait_for(scenario(), 20))
