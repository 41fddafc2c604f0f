"""Waiting with tickets (``Locks(r, wait="tickets")``): ``DLOCK.ACQUIRE … QUEUE`` on the pooled
connections, woken by the resource's channel, against a real server (threaded and asyncio)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio

import dlock
import dlock.asyncio
from conftest import Server, cmd, fields, wait_until


def info(r: redis.Redis, resource: str) -> dict[Any, Any]:
    reply = cmd(r, "DLOCK.INFO", resource)
    if reply is None:
        return {}
    return {
        (key.decode() if isinstance(key, bytes) else key): value
        for key, value in fields(reply).items()
    }


def clients(r: redis.Redis) -> int:
    """Connections to the server, this one's own left out."""
    return len(r.client_list()) - 1


async def until_in_line(r: redis.Redis, resource: str, tickets: int = 1) -> None:
    for _ in range(1000):
        if info(r, resource).get("tickets") == tickets:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{resource}: not {tickets} tickets in line")


def run(test: Any) -> None:
    asyncio.run(asyncio.wait_for(test(), 50))


def test_the_wait_option_is_checked() -> None:
    with pytest.raises(ValueError, match="wait must be one of"):
        dlock.Locks(redis.Redis(), wait="poll")
    with pytest.raises(ValueError, match="ticket_ttl"):
        dlock.asyncio.Locks(redis.asyncio.Redis(), wait="tickets", ticket_ttl=0)


def test_two_hundred_ticket_waiters_share_a_few_connections_and_are_granted_in_order(
    server: Server, r: redis.Redis
) -> None:
    locks = dlock.Locks(server.client(), wait="tickets")
    before = clients(r)
    granted: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def waiter(number: int) -> None:
        try:
            with locks.hold("line", ttl=10, timeout=45) as lease:
                granted.append((number, lease.fence))
        except BaseException as error:
            errors.append(error)

    threads = []
    with locks.hold("line", ttl=30) as first:
        for number in range(200):
            thread = threading.Thread(target=waiter, args=(number,), daemon=True)
            thread.start()
            threads.append(thread)

            # One at a time into the line, so the order is known.
            def in_line(wanted: int = number + 1) -> bool:
                return bool(info(r, "line")["tickets"] == wanted)

            assert wait_until(in_line, 5)
        standing = info(r, "line")
        assert standing["tickets"] == 200
        assert standing["waiters"] == 0  # no blocked connection
        during = clients(r) - before
        print(f"\n200 ticket waiters: {during} connections of the Locks")
        assert during <= 6  # the pool's few and one pub/sub connection
    for thread in threads:
        thread.join(45)
    assert not errors
    assert [number for number, _ in granted] == list(range(200))
    fences = [fence for _, fence in granted]
    assert fences == sorted(fences)
    assert fences[0] > first.fence
    assert len(set(fences)) == 200
    stats = server.info()
    assert stats["dlock_waits_started"] == 0
    assert stats["dlock_tickets_granted"] == 200
    assert stats["dlock_claims_lapsed"] == 0
    assert info(r, "line") == {}
    locks.close()


def test_a_release_wakes_a_ticket_waiter_at_once(server: Server, r: redis.Redis) -> None:
    # A ticket of 30 s is refreshed every 10 s: only the channel can explain a prompt grant.
    locks = dlock.Locks(server.client(), wait="tickets", ticket_ttl=30)
    latencies = []
    for _round in range(5):
        granted_at: list[float] = []

        def waiter(granted_at: list[float] = granted_at) -> None:
            with locks.hold("prompt", ttl=5, timeout=20):
                granted_at.append(time.monotonic())

        with locks.hold("prompt", ttl=5):
            thread = threading.Thread(target=waiter, daemon=True)
            thread.start()
            assert wait_until(lambda: info(r, "prompt").get("tickets") == 1, 5)
            released = time.monotonic()
        thread.join(20)
        latencies.append(granted_at[0] - released)
    print(f"\nwake after release: {max(latencies) * 1000:.1f} ms at most")
    assert max(latencies) < 0.5
    locks.close()


