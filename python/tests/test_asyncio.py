"""The asyncio client against a real server (each test runs its own event loop)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any, Callable

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

import dlock
import dlock.asyncio
from conftest import LinkProxy, Pair, Server, cmd, fields, wait_until


async def eventually(
    probe: Callable[[], Coroutine[Any, Any, int]], wanted: int, timeout: float
) -> bool:
    """Polls ``probe`` until it answers ``wanted`` or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while True:
        if await probe() == wanted:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def test_hold_acquires_renews_and_releases(server: Server) -> None:
    async def test() -> None:
        r = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(r)
        async with locks.hold("invoice:123", ttl=0.9, timeout=1) as lease:
            assert lease.fence > 0
            assert await lease.fenced("SET", "invoice:123:total", "10") == b"OK"
            await asyncio.sleep(1.8)  # two ttls: renewals keep it
            lease.check()
            assert await cmd(r, "DLOCK.FENCECHECK", "invoice:123", lease.fence) == 1
        assert await r.exists("invoice:123") == 0
        assert locks.metrics.get("hold_seconds_count") == 1
        await locks.aclose()
        await r.aclose()

    run(test)
    assert server.info()["dlock_renew_ok"] >= 2


def test_a_lost_lease_cancels_the_body_and_raises_lease_lost(server: Server) -> None:
    body_cancelled = False

    async def test() -> None:
        nonlocal body_cancelled
        r = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(r)
        ttl = 1.5
        deleted_at = 0.0
        with pytest.raises(dlock.LeaseLost) as raised:
            async with locks.hold("deleted", ttl=ttl) as lease:
                await r.delete("deleted")
                deleted_at = time.monotonic()
                try:
                    await asyncio.sleep(30)  # the work; never checks anything
                except asyncio.CancelledError:
                    body_cancelled = True
                    raise
        # Noticed by the next renewal, at most a third of the ttl later.
        assert time.monotonic() - deleted_at <= ttl / 3 + 0.5
        assert raised.value.reason == "renewal_refused"
        assert raised.value.fence == lease.fence
        assert isinstance(raised.value.__cause__, asyncio.CancelledError)
        # The task itself is not left cancelled: it goes on normally.
        await asyncio.sleep(0.01)
        await locks.aclose()
        await r.aclose()

    run(test)
    assert body_cancelled


def test_a_stopped_server_cancels_the_body(own_server: Server) -> None:
    async def test() -> None:
        r = redis.asyncio.Redis(port=own_server.port)
        locks = dlock.asyncio.Locks(r, request_timeout=0.2)
        try:
            with pytest.raises(dlock.LeaseLost) as raised:
                async with locks.hold("frozen", ttl=1.0):
                    own_server.stop_process()
                    await asyncio.sleep(30)
            assert raised.value.reason == "unreachable"
        finally:
            own_server.continue_process()
        await locks.aclose()
        await r.aclose()

    run(test)


def test_cancellation_from_outside_stays_a_cancellation(server: Server) -> None:
    async def test() -> None:
        r = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(r)
        entered = asyncio.Event()

        async def worker() -> None:
            async with locks.hold("outside", ttl=5):
                entered.set()
                await asyncio.sleep(30)

        task = asyncio.ensure_future(worker())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Released on the way out.
        assert await r.exists("outside") == 0
        await locks.aclose()
        await r.aclose()

    run(test)


def test_a_long_wait_is_one_server_side_wait(server: Server) -> None:
    async def test() -> None:
        impatient = redis.asyncio.Redis(
            port=server.port, socket_timeout=0.3, retry=Retry(ExponentialBackoff(), 5)
        )
        await cmd(impatient, "DLOCK.ACQUIRE", "slow", "holder", 30000)
        locks = dlock.asyncio.Locks(impatient)

        async def release_later() -> None:
            await asyncio.sleep(1.0)
            await cmd(impatient, "DLOCK.RELEASE", "slow", "holder")

        releaser = asyncio.ensure_future(release_later())
        async with locks.hold("slow", ttl=5, timeout=5.0) as lease:
            assert await cmd(impatient, "DLOCK.FENCECHECK", "slow", lease.fence) == 1
        await releaser
        with pytest.raises(dlock.NotAcquired):
            await cmd(impatient, "DLOCK.ACQUIRE", "slow", "holder", 30000)
            async with locks.hold("slow", ttl=5, timeout=1.5):
                pytest.fail("the body must not run")
        await locks.aclose()
        await impatient.aclose()

    run(test)
    info = server.info()
    assert info["dlock_waits_started"] == 2
    assert info["dlock_waits_granted"] == 1
    assert info["dlock_waits_timed_out"] == 1


