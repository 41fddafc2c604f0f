"""Shared leases with the threaded client against a real server: read-write locks
(``locks.read``, ``locks.write``) and semaphores (``locks.semaphore``)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable

import pytest
import redis

import dlock
from conftest import Server, cmd, fields, wait_until


def info(r: redis.Redis, resource: str) -> dict[Any, Any]:
    reply = cmd(r, "DLOCK.INFO", resource)
    return {} if reply is None else fields(reply)


def queued(r: redis.Redis, resource: str, waiters: int) -> bool:
    """Waits until ``waiters`` clients wait in the server's line for ``resource``."""
    return wait_until(lambda: info(r, resource).get(b"waiters") == waiters, 5)


class Journal:
    """What the bodies did, in order, from every thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[str] = []

    def add(self, event: str) -> None:
        with self._lock:
            self.events.append(event)


def in_thread(body: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def test_readers_hold_together_and_are_renewed_on_their_own(server: Server, r: redis.Redis) -> None:
    locks = dlock.Locks(r)
    with (
        locks.read("report:7", ttl=0.9, meta="reader-a") as a,
        locks.read("report:7", ttl=0.9, timeout=0) as b,
    ):
        assert (a.mode, b.mode) == ("shared", "shared")
        assert a.token != b.token
        assert b.fence > a.fence
        shown = info(r, "report:7")
        assert shown[b"mode"] == b"shared"
        assert shown[b"holders"] == 2
        assert [lease[:2] for lease in shown[b"leases"]] == [
            [a.token.encode(), a.fence],
            [b.token.encode(), b.fence],
        ]
        assert shown[b"leases"][0][3] == b"reader-a"
        time.sleep(1.2)  # past the ttl: each reader's renewals keep it
        a.check()
        b.check()
        assert cmd(r, "DLOCK.FENCECHECK", "report:7", a.fence) == 1
    assert r.exists("report:7") == 0
    stats = server.info()
    assert stats["dlock_renew_ok"] >= 4
    assert stats["dlock_release_ok"] == 2
    assert locks.metrics.get("release_failures") == 0


def test_a_writer_waits_for_readers_and_later_readers_wait_for_it(r: redis.Redis) -> None:
    """FIFO across modes. The grants from the queue are confirmed by an ACQUIRE of the same mode
    (an exclusive one for a reader would be refused with LOCKMODE)."""
    locks = dlock.Locks(r)
    journal = Journal()
    fences: dict[str, int] = {}

    def writer() -> None:
        with locks.write("doc", ttl=5, timeout=5) as lease:
            assert lease.mode == "exclusive"
            fences["writer"] = lease.fence
            journal.add("writer in")
            time.sleep(0.2)
            journal.add("writer out")

    def late_reader() -> None:
        with locks.read("doc", ttl=5, timeout=5) as lease:
            fences["late reader"] = lease.fence
            journal.add("late reader in")

    with locks.read("doc", ttl=5) as first:
        threads = [in_thread(writer)]
        assert queued(r, "doc", 1)
        threads.append(in_thread(late_reader))
        assert queued(r, "doc", 2)
        # A reader never overtakes a queued writer, even with the lock held by readers only.
        with pytest.raises(dlock.NotAcquired), locks.read("doc", ttl=5, timeout=0):
            pytest.fail("the body must not run")
        time.sleep(0.1)
        journal.add("first reader out")
    for thread in threads:
        thread.join(5)
    assert journal.events == ["first reader out", "writer in", "writer out", "late reader in"]
    assert first.fence < fences["writer"] < fences["late reader"]
    assert r.exists("doc") == 0


def test_a_semaphore_never_runs_more_bodies_than_permits(r: redis.Redis) -> None:
    locks = dlock.Locks(r)
    permits, workers, rounds = 3, 8, 4
    lock = threading.Lock()
    running = peak = 0
    fences: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        nonlocal running, peak
        try:
            for _ in range(rounds):
                with locks.semaphore("pool:db", permits, ttl=5, timeout=10) as permit:
                    with lock:
                        running += 1
                        peak = max(peak, running)
                        fences.append(permit.fence)
                    time.sleep(0.02)
                    with lock:
                        running -= 1
        except BaseException as error:
            errors.append(error)

    threads = [in_thread(worker) for _ in range(workers)]
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert peak == permits, "never more bodies than permits, and the permits were all used"
    assert len(fences) == workers * rounds
    assert len(set(fences)) == len(fences), "every permit has a fence of its own"
    assert r.exists("pool:db") == 0


def test_permit_fences_increase_in_grant_order(r: redis.Redis) -> None:
    locks = dlock.Locks(r)
    granted: dict[int, int] = {}

    def waiter(place: int) -> Callable[[], None]:
        def body() -> None:
            with locks.semaphore("pool", 2, ttl=5, timeout=5) as permit:
                granted[place] = permit.fence

        return body

    with contextlib.ExitStack() as held:
        first = held.enter_context(locks.semaphore("pool", 2, ttl=5, timeout=0))
        second = held.enter_context(locks.semaphore("pool", 2, ttl=5, timeout=0))
        with pytest.raises(dlock.NotAcquired), locks.semaphore("pool", 2, ttl=5, timeout=0):
            pytest.fail("a third permit of two")
        threads = []
        for place in range(3):
            threads.append(in_thread(waiter(place)))
            assert queued(r, "pool", place + 1)  # their places in line are known
    for thread in threads:
        thread.join(5)
    fences = [first.fence, second.fence, *(granted[place] for place in range(3))]
    assert fences == sorted(fences)
    assert len(set(fences)) == 5


def test_a_lost_shared_lease_is_noticed_and_the_others_live_on(
    server: Server, r: redis.Redis
) -> None:
    locks = dlock.Locks(r)
    ttl = 0.9
    with pytest.raises(dlock.LeaseLost) as second_lost, locks.read("shelf", ttl=ttl) as b:
        with pytest.raises(dlock.LeaseLost) as first_lost, locks.read("shelf", ttl=ttl) as a:
            # Another connection releases one reader's lease by its token.
            with server.client() as operator:
                assert cmd(operator, "DLOCK.RELEASE", "shelf", a.token) == 1
            assert a.lost.wait(ttl / 3 + 0.5), "the loss was not noticed in time"
            assert a.lost_reason == "renewal_refused"
        assert first_lost.value.fence == a.fence
        b.check()
        assert cmd(r, "DLOCK.FENCECHECK", "shelf", b.fence) == 1
        # An operator's DEL ends every shared lease on the key.
        r.delete("shelf")
        assert b.lost.wait(ttl / 3 + 0.5)
        assert b.lost_reason == "renewal_refused"
    assert second_lost.value.reason == "renewal_refused"
    assert locks.metrics.get("leases_lost", "renewal_refused") == 2


def test_fenced_writes_under_a_readers_fence(r: redis.Redis) -> None:
    locks = dlock.Locks(r)
    with (
        pytest.raises(dlock.LeaseLost),  # a's, when its block finds it released
        locks.read("cache:{9}", ttl=30) as a,
        locks.read("cache:{9}", ttl=30) as b,
    ):
        # Any live reader's fence admits a fenced write, not only the newest one's.
        assert a.fenced("SET", "cache:{9}:a", "1") == b"OK"
        assert b.fenced("SET", "cache:{9}:b", "1") == b"OK"
        assert cmd(r, "DLOCK.RELEASE", "cache:{9}", a.token) == 1
        with pytest.raises(dlock.Stale) as raised:
            a.fenced("SET", "cache:{9}:a", "2")
        assert raised.value.fence == a.fence
        assert b.fenced("SET", "cache:{9}:b", "2") == b"OK"
    with locks.write("cache:{9}", ttl=30, timeout=0) as writer:
        assert writer.fence > b.fence
        with pytest.raises(dlock.Stale):
            b.fenced("SET", "cache:{9}:b", "3")
        assert writer.fenced("SET", "cache:{9}:b", "4") == b"OK"
    assert r.mget("cache:{9}:a", "cache:{9}:b") == [b"1", b"4"]
    assert locks.metrics.get("stale_writes") == 2


def test_a_mode_conflict_is_an_error_and_changes_nothing(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks = dlock.Locks(r)
    with locks.read("mixed", ttl=30) as reader:
        # The same token asking for an exclusive lease: refused, the shared one unchanged.
        with pytest.raises(redis.ResponseError, match=r"^LOCKMODE"):
            cmd(r, "DLOCK.ACQUIRE", "mixed", reader.token, 30000)
        reader.check()
        assert info(r, "mixed")[b"mode"] == b"shared"
    # The client's token holding an exclusive lease already (a token is an attempt's own, so
    # only a token reused on purpose meets this): the read raises the server's LOCKMODE error
    # and leaves that lease alone, no RELEASE is sent for it.
    monkeypatch.setattr(dlock._common, "new_token", lambda: "reused-token")
    fence = cmd(r, "DLOCK.ACQUIRE", "mixed", "reused-token", 30000)
    with (
        pytest.raises(redis.ResponseError, match=r"^LOCKMODE") as raised,
        locks.read("mixed", timeout=1),
    ):
        pytest.fail("the body must not run")
    assert not isinstance(raised.value, dlock.DlockError), "the server's error, unchanged"
    shown = info(r, "mixed")
    assert (shown[b"owner"], shown[b"fence"], shown[b"mode"]) == (
        b"reused-token",
        fence,
        b"exclusive",
    )
    assert locks.metrics.get("acquire_failures", "server") == 1


def test_a_server_without_shared_leases_is_told_apart(r: redis.Redis) -> None:
    locks = dlock.Locks(r)
    # As a server before shared leases advertises its options.
    locks._nodes.for_resource("old").features = dlock.Features(
        acquire=frozenset({"WAIT", "CLAIM"}), renew=frozenset({"FENCE"})
    )
    with pytest.raises(dlock.Unsupported, match="too old") as raised, locks.read("old"):
        pytest.fail("the body must not run")
    assert raised.value.option == "SHARED"
    with pytest.raises(dlock.Unsupported), locks.semaphore("old", 2):
        pytest.fail("the body must not run")
    assert r.exists("old") == 0, "nothing was sent"
    with locks.write("old", timeout=0) as lease:
        assert lease.mode == "exclusive"


def test_a_read_keeps_max_hold_and_the_bodys_own_exception(r: redis.Redis) -> None:
    locks = dlock.Locks(r)
    with pytest.raises(dlock.LeaseLost) as raised, locks.read("bounded", max_hold=0.4) as lease:
        assert lease.lost.wait(1.5)
    assert raised.value.reason == "max_hold"
    assert wait_until(lambda: r.exists("bounded") == 0, 1.0)
    with pytest.raises(KeyError), locks.semaphore("bounded", 2):
        r.delete("bounded")  # the RELEASE finds the permit gone: the body's error still wins
        raise KeyError("body")
    with pytest.raises(RuntimeError), locks.read("bounded"):
        raise RuntimeError("body")
    assert r.exists("bounded") == 0, "released on the way out"