def test_a_ticket_is_refreshed_while_it_waits(server: Server, r: redis.Redis) -> None:
    locks = dlock.Locks(server.client(), wait="tickets", ticket_ttl=0.3)
    with locks.hold("long", ttl=5):
        started = time.monotonic()
        with pytest.raises(dlock.NotAcquired), locks.hold("long", timeout=1.2):
            pass
        assert 1.2 <= time.monotonic() - started < 1.7
    stats = server.info()
    assert stats["dlock_tickets_lapsed"] <= 1  # only the withdrawn one
    assert stats["dlock_tickets_queued"] == 1
    locks.close()


def test_a_timed_out_ticket_leaves_no_grant_behind(server: Server, r: redis.Redis) -> None:
    locks = dlock.Locks(server.client(), wait="tickets")
    with locks.hold("gone", ttl=5):
        started = time.monotonic()
        with pytest.raises(dlock.NotAcquired), locks.hold("gone", timeout=0.3):
            pass
        assert 0.3 <= time.monotonic() - started < 0.6
        time.sleep(0.05)  # past the withdrawn ticket's last millisecond
    # Released with nobody left in line: no grant for the withdrawn ticket, no key.
    assert info(r, "gone") == {}
    assert r.exists("gone") == 0
    assert server.info()["dlock_tickets_granted"] == 0
    # And the next acquire gets it at once.
    with locks.hold("gone", timeout=0):
        pass
    locks.close()


def test_a_free_lock_with_tickets_is_one_acquire(server: Server, r: redis.Redis) -> None:
    locks = dlock.Locks(server.client(), wait="tickets")
    with locks.hold("free", timeout=5) as lease:
        assert lease.fence > 0
    # No wait: no ticket, no subscription.
    held, again = locks.hold("free", timeout=0), locks.hold("free", timeout=0)
    with held, pytest.raises(dlock.NotAcquired), again:
        pass
    stats = server.info()
    assert stats["dlock_tickets_queued"] == 0  # granted at once: no place in line taken
    assert stats["dlock_tickets_granted"] == 0
    assert locks._nodes.channels("free").subscribed() == 0
    assert stats["dlock_waits_started"] == 0
    locks.close()


def test_readers_writers_and_permits_wait_with_tickets(server: Server, r: redis.Redis) -> None:
    locks = dlock.Locks(server.client(), wait="tickets")
    order: list[str] = []
    lock = threading.Lock()

    def run_in_thread(name: str, hold: Any) -> threading.Thread:
        def body() -> None:
            with hold() as lease:
                with lock:
                    order.append(f"{name}:{lease.mode}")
                time.sleep(0.05)

        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        return thread

    with locks.write("doc", ttl=5):
        readers = [
            run_in_thread(f"reader{i}", lambda: locks.read("doc", ttl=5, timeout=10))
            for i in range(3)
        ]
        assert wait_until(lambda: info(r, "doc").get("tickets") == 3, 5)
    for thread in readers:
        thread.join(10)
    assert sorted(order) == ["reader0:shared", "reader1:shared", "reader2:shared"]

    order.clear()
    with locks.semaphore("pool", 2, ttl=5), locks.semaphore("pool", 2, ttl=5):
        third = run_in_thread("third", lambda: locks.semaphore("pool", 2, ttl=5, timeout=10))
        assert wait_until(lambda: info(r, "pool").get("tickets") == 1, 5)
        assert order == []
    third.join(10)
    assert order == ["third:shared"]
    assert server.info()["dlock_waits_started"] == 0
    locks.close()


def test_a_server_without_queue_gets_wait(server: Server, r: redis.Redis) -> None:
    locks = dlock.Locks(server.client(), wait="tickets")
    locks._nodes.for_resource("old").features = dlock.Features(acquire=frozenset({"WAIT", "CLAIM"}))
    with locks.hold("old", ttl=5):
        thread = threading.Thread(
            target=lambda: locks.hold("old", ttl=5, timeout=5).__enter__(), daemon=True
        )
        thread.start()
        assert wait_until(lambda: info(r, "old").get("waiters") == 1, 5)
    thread.join(5)
    stats = server.info()
    assert stats["dlock_waits_granted"] == 1
    assert stats["dlock_tickets_queued"] == 0
    locks.close()