def test_stale_write_and_errors(server: Server) -> None:
    async def test() -> None:
        r = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(r)
        with pytest.raises(dlock.LeaseLost):
            async with locks.hold("inv:{1}", ttl=30) as old:
                await r.delete("inv:{1}")
                async with locks.hold("inv:{1}", ttl=30, timeout=0) as new:
                    await new.fenced("SET", "inv:{1}:status", "paid")
                    with pytest.raises(dlock.Stale):
                        await old.fenced("SET", "inv:{1}:status", "failed")
        assert await r.get("inv:{1}:status") == b"paid"
        # The body's own exception is never masked.
        with pytest.raises(ZeroDivisionError):
            async with locks.hold("inv:{1}", ttl=30):
                _ = 1 / 0
        await r.set("plain", "x")
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            async with locks.hold("plain", ttl=5):
                pytest.fail("the body must not run")
        await locks.aclose()
        await r.aclose()

    run(test)


def test_one_renewal_task_for_many_leases(server: Server) -> None:
    async def test() -> None:
        r = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(r)

        async def work(n: int) -> int:
            async with locks.hold(f"many:{n}", ttl=0.9) as lease:
                await asyncio.sleep(1.0)
                lease.check()
                return lease.fence

        def renewers() -> int:
            return sum(1 for task in asyncio.all_tasks() if task.get_name() == "dlock-renewer")

        gathered = asyncio.gather(*(work(n) for n in range(5)))
        await asyncio.sleep(0.5)
        assert renewers() == 1
        fences = await gathered
        assert len(set(fences)) == 5
        await asyncio.sleep(0.05)
        assert renewers() == 0
        await locks.aclose()
        await r.aclose()

    run(test)


def test_max_hold_cancels_the_body_and_one_locks_serves_two_event_loops(server: Server) -> None:
    r = redis.Redis(port=server.port)
    # One Locks over two asyncio.run() calls, each with its own loop and client.
    locks: dict[str, dlock.asyncio.Locks] = {}

    async def bounded() -> None:
        client = redis.asyncio.Redis(port=server.port)
        locks.setdefault("shared", dlock.asyncio.Locks(client))
        started = time.monotonic()
        with pytest.raises(dlock.LeaseLost) as raised:
            async with locks["shared"].hold("bounded", ttl=30, max_hold=0.5):
                await asyncio.sleep(30)
        assert raised.value.reason == "max_hold"
        assert time.monotonic() - started < 0.5 + 1.0
        await client.aclose()

    run(bounded)
    run(bounded)
    assert r.exists("bounded") == 0
    r.close()


def test_a_loss_seen_by_check_in_a_blocking_body_is_raised_once(own_server: Server) -> None:
    async def test() -> None:
        r = redis.asyncio.Redis(port=own_server.port)
        locks = dlock.asyncio.Locks(r, request_timeout=0.2)
        try:
            with pytest.raises(dlock.LeaseLost) as raised:
                async with locks.hold("blocking", ttl=0.5) as lease:
                    own_server.stop_process()
                    # A body that blocks the loop: no renewal can run; check() sees the expiry,
                    # with no renewal sent: the process did not run in time, whatever the server.
                    time.sleep(max(0.0, lease.local_expiry - time.monotonic()) + 0.01)  # noqa: ASYNC251
                    lease.check()
            assert raised.value.reason == "stalled"
            own_server.continue_process()
            # The cancellation the loss asked for does not leak out of the block.
            await asyncio.sleep(0.05)
        finally:
            own_server.continue_process()
        await locks.aclose()
        await r.aclose()

    run(test)


