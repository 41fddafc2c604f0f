"""Shared leases with the asyncio client against a real server (each test runs its own event
loop): read-write locks and semaphores, a lost share cancelling its own body only."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Callable

import pytest
import redis
import redis.asyncio

import dlock
import dlock.asyncio
from conftest import Server, cmd, fields


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


async def line_length(r: redis.asyncio.Redis, resource: str, waiters: int) -> None:
    """Returns once ``waiters`` clients wait in the server's line for ``resource``."""
    for _ in range(500):
        reply = await cmd(r, "DLOCK.INFO", resource)
        if reply is not None and fields(reply)[b"waiters"] == waiters:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{waiters} waiters never stood in line for {resource}")


def test_readers_share_and_a_writer_keeps_its_place_in_line(server: Server) -> None:
    async def test() -> None:
        r = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(r)
        events: list[str] = []
        fences: dict[str, int] = {}

        async def reader(name: str, entered: asyncio.Event, leave: asyncio.Event) -> None:
            async with locks.read("doc", ttl=5, timeout=5) as lease:
                fences[name] = lease.fence
                events.append(f"{name} in")
                entered.set()
                await leave.wait()
                events.append(f"{name} out")

        async def writer() -> None:
            async with locks.write("doc", ttl=5, timeout=5) as lease:
                fences["writer"] = lease.fence
                events.append("writer in")
                await asyncio.sleep(0.1)
                events.append("writer out")

        leave, at_once = asyncio.Event(), asyncio.Event()
        entered = [asyncio.Event() for _ in range(3)]
        readers = [asyncio.create_task(reader(f"r{n}", entered[n], leave)) for n in range(2)]
        for event in entered[:2]:
            await event.wait()
        holders = fields(await cmd(r, "DLOCK.INFO", "doc"))[b"holders"]
        assert holders == 2, "two readers at once"
        queued = [asyncio.create_task(writer())]
        await line_length(r, "doc", 1)
        at_once.set()  # the late reader leaves as soon as it is in
        queued.append(asyncio.create_task(reader("late", entered[2], at_once)))
        await line_length(r, "doc", 2)
        leave.set()
        await asyncio.gather(*readers, *queued)
        assert sorted(events[:4]) == ["r0 in", "r0 out", "r1 in", "r1 out"]
        assert events[4:] == ["writer in", "writer out", "late in", "late out"]
        assert max(fences["r0"], fences["r1"]) < fences["writer"] < fences["late"]
        assert await r.exists("doc") == 0
        await locks.aclose()
        await r.aclose()

    run(test)


def test_a_semaphore_never_runs_more_tasks_than_permits(server: Server) -> None:
    async def test() -> None:
        r = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(r)
        permits = 4
        running = peak = 0
        fences: list[int] = []

        async def worker() -> None:
            nonlocal running, peak
            for _ in range(3):
                async with locks.semaphore("pool:http", permits, ttl=5, timeout=10) as permit:
                    running += 1
                    peak = max(peak, running)
                    fences.append(permit.fence)
                    await asyncio.sleep(0.02)
                    running -= 1

        await asyncio.gather(*(worker() for _ in range(10)))
        assert peak == permits
        assert len(fences) == 30
        assert len(set(fences)) == 30
        assert await r.exists("pool:http") == 0
        await locks.aclose()
        await r.aclose()

    run(test)


def test_a_lost_permit_cancels_its_own_body_only(server: Server) -> None:
    async def test() -> None:
        r = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(r)
        ttl = 0.9
        held = [asyncio.Event(), asyncio.Event()]
        leases: list[dlock.asyncio.Lease] = []
        outcomes: dict[int, str] = {}

        async def work(n: int) -> None:
            try:
                async with locks.semaphore("pool:{5}", 2, ttl=ttl) as permit:
                    leases.append(permit)
                    held[n].set()
                    await asyncio.sleep(10)
            except dlock.LeaseLost as lost:
                outcomes[n] = lost.reason

        first = asyncio.create_task(work(0))
        await held[0].wait()
        second = asyncio.create_task(work(1))
        await held[1].wait()
        a, b = leases
        # Another connection releases the first permit by its token.
        operator = redis.asyncio.Redis(port=server.port)
        assert await cmd(operator, "DLOCK.RELEASE", "pool:{5}", a.token) == 1
        await asyncio.wait_for(first, ttl / 3 + 0.5)
        assert outcomes == {0: "renewal_refused"}
        with pytest.raises(dlock.Stale):
            await a.fenced("SET", "pool:{5}:x", "a")
        assert not second.done()
        assert await b.fenced("SET", "pool:{5}:x", "b") == b"OK"
        # An operator's DEL ends the other one.
        await operator.delete("pool:{5}")
        await asyncio.wait_for(second, ttl / 3 + 0.5)
        assert outcomes == {0: "renewal_refused", 1: "renewal_refused"}
        assert locks.metrics.get("leases_lost", "renewal_refused") == 2
        await operator.aclose()
        await locks.aclose()
        await r.aclose()

    run(test)


def test_mode_conflicts_and_servers_without_shared_leases(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def test() -> None:
        r = redis.asyncio.Redis(port=server.port)
        locks = dlock.asyncio.Locks(r)
        (await locks._nodes.for_resource("old")).features = dlock.Features(
            acquire=frozenset({"WAIT", "CLAIM", "SHARED"})
        )
        with pytest.raises(dlock.Unsupported, match="too old") as raised:
            async with locks.semaphore("old", 3):
                pytest.fail("the body must not run")
        assert raised.value.option == "LIMIT"
        async with locks.read("old", timeout=0) as reader:
            assert reader.mode == "shared"
        # A token that holds an exclusive lease already (only a token reused on purpose).
        monkeypatch.setattr(dlock._common, "new_token", lambda: "reused-token")
        assert await cmd(r, "DLOCK.ACQUIRE", "mixed", "reused-token", 30000) is not None
        with pytest.raises(redis.ResponseError, match=r"^LOCKMODE"):
            async with locks.read("mixed", timeout=1):
                pytest.fail("the body must not run")
        assert fields(await cmd(r, "DLOCK.INFO", "mixed"))[b"owner"] == b"reused-token"
        await locks.aclose()
        await r.aclose()

    run(test)