def test_the_channel_connection_comes_back_after_it_was_killed(
    server: Server, r: redis.Redis
) -> None:
    locks = dlock.Locks(server.client(), wait="tickets", ticket_ttl=30)
    granted = threading.Event()

    def waiter() -> None:
        with locks.hold("back", ttl=5, timeout=20):
            granted.set()

    with locks.hold("back", ttl=5):
        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        assert wait_until(lambda: info(r, "back").get("tickets") == 1, 5)
        r.client_kill_filter(_type="pubsub")
        # Resubscribed to its own channel (the waiter re-sends on the new subscription).
        assert wait_until(lambda: len(r.pubsub_channels("dlock:{back}:*")) == 1, 5)
        released = time.monotonic()
    assert granted.wait(5)
    assert time.monotonic() - released < 1.0
    thread.join(5)
    locks.close()


# asyncio


def test_asyncio_two_hundred_ticket_waiters(server: Server, r: redis.Redis) -> None:
    async def test() -> None:
        client = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(client, wait="tickets")
        before = clients(r)
        granted: list[tuple[int, int]] = []

        async def waiter(number: int) -> None:
            async with locks.hold("aline", ttl=10, timeout=45) as lease:
                granted.append((number, lease.fence))

        tasks = []
        async with locks.hold("aline", ttl=30) as first:
            for number in range(200):
                tasks.append(asyncio.create_task(waiter(number)))
                await until_in_line(r, "aline", number + 1)
            during = clients(r) - before
            print(f"\n200 asyncio ticket waiters: {during} connections of the Locks")
            assert during <= 6
            assert info(r, "aline")["waiters"] == 0
        await asyncio.gather(*tasks)
        assert [number for number, _ in granted] == list(range(200))
        fences = [fence for _, fence in granted]
        assert fences == sorted(fences)
        assert fences[0] > first.fence
        await locks.aclose()
        await client.aclose()

    run(test)
    assert server.info()["dlock_tickets_granted"] == 200
    assert server.info()["dlock_waits_started"] == 0


def test_asyncio_a_release_wakes_a_ticket_waiter_at_once(server: Server, r: redis.Redis) -> None:
    async def test() -> None:
        client = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(client, wait="tickets", ticket_ttl=30)
        latencies = []
        for _round in range(5):
            granted_at: list[float] = []

            async def waiter(granted_at: list[float] = granted_at) -> None:
                async with locks.hold("aprompt", ttl=5, timeout=20):
                    granted_at.append(time.monotonic())

            async with locks.hold("aprompt", ttl=5):
                task = asyncio.create_task(waiter())
                await until_in_line(r, "aprompt")
                released = time.monotonic()
            await task
            latencies.append(granted_at[0] - released)
        print(f"\nasyncio wake after release: {max(latencies) * 1000:.1f} ms at most")
        assert max(latencies) < 0.5
        await locks.aclose()
        await client.aclose()

    run(test)


def test_asyncio_a_timed_out_or_cancelled_ticket_leaves_no_grant(
    server: Server, r: redis.Redis
) -> None:
    async def test() -> None:
        client = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(client, wait="tickets")
        async with locks.hold("agone", ttl=5):
            started = time.monotonic()
            with pytest.raises(dlock.NotAcquired):
                async with locks.hold("agone", timeout=0.3):
                    pass
            assert 0.3 <= time.monotonic() - started < 0.6

            async def cancelled() -> None:
                async with locks.hold("agone", timeout=10):
                    pass

            task = asyncio.create_task(cancelled())
            await until_in_line(r, "agone")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.05)
        assert info(r, "agone") == {}
        await locks.aclose()
        await client.aclose()

    run(test)
    assert server.info()["dlock_tickets_granted"] == 0


