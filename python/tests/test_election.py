"""Leader election: ``locks.campaign`` and ``locks.observe`` against a real server (threaded and
asyncio, with both ways of waiting)."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import dlock
import dlock.asyncio
from conftest import Server, cmd, wait_until


def leader_address(r: redis.Redis, name: str) -> Any:
    return dlock._common.leader_from_info(cmd(r, "DLOCK.INFO", name))


class Observer:
    """Collects what ``observe`` yields, from a thread of its own."""

    def __init__(self, locks: dlock.Locks, name: str, interval: float = 2.0) -> None:
        self.seen: queue.Queue[dlock.Leader | None] = queue.Queue()
        self._iterator: Iterator[dlock.Leader | None] = locks.observe(name, interval=interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for leader in self._iterator:
            self.seen.put(leader)
            if self._stop.is_set():
                return

    def next(self, timeout: float = 5.0) -> dlock.Leader | None:
        return self.seen.get(timeout=timeout)


@pytest.mark.parametrize("wait", ["block", "tickets"])
def test_the_other_candidate_leads_when_the_leader_resigns(
    server: Server, r: redis.Redis, wait: str
) -> None:
    locks_a = dlock.Locks(server.client(), wait=wait)
    locks_b = dlock.Locks(server.client(), wait=wait)
    led: list[int] = []
    b_leads = threading.Event()

    def candidate_b() -> None:
        with locks_b.campaign("leader", address="10.0.0.2:80", ttl=5) as term:
            led.append(term.fence)
            b_leads.set()

    with locks_a.campaign("leader", address="10.0.0.1:80", ttl=5) as term_a:
        leader = leader_address(r, "leader")
        assert leader == dlock.Leader("10.0.0.1:80", term_a.fence, term_a.token)
        thread = threading.Thread(target=candidate_b, daemon=True)
        thread.start()
        time.sleep(0.2)
        assert not b_leads.is_set()  # waits while A leads
        resigned = time.monotonic()
    assert b_leads.wait(5)
    assert time.monotonic() - resigned < 0.5
    thread.join(5)
    assert led[0] > term_a.fence
    locks_a.close()
    locks_b.close()


def test_a_leader_that_vanished_is_replaced_when_its_term_runs_out(
    server: Server, r: redis.Redis
) -> None:
    locks = dlock.Locks(server.client(), wait="tickets")
    # A crashed leader: its lease is never renewed nor released.
    old = cmd(r, "DLOCK.ACQUIRE", "crashed", "gone-leader", 500, "META", "10.0.0.9:80")
    started = time.monotonic()
    with locks.campaign("crashed", address="10.0.0.3:80", ttl=5) as term:
        assert 0.4 < time.monotonic() - started < 1.5
        assert term.fence > old
        assert leader_address(r, "crashed").address == "10.0.0.3:80"
    locks.close()


def test_observe_sees_a_then_no_leader_then_b(server: Server, r: redis.Redis) -> None:
    locks = dlock.Locks(server.client(), wait="tickets")
    observer = Observer(locks, "office", interval=30)  # only the channel can be this quick
    assert observer.next() is None
    with locks.campaign("office", address="a:1", ttl=5) as term_a:
        seen_a = observer.next()
        assert seen_a == dlock.Leader("a:1", term_a.fence, term_a.token)
    assert observer.next() is None
    with locks.campaign("office", address="b:2", ttl=5):
        seen_b = observer.next()
        assert seen_b is not None
        assert seen_b.address == "b:2"
        assert seen_b.fence > term_a.fence
    assert observer.next() is None
    assert observer.seen.empty()
    locks.close()


def test_observe_notices_a_deleted_key_by_its_rereads(server: Server, r: redis.Redis) -> None:
    locks = dlock.Locks(server.client())
    iterator = locks.observe("deleted", interval=0.2)
    with pytest.raises(dlock.LeaseLost), locks.campaign("deleted", address="a:1", ttl=5):
        # The observer starts with the leader there.
        first = next(iterator)
        assert first is not None
        assert first.address == "a:1"
        r.delete("deleted")  # publishes nothing
        started = time.monotonic()
        assert next(iterator) is None
        assert time.monotonic() - started < 1.0
    iterator.close()
    assert wait_until(lambda: r.pubsub_numsub("dlock:{deleted}")[0][1] == 0, 5)
    locks.close()


def test_observe_checks_its_interval() -> None:
    with pytest.raises(ValueError, match="interval"):
        dlock.Locks(redis.Redis()).observe("x", interval=0)


def test_asyncio_campaign_and_observe(server: Server, r: redis.Redis) -> None:
    async def test() -> None:
        client = redis.asyncio.Redis(port=server.port)
        locks_a = dlock.asyncio.Locks(client, wait="tickets")
        locks_b = dlock.asyncio.Locks(client, wait="tickets")
        seen: asyncio.Queue[dlock.Leader | None] = asyncio.Queue()

        async def watch() -> None:
            observer: AsyncIterator[dlock.Leader | None] = locks_a.observe("aoffice", interval=30)
            async for leader in observer:
                await seen.put(leader)

        watcher = asyncio.create_task(watch())
        assert await asyncio.wait_for(seen.get(), 5) is None
        async with locks_a.campaign("aoffice", address="a:1", ttl=5) as term_a:
            leader = await asyncio.wait_for(seen.get(), 5)
            assert leader == dlock.Leader("a:1", term_a.fence, term_a.token)

            async def candidate_b() -> int:
                async with locks_b.campaign("aoffice", address="b:2", ttl=5) as term_b:
                    leader = await asyncio.wait_for(seen.get(), 5)
                    assert leader == dlock.Leader("b:2", term_b.fence, term_b.token)
                    return term_b.fence

            b = asyncio.create_task(candidate_b())
            await asyncio.sleep(0.2)
            assert not b.done()
        # A resigned with B in line: the lease passes to B at once (no leaderless moment).
        fence_b = await asyncio.wait_for(b, 5)
        assert fence_b > term_a.fence
        assert await asyncio.wait_for(seen.get(), 5) is None
        async with locks_a.campaign("aoffice", address="a:1", ttl=5):
            leader = await asyncio.wait_for(seen.get(), 5)
            assert leader is not None
            assert leader.address == "a:1"
            assert leader.fence > fence_b
        assert await asyncio.wait_for(seen.get(), 5) is None
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await locks_a.aclose()
        await locks_b.aclose()
        await client.aclose()

    asyncio.run(asyncio.wait_for(test(), 30))