def test_a_body_that_blocks_the_loop_past_the_ttl_loses_the_lease_as_stalled(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """The server answers all along, but the renewal task cannot run: the lease is lost as
    ``stalled`` (not ``unreachable``), counted once, and its RELEASE after the loss is not a
    release failure."""
    caplog.set_level(logging.WARNING, logger="dlock")

    async def test() -> None:
        r = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(r)
        ttl = 0.6
        with pytest.raises(dlock.LeaseLost) as raised:
            async with locks.hold("blocked", ttl=ttl):
                time.sleep(ttl + 0.2)  # noqa: ASYNC251 (the point: the loop is blocked)
                await asyncio.sleep(5)  # cancelled by the loss
        assert raised.value.reason == "stalled"
        assert locks.metrics.get("leases_lost", "stalled") == 1
        assert locks.metrics.get("release_failures") == 0
        await locks.aclose()
        await r.aclose()

    run(test)
    assert "release failed" not in caplog.text
    assert caplog.text.count("dlock: lease lost") == 1


def test_mutual_exclusion_under_contention(server: Server) -> None:
    async def test() -> None:
        r = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(r)

        async def worker() -> None:
            for _ in range(10):
                async with locks.hold("counter", ttl=5, timeout=10) as lease:
                    value = int(await cmd(r, "GET", "counter:value") or 0)
                    await asyncio.sleep(0.001)
                    await lease.fenced("SET", "counter:value", str(value + 1))

        await asyncio.gather(*(worker() for _ in range(4)))
        assert await cmd(r, "GET", "counter:value") == b"40"
        await locks.aclose()
        await r.aclose()

    run(test)


def test_a_waiter_cancelled_while_waiting_leaves_no_grant_behind(server: Server) -> None:
    async def test() -> None:
        r = redis.asyncio.Redis(port=server.port)
        await cmd(r, "DLOCK.ACQUIRE", "queued", "holder", 30000)
        locks = dlock.asyncio.Locks(r)

        async def waiter() -> None:
            async with locks.hold("queued", ttl=30, timeout=10):
                pytest.fail("the body must not run")

        task = asyncio.ensure_future(waiter())

        async def waiters() -> int:
            return int(fields(await cmd(r, "DLOCK.INFO", "queued"))[b"waiters"])

        assert await eventually(waiters, 1, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The waiter left the queue with its connection: the release frees the lock for nobody.
        assert await eventually(waiters, 0, 5)
        assert await cmd(r, "DLOCK.RELEASE", "queued", "holder") == 1
        assert await r.exists("queued") == 0
        await locks.aclose()
        await r.aclose()

    run(test)


async def handed_over_while_silent(
    r: redis.asyncio.Redis, proxy: LinkProxy, locks: dlock.asyncio.Locks, resource: str
) -> asyncio.Task[None]:
    """A waiter (its task, returned) to whom the server hands ``resource`` over while every open
    connection through ``proxy`` is silent: the fence never reaches it."""
    await locks.features(resource)  # a pooled connection, silenced with the wait's
    await cmd(r, "DLOCK.ACQUIRE", resource, "holder", 30000)

    async def waiter() -> None:
        async with locks.hold(resource, ttl=30, timeout=0.5):
            pytest.fail("the body must not run")

    task = asyncio.ensure_future(waiter())

    async def waiters() -> int:
        return int(fields(await cmd(r, "DLOCK.INFO", resource))[b"waiters"])

    assert await eventually(waiters, 1, 5)
    proxy.silence_open_connections()
    assert await cmd(r, "DLOCK.RELEASE", resource, "holder") == 1
    assert await owner(r, resource) not in (None, b"holder"), "handed over to the waiter"
    return task


async def owner(r: redis.asyncio.Redis, resource: str) -> bytes | None:
    info = await cmd(r, "DLOCK.INFO", resource)
    return None if info is None else fields(info)[b"owner"]


def test_a_hand_over_the_client_gave_up_on_is_released_from_a_new_connection(
    server: Server,
) -> None:
    """See the threaded client's test: released long before the claim window would lapse."""

    async def test() -> None:
        r = redis.asyncio.Redis(port=server.port)
        proxy = LinkProxy(server.port)
        through = redis.asyncio.Redis(port=proxy.port)
        locks = dlock.asyncio.Locks(through, request_timeout=2.0, release_timeout=0.2)
        try:
            task = await handed_over_while_silent(r, proxy, locks, "handed")
            with pytest.raises(redis.TimeoutError):
                await task
            assert await owner(r, "handed") is None, "released, not left to its claim window"
        finally:
            await locks.aclose()
            await through.aclose()
            await r.aclose()
            proxy.close()

    run(test)


def test_a_waiter_cancelled_as_the_lease_is_handed_over_releases_it(server: Server) -> None:
    async def test() -> None:
        r = redis.asyncio.Redis(port=server.port)
        proxy = LinkProxy(server.port)
        through = redis.asyncio.Redis(port=proxy.port)
        locks = dlock.asyncio.Locks(through, request_timeout=2.0, release_timeout=0.2)
        try:
            task = await handed_over_while_silent(r, proxy, locks, "cancelled")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await owner(r, "cancelled") is None, "released, not left to its claim window"
        finally:
            await locks.aclose()
            await through.aclose()
            await r.aclose()
            proxy.close()

    run(test)


def test_a_blocked_wait_goes_on_while_its_primary_is_a_replica(pair: Pair) -> None:
    """As the threaded client's test: ``UNBLOCKED``, then ``READONLY`` retried until the primary
    is one again, and the wait served there."""
    held = pair.hold("ademoted", 3000)

    async def test() -> None:
        r = redis.asyncio.Redis(port=pair.primary.port)
        locks = dlock.asyncio.Locks(r, request_timeout=1)

        async def wait_in_line() -> tuple[int, bool]:
            async with locks.hold("ademoted", ttl=5, timeout=20) as lease:
                owner = fields(await cmd(r, "DLOCK.INFO", "ademoted"))[b"owner"]
                return lease.fence, owner == lease.token.encode()

        async def waiters() -> int:
            return int(fields(await cmd(r, "DLOCK.INFO", "ademoted"))[b"waiters"])

        waiting = asyncio.ensure_future(wait_in_line())
        assert await eventually(waiters, 1, 5), "the waiter blocks"
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, pair.demote)
        refused = await loop.run_in_executor(
            None, wait_until, lambda: pair.readonly_answers() >= 2, 5
        )
        assert refused, "retries refused READONLY"
        await loop.run_in_executor(None, pair.promote_back)
        fence, owns = await waiting
        assert fence > held
        assert owns
        await locks.aclose()
        await r.aclose()

    run(test)