@pytest.mark.parametrize(
    "options",
    [{"protocol": 3}, {"decode_responses": True}, {"protocol": 3, "decode_responses": True}],
)
def test_tickets_and_observe_with_resp3_and_decoded_replies(
    server: Server, r: redis.Redis, options: dict[str, Any]
) -> None:
    locks = dlock.Locks(server.client(**options), wait="tickets", ticket_ttl=30)
    observer = locks.observe("resp", interval=30)
    assert next(observer) is None
    granted, leave = threading.Event(), threading.Event()

    def waiter() -> None:
        with locks.campaign("resp", address="b:2", ttl=5):
            granted.set()
            leave.wait(5)

    with locks.campaign("resp", address="a:1", ttl=5) as term:
        leader = next(observer)
        assert leader == dlock.Leader("a:1", term.fence, term.token)
        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        assert wait_until(lambda: info(r, "resp").get("tickets") == 1, 5)
        released = time.monotonic()
    assert granted.wait(5)
    assert time.monotonic() - released < 0.5
    # The generator reads when it is asked: B leads now.
    seen = next(observer)
    assert seen is not None
    assert seen.address == "b:2"
    leave.set()
    thread.join(5)
    assert next(observer) is None
    observer.close()
    locks.close()

    async def test() -> None:
        client = redis.asyncio.Redis(port=server.port, **options)
        alocks = dlock.asyncio.Locks(client, wait="tickets", ticket_ttl=30)
        aobserver = alocks.observe("aresp", interval=30)
        assert await aobserver.__anext__() is None
        async with alocks.campaign("aresp", address="c:3", ttl=5) as term:
            leader = await aobserver.__anext__()
            assert leader == dlock.Leader("c:3", term.fence, term.token)
        assert await aobserver.__anext__() is None
        await aobserver.aclose()
        await alocks.aclose()
        await client.aclose()

    run(test)


def acquire_calls(r: redis.Redis) -> int:
    """How many ``DLOCK.ACQUIRE`` calls the server has run (``INFO commandstats``)."""
    stats: dict[str, Any] = r.info("commandstats")
    return int(stats.get("cmdstat_dlock.acquire", {}).get("calls", 0))


def test_the_tag_is_fnv1a_32_of_the_token_and_only_a_handoff_to_it_wakes() -> None:
    from dlock._common import token_tag, wakes

    assert token_tag("") == "811c9dc5"
    assert token_tag("a") == "e40c292c"
    assert token_tag("foobar") == "bf9cf968"
    mine = token_tag("mine")
    for quiet in ("acquired 5", "released 5", "expired 5", "renewed 5", "handoff 6 00000000"):
        assert not wakes(quiet, mine), quiet
    assert wakes(f"handoff 6 {mine}", mine)
    assert wakes("handoff 6", mine), "an older server names nobody"
    assert wakes("released 5", None), "an observer wakes on everything"


WAITERS = 200


def test_a_hand_over_with_two_hundred_tickets_standing_costs_a_few_acquires(
    server: Server, r: redis.Redis
) -> None:
    # Tickets of 60 s are refreshed every 20 s: only the channel wakes them during the test.
    locks = dlock.Locks(server.client(), wait="tickets", ticket_ttl=60)
    granted: list[int] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def waiter(number: int) -> None:
        try:
            with locks.hold("herd", ttl=30, timeout=45):
                granted.append(number)
                done.wait(45)
        except BaseException as error:
            errors.append(error)

    assert cmd(r, "DLOCK.ACQUIRE", "herd", "holder", 30_000) is not None
    threads = [threading.Thread(target=waiter, args=(n,), daemon=True) for n in range(WAITERS)]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: info(r, "herd").get("tickets") == WAITERS, 20)
    time.sleep(0.3)  # every first ACQUIRE answered
    before = acquire_calls(r)
    assert cmd(r, "DLOCK.RELEASE", "herd", "holder") == 1
    assert wait_until(lambda: len(granted) == 1, 5)
    time.sleep(0.5)  # room for the waiters that would wake on the messages to ask
    calls = acquire_calls(r) - before
    print(f"\n{WAITERS} tickets standing: {calls} ACQUIREs for one hand-over")
    assert len(granted) == 1
    assert calls <= 5, f"only the new holder asks: {calls} ACQUIREs"
    done.set()
    for thread in threads:
        thread.join(45)
    assert not errors
    assert len(granted) == WAITERS
    locks.close()


def test_asyncio_a_hand_over_with_two_hundred_tickets_standing_costs_a_few_acquires(
    server: Server, r: redis.Redis
) -> None:
    async def test() -> None:
        client = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(client, wait="tickets", ticket_ttl=60)
        granted: list[int] = []
        done = asyncio.Event()

        async def waiter(number: int) -> None:
            async with locks.hold("aherd", ttl=30, timeout=45):
                granted.append(number)
                await done.wait()

        assert cmd(r, "DLOCK.ACQUIRE", "aherd", "holder", 30_000) is not None
        tasks = [asyncio.create_task(waiter(n)) for n in range(WAITERS)]
        await until_in_line(r, "aherd", WAITERS)
        await asyncio.sleep(0.3)  # every first ACQUIRE answered
        before = acquire_calls(r)
        assert cmd(r, "DLOCK.RELEASE", "aherd", "holder") == 1
        for _ in range(1000):
            if granted:
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.5)  # room for the waiters that would wake on the messages to ask
        calls = acquire_calls(r) - before
        print(f"\n{WAITERS} asyncio tickets standing: {calls} ACQUIREs for one hand-over")
        assert len(granted) == 1
        assert calls <= 5, f"only the new holder asks: {calls} ACQUIREs"
        done.set()
        await asyncio.gather(*tasks)
        assert len(granted) == WAITERS
        await locks.aclose()
        await client.aclose()

    run(test)


def calls(r: redis.Redis, command: str) -> int:
    stats = r.info("commandstats")
    entry = stats.get(f"cmdstat_{command}")
    return int(entry["calls"]) if entry else 0


def test_a_ticket_starts_on_its_own_message_and_the_renewer_claims_it(
    server: Server, r: redis.Redis
) -> None:
    """Told of its grant on its own channel (``NOTIFY``), a ticket's hold starts on the message:
    no ACQUIRE claims the turn; the renewer's first RENEW does, at once, and the local expiry
    is the claim window from a request sent before the grant until then."""
    locks = dlock.Locks(server.client(), wait="tickets", ticket_ttl=30)
    assert cmd(r, "DLOCK.ACQUIRE", "gate", "holder", 30_000) is not None
    seen: list[tuple[float, float, int]] = []
    release = threading.Event()

    def waiter() -> None:
        with locks.hold("gate", ttl=60, timeout=20) as lease:
            seen.append((time.monotonic(), lease.local_expiry, calls(r, "dlock.acquire")))
            release.wait(20)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert wait_until(lambda: info(r, "gate").get("tickets") == 1, 5)
    assert wait_until(lambda: len(r.pubsub_channels("dlock:{gate}:*")) == 1, 5)
    time.sleep(0.1)  # the first ACQUIRE answered
    acquires = calls(r, "dlock.acquire")
    released = time.monotonic()
    assert cmd(r, "DLOCK.RELEASE", "gate", "holder") == 1
    assert wait_until(lambda: bool(seen), 5)
    granted_at, local_expiry, acquires_then = seen[0]
    assert acquires_then == acquires, "no ACQUIRE claimed the turn"
    assert granted_at - released < 0.5
    assert local_expiry <= released + 30, "the claim window until the claim is read"
    # The renewer claims at once: the server's lease runs the full ttl.
    assert wait_until(lambda: int(info(r, "gate").get("ttl-ms", 0)) > 30_000, 5)
    assert calls(r, "dlock.renew") >= 1
    release.set()
    thread.join(5)
    assert info(r, "gate").get("owner") is None
    locks.close()


def test_asyncio_a_ticket_starts_on_its_own_message(server: Server, r: redis.Redis) -> None:
    async def test() -> None:
        client = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(client, wait="tickets", ticket_ttl=30)
        assert cmd(r, "DLOCK.ACQUIRE", "agate", "holder", 30_000) is not None
        seen: list[int] = []

        async def waiter() -> None:
            async with locks.hold("agate", ttl=60, timeout=20):
                seen.append(calls(r, "dlock.acquire"))
                for _ in range(500):
                    if int(info(r, "agate").get("ttl-ms", 0)) > 30_000:
                        break
                    await asyncio.sleep(0.01)

        task = asyncio.create_task(waiter())
        await until_in_line(r, "agate")
        for _ in range(500):
            if r.pubsub_channels("dlock:{agate}:*"):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        acquires = calls(r, "dlock.acquire")
        assert cmd(r, "DLOCK.RELEASE", "agate", "holder") == 1
        await task
        assert seen == [acquires], "no ACQUIRE claimed the turn"
        assert calls(r, "dlock.renew") >= 1, "the renewer claimed it"
        await locks.aclose()
        await client.aclose()

    run(test)
