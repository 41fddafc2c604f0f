"""The threaded client against a real server."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from typing import Any

import pytest
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

import dlock
from conftest import LinkProxy, Pair, Server, cmd, fields, wait_until


def test_hold_acquires_renews_and_releases(server: Server, r: redis.Redis) -> None:
    locks = dlock.Locks(r)
    with locks.hold("invoice:123", ttl=0.9, timeout=1) as lease:
        assert isinstance(lease.fence, int)
        assert lease.fence > 0
        assert lease.resource == "invoice:123"
        info = fields(cmd(r, "DLOCK.INFO", "invoice:123"))
        assert info[b"owner"] == lease.token.encode()
        assert info[b"fence"] == lease.fence
        assert lease.fenced("SET", "invoice:123:total", "10") == b"OK"
        # Past two ttls the lease still holds: renewals every third of the ttl keep it.
        end = time.monotonic() + 1.9
        while time.monotonic() < end:
            lease.check()
            time.sleep(0.05)
        assert cmd(r, "DLOCK.FENCECHECK", "invoice:123", lease.fence) == 1
        assert not lease.lost.is_set()
    assert r.exists("invoice:123") == 0
    assert r.get("invoice:123:total") == b"10"
    info = server.info()
    assert info["dlock_renew_ok"] >= 2
    assert info["dlock_release_ok"] == 1
    assert locks.metrics.get("acquire_attempts") == 1
    assert locks.metrics.get("hold_seconds_count") == 1
    assert locks.metrics.get("release_failures") == 0


def test_tokens_are_random_and_fences_increase(r: redis.Redis) -> None:
    locks = dlock.Locks(r)
    seen = []
    for _ in range(3):
        with locks.hold("job", ttl=5, timeout=0) as lease:
            seen.append((lease.token, lease.fence))
    assert len({token for token, _ in seen}) == 3
    fences = [fence for _, fence in seen]
    assert fences == sorted(fences)
    assert len(set(fences)) == 3


def test_not_acquired_when_the_timeout_passes(server: Server, r: redis.Redis) -> None:
    assert cmd(r, "DLOCK.ACQUIRE", "busy", "someone-else", 30000) is not None
    locks = dlock.Locks(r)
    started = time.monotonic()
    with pytest.raises(dlock.NotAcquired) as raised, locks.hold("busy", ttl=5, timeout=0.3):
        pytest.fail("the body must not run")
    assert time.monotonic() - started >= 0.3
    assert raised.value.resource == "busy"
    assert raised.value.fence is None
    assert isinstance(raised.value, dlock.DlockError)
    # timeout=0: one plain ACQUIRE, no server-side wait at all.
    with pytest.raises(dlock.NotAcquired), locks.hold("busy", ttl=5, timeout=0):
        pytest.fail("the body must not run")
    info = server.info()
    assert info["dlock_waits_started"] == 1
    assert info["dlock_waits_timed_out"] == 1
    assert locks.metrics.get("acquire_failures", "held") == 2


def test_a_long_wait_is_one_server_side_wait(server: Server) -> None:
    """redis-py with a short socket timeout and retries would turn one long WAIT into many; dlock's
    wait runs on a connection of its own, with the socket timeout above the wait and no retries."""
    impatient = server.client(socket_timeout=0.3, retry=Retry(ExponentialBackoff(), 5))
    with server.client() as admin:
        cmd(admin, "DLOCK.ACQUIRE", "slow", "holder", 30000)
    locks = dlock.Locks(impatient)
    # Nobody releases: the whole wait (about 7 socket timeouts) runs out in one server-side wait.
    with pytest.raises(dlock.NotAcquired), locks.hold("slow", ttl=5, timeout=2.0):
        pytest.fail("the body must not run")
    info = server.info()
    assert info["dlock_waits_started"] == 1
    assert info["dlock_waits_timed_out"] == 1

    # Released during the wait: granted from the queue, still exactly one wait.
    def release_later() -> None:
        time.sleep(1.0)
        with server.client() as admin:
            cmd(admin, "DLOCK.RELEASE", "slow", "holder")

    releaser = threading.Thread(target=release_later)
    releaser.start()
    try:
        with locks.hold("slow", ttl=5, timeout=5.0) as lease:
            assert cmd(impatient, "DLOCK.FENCECHECK", "slow", lease.fence) == 1
    finally:
        releaser.join()
    info = server.info()
    assert info["dlock_waits_started"] == 2
    assert info["dlock_waits_granted"] == 1
    impatient.close()


def test_a_waiter_gets_the_lock_when_the_holder_exits(r: redis.Redis) -> None:
    locks = dlock.Locks(r)
    fences: list[int] = []
    holding = threading.Event()

    def first() -> None:
        with locks.hold("handoff", ttl=5, timeout=0) as lease:
            fences.append(lease.fence)
            holding.set()
            time.sleep(0.3)

    holder = threading.Thread(target=first)
    holder.start()
    assert holding.wait(5)
    with locks.hold("handoff", ttl=5, timeout=5) as lease:
        fences.append(lease.fence)
    holder.join()
    assert fences[1] > fences[0]


def test_timeout_none_waits_without_limit(server: Server, r: redis.Redis) -> None:
    cmd(r, "DLOCK.ACQUIRE", "patient", "holder", 30000)
    release = threading.Timer(0.5, lambda: cmd(r, "DLOCK.RELEASE", "patient", "holder"))
    release.start()
    with dlock.Locks(r).hold("patient", ttl=5, timeout=None) as lease:
        assert cmd(r, "DLOCK.FENCECHECK", "patient", lease.fence) == 1
    release.join()
    assert server.info()["dlock_waits_granted"] == 1


def test_a_wait_longer_than_the_server_allows_is_waited_in_slices(own_server: Server) -> None:
    client = own_server.client()
    client.config_set("dlock.max-ttl-ms", 300)
    locks = dlock.Locks(client)
    # The holder renews for a second; the waiter's two seconds are waited 300 ms at a time.
    holder = threading.Event()

    def hold_for_a_second() -> None:
        with locks.hold("long", ttl=0.3, timeout=0):
            holder.set()
            time.sleep(1.0)

    first = threading.Thread(target=hold_for_a_second)
    first.start()
    assert holder.wait(5)
    with locks.hold("long", ttl=0.3, timeout=2) as lease:
        assert cmd(client, "DLOCK.FENCECHECK", "long", lease.fence) == 1
    first.join()
    assert own_server.info()["dlock_waits_started"] >= 2
    client.close()
    locks.close()


def test_a_lease_deleted_by_an_operator_is_noticed_within_a_third_of_the_ttl(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dlock")
    locks = dlock.Locks(r)
    ttl = 1.5
    with pytest.raises(dlock.LeaseLost) as raised, locks.hold("deleted", ttl=ttl) as lease:
        lease.check()
        r.delete("deleted")
        # The next renewal is due at most a third of the ttl from now; it is refused.
        assert lease.lost.wait(ttl / 3 + 0.5), "the loss was not noticed in time"
        assert lease.lost_reason == "renewal_refused"
        lease.check()
        pytest.fail("check() must raise")
    assert raised.value.resource == "deleted"
    assert raised.value.fence == lease.fence
    assert raised.value.reason == "renewal_refused"
    assert locks.metrics.get("leases_lost", "renewal_refused") == 1
    assert locks.metrics.get("renewal_failures", "refused") == 1
    # One line for the loss, with what an operator needs to find it.
    lost = [record.getMessage() for record in caplog.records if "lease lost" in record.getMessage()]
    assert lost == [
        f"dlock: lease lost resource=deleted owner={lease.token} fence={lease.fence}"
        " reason=renewal_refused"
    ]
    acquired = [
        record.getMessage() for record in caplog.records if "acquired" in record.getMessage()
    ]
    assert acquired == [
        f"dlock: lease acquired resource=deleted owner={lease.token} fence={lease.fence}"
    ]


def test_a_loss_the_body_never_checked_is_raised_when_the_block_exits(r: redis.Redis) -> None:
    locks = dlock.Locks(r)
    with pytest.raises(dlock.LeaseLost), locks.hold("unchecked", ttl=1.5) as lease:
        r.delete("unchecked")
        assert lease.lost.wait(1.5)
    # A lease gone before the body ended, even between renewals, is reported too.
    with pytest.raises(dlock.LeaseLost) as raised, locks.hold("unchecked", ttl=30):
        r.delete("unchecked")
    assert raised.value.reason == "ended"


def test_a_stopped_server_ends_in_lease_lost_never_a_silent_overrun(own_server: Server) -> None:
    client = own_server.client()
    locks = dlock.Locks(client, request_timeout=0.2)
    ttl = 1.0
    try:
        with pytest.raises(dlock.LeaseLost) as raised, locks.hold("frozen", ttl=ttl) as lease:
            lease.check()
            stopped_at = time.monotonic()
            own_server.stop_process()
            # No renewal is answered: at the lease's local expiry (at most a ttl away) it is lost.
            assert lease.lost.wait(ttl + 1.0), "the loss was not noticed"
            assert time.monotonic() - stopped_at <= ttl + 1.0
            assert lease.lost_reason == "unreachable"
            with pytest.raises(dlock.LeaseLost):
                lease.check()
            # An ACQUIRE the stopped server may have received: its outcome is unknown.
            with pytest.raises(redis.TimeoutError), locks.hold("frozen-too", ttl=5, timeout=0):
                pytest.fail("the body must not run")
            assert locks.metrics.get("acquire_failures", "unknown") == 1
            # Longer than the ttl, then the server comes back.
            time.sleep(max(0.0, stopped_at + ttl + 0.2 - time.monotonic()))
            own_server.continue_process()
        assert raised.value.reason == "unreachable"
        assert locks.metrics.get("leases_lost", "unreachable") == 1
        assert locks.metrics.get("renewal_failures", "error") >= 1
        # The lease was reported lost: its RELEASE at the block's end is no release failure.
        assert locks.metrics.get("release_failures") == 0
    finally:
        own_server.continue_process()
        client.close()
        locks.close()


def test_a_renewer_that_did_not_run_in_time_loses_the_lease_as_stalled(
    server: Server, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The process did not run in time to renew (as if stopped) while the server answered all
    along: the lease is lost as ``stalled``, no late renewal is sent, and its RELEASE after the
    loss is not a release failure."""
    caplog.set_level(logging.WARNING, logger="dlock")
    locks = dlock.Locks(r)
    ttl = 0.6
    renewals = server.info()["dlock_renew_ok"]
    with pytest.raises(dlock.LeaseLost) as raised, locks.hold("stalled", ttl=ttl) as lease:
        # The renewal thread cannot run past the ttl: it waits for its own lock.
        with locks._renewer._wake:
            time.sleep(ttl + 0.2)
        assert lease.lost.wait(1.0)
        assert lease.lost_reason == "stalled"
    assert raised.value.reason == "stalled"
    # The renewal found due after the local expiry was not sent.
    assert server.info()["dlock_renew_ok"] == renewals
    assert locks.metrics.get("leases_lost", "stalled") == 1
    assert locks.metrics.get("release_failures") == 0
    assert "release failed" not in caplog.text
    assert caplog.text.count("dlock: lease lost") == 1


def test_check_raises_at_the_local_expiry_even_before_the_renewer_notices(
    own_server: Server,
) -> None:
    client = own_server.client()
    # The renewer's RENEW may block up to request_timeout; check() looks at the clock itself.
    locks = dlock.Locks(client, request_timeout=5.0)
    try:
        with pytest.raises(dlock.LeaseLost), locks.hold("frozen", ttl=0.6) as lease:
            own_server.stop_process()
            deadline = lease.local_expiry
            time.sleep(max(0.0, deadline - time.monotonic()) + 0.01)
            try:
                lease.check()
            finally:
                own_server.continue_process()
    finally:
        own_server.continue_process()
        client.close()
        locks.close()


def test_an_acquire_retried_through_a_pause_gets_one_grant(own_server: Server) -> None:
    """Requests that time out while the server is stopped are retried with the same token: when
    it comes back, every copy answers with the one grant's fence."""
    client = own_server.client()
    locks = dlock.Locks(client, request_timeout=0.2)
    try:
        locks.features()  # read before the pause: what times out below is the ACQUIRE itself
        own_server.stop_process()
        resume = threading.Timer(0.7, own_server.continue_process)
        resume.start()
        with locks.hold("paused", ttl=5, timeout=3) as lease:
            resume.join()
            info = fields(cmd(client, "DLOCK.INFO", "paused"))
            assert info[b"owner"] == lease.token.encode()
            assert info[b"fence"] == lease.fence
        stats = own_server.info()
        assert stats["dlock_acquire_granted"] == 1
        assert stats["dlock_acquire_reacquired"] >= 1
    finally:
        own_server.continue_process()
        client.close()
        locks.close()


def commanding(admin: redis.Redis) -> list[dict[str, Any]]:
    """The server's clients that are not subscribers."""
    return [
        client
        for client in admin.client_list()
        if all(int(client.get(kind, 0)) == 0 for kind in ("sub", "psub", "ssub"))
    ]


def test_connections_the_server_closed_while_idle_are_replaced(own_server: Server) -> None:
    admin = own_server.client()
    locks = dlock.Locks(own_server.client())
    try:
        with locks.hold("idle", ttl=60) as lease:
            # The server drops idle clients after a second: dlock's connection among them (not
            # the holder's subscriber, which the server never drops for idleness).
            admin.config_set("timeout", 1)
            assert wait_until(lambda: len(commanding(admin)) == 1, 10, 0.1)
            lease.check()
        # The RELEASE went out on a fresh connection, not into the closed one.
        assert locks.metrics.get("release_failures") == 0
        assert admin.exists("idle") == 0
    finally:
        admin.close()
        locks.close()


def test_release_never_masks_the_bodys_exception(own_server: Server) -> None:
    client = own_server.client()
    locks = dlock.Locks(client, request_timeout=0.2)
    try:
        # The server is gone when the block exits: the RELEASE times out, the body's error wins.
        with pytest.raises(ValueError, match="the body's own"), locks.hold("masked", ttl=30):
            own_server.stop_process()
            raise ValueError("the body's own")
        own_server.continue_process()
        assert locks.metrics.get("release_failures") == 1
        # The lease lost as well: still the body's error.
        with pytest.raises(KeyError), locks.hold("masked2", ttl=1.5) as lease:
            client.delete("masked2")
            assert lease.lost.wait(1.5)
            raise KeyError("body")
        # And a body that raised still released the lock.
        with pytest.raises(RuntimeError), locks.hold("masked3", ttl=30):
            raise RuntimeError("body")
        assert client.exists("masked3") == 0
    finally:
        own_server.continue_process()
        client.close()
        locks.close()


def test_a_stale_fenced_write_is_refused(server: Server, r: redis.Redis) -> None:
    locks = dlock.Locks(r)
    with pytest.raises(dlock.LeaseLost), locks.hold("invoice:{7}", ttl=30) as old:
        old.fenced("HSET", "invoice:{7}:data", "status", "processing")
        # The old worker stalls; an operator (or the expiry) frees the lock; a new worker takes it.
        r.delete("invoice:{7}")
        with locks.hold("invoice:{7}", ttl=30, timeout=0) as new:
            assert new.fence > old.fence
            new.fenced("HSET", "invoice:{7}:data", "status", "paid")
            with pytest.raises(dlock.Stale) as raised:
                old.fenced("HSET", "invoice:{7}:data", "status", "failed")
        assert raised.value.resource == "invoice:{7}"
        assert raised.value.fence == old.fence
        assert str(new.fence) in raised.value.detail
    assert cmd(r, "HGET", "invoice:{7}:data", "status") == b"paid"
    assert locks.metrics.get("stale_writes") == 1
    assert server.info()["dlock_fenced_writes_refused"] == 1
    # The inner command's own errors are redis-py's, unchanged.
    with locks.hold("invoice:{7}", ttl=30) as lease, pytest.raises(redis.ResponseError) as error:
        lease.fenced("INCR", "invoice:{7}:data")
    assert not isinstance(error.value, dlock.DlockError)
    assert "WRONGTYPE" in str(error.value)


def test_redis_errors_pass_through_unchanged(r: redis.Redis) -> None:
    r.set("a-string", "x")
    locks = dlock.Locks(r)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"), locks.hold("a-string", ttl=5):
        pytest.fail("the body must not run")
    assert locks.metrics.snapshot() == {"acquire_attempts": 1, "acquire_failures{server}": 1}
    unreachable = dlock.Locks(redis.Redis(port=1), request_timeout=0.2)
    with pytest.raises(redis.ConnectionError), unreachable.hold("x", ttl=5, timeout=0.2):
        pytest.fail("the body must not run")
    # Every connection refused: no request can have reached a server.
    assert unreachable.metrics.get("acquire_failures", "unreachable") == 1


def test_max_hold_bounds_the_whole_hold(r: redis.Redis) -> None:
    locks = dlock.Locks(r)
    with (
        pytest.raises(dlock.LeaseLost) as raised,
        locks.hold("bounded", ttl=30, max_hold=0.5) as lease,
    ):
        assert lease.lost.wait(0.5 + 1.0)
    assert raised.value.reason == "max_hold"
    # The server's lease ended with the hold too (no renewal went past it).
    assert wait_until(lambda: r.exists("bounded") == 0, 1.0)


def test_one_renewal_thread_for_all_leases_and_none_when_idle(r: redis.Redis) -> None:
    def renewers() -> int:
        return sum(1 for thread in threading.enumerate() if thread.name == "dlock-renewer")

    locks = dlock.Locks(r)
    with contextlib.ExitStack() as stack:
        leases = [stack.enter_context(locks.hold(f"many:{n}", ttl=0.9)) for n in range(5)]
        time.sleep(0.5)
        assert renewers() == 1
        for lease in leases:
            lease.check()
    assert wait_until(lambda: renewers() == 0, 2.0)


@pytest.mark.parametrize(
    "options",
    [{"protocol": 3}, {"decode_responses": True}],
    ids=["resp3", "decoded"],
)
def test_client_settings_are_kept(server: Server, options: dict[str, object]) -> None:
    client = server.client(**options)
    locks = dlock.Locks(client)
    with locks.hold("settings", ttl=5, timeout=1, meta="worker-a") as lease:
        assert lease.fenced("SET", "settings:x", "1") in (b"OK", "OK", True)
        assert lease.fenced("GET", "settings:x") in (b"1", "1")
    client.close()


def test_features_are_read_from_the_server(r: redis.Redis) -> None:
    features = dlock.Locks(r).features()
    assert "WAIT" in features.acquire
    advertised = features.acquire | features.renew | features.release
    assert advertised <= {"WAIT", "FENCE", "CLAIM", "LIMIT", "META", "NOTIFY", "QUEUE", "SHARED"}


def test_mutual_exclusion_under_contention(r: redis.Redis) -> None:
    """Threads increment a counter by read-then-write under the lock: no update is lost."""
    locks = dlock.Locks(r)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(10):
                with locks.hold("counter", ttl=5, timeout=10) as lease:
                    value = int(cmd(r, "GET", "counter:value") or 0)
                    time.sleep(0.001)
                    lease.fenced("SET", "counter:value", str(value + 1))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert cmd(r, "GET", "counter:value") == b"40"
    assert locks.metrics.get("acquire_attempts") == 40


def test_a_unix_socket_client() -> None:
    path = tempfile.mkdtemp(prefix="dlock-sock-") + "/redis.sock"  # short: sun_path is small
    server = Server("--unixsocket", path, "--unixsocketperm", "700")
    client = redis.Redis(unix_socket_path=path)
    try:
        locks = dlock.Locks(client)
        with locks.hold("over-a-socket", ttl=5, timeout=1) as lease:
            assert lease.fenced("SET", "over-a-socket:x", "1") == b"OK"
        assert client.exists("over-a-socket") == 0
        locks.close()
    finally:
        client.close()
        server.close()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def owner(r: redis.Redis, resource: str) -> bytes | None:
    info = cmd(r, "DLOCK.INFO", resource)
    return None if info is None else fields(info)[b"owner"]


def test_a_hand_over_the_client_gave_up_on_is_released_from_a_new_connection(
    server: Server, r: redis.Redis
) -> None:
    """The server hands the lease over while the link is silent (no reply, no FIN): the client
    gives up on its own timeout and releases its token over a connection opened for it (its
    pooled one is silent too), long before the claim window (2 request timeouts) would lapse."""
    proxy = LinkProxy(server.port)
    locks = dlock.Locks(redis.Redis(port=proxy.port), request_timeout=2.0, release_timeout=0.2)
    try:
        locks.features()  # a pooled connection, silenced below with the wait's
        assert cmd(r, "DLOCK.ACQUIRE", "handed", "holder", 30000) is not None
        failed: list[BaseException] = []

        def waiter() -> None:
            try:
                with locks.hold("handed", ttl=30, timeout=0.5):
                    pytest.fail("the body must not run")
            except redis.RedisError as error:
                failed.append(error)

        thread = threading.Thread(target=waiter)
        thread.start()
        assert wait_until(lambda: fields(cmd(r, "DLOCK.INFO", "handed"))[b"waiters"] == 1, 5)
        proxy.silence_open_connections()
        assert cmd(r, "DLOCK.RELEASE", "handed", "holder") == 1
        assert owner(r, "handed") not in (None, b"holder"), "handed over to the waiter"
        thread.join(10)
        assert failed, "the waiter gave up on its own timeout"
        assert owner(r, "handed") is None, "released, not left to its claim window"
    finally:
        locks.close()
        proxy.close()


def test_a_release_that_overtook_the_acquire_is_sent_once_more(
    server: Server, r: redis.Redis
) -> None:
    """The WAIT reaches the server only after the client gave up on it (and after its first
    RELEASE, which found nothing); the lock is free by then, so it is granted at once, with no
    claim window. The second RELEASE, a short pause later, frees it."""
    proxy = LinkProxy(server.port)
    wait, request_timeout = 0.3, 0.3
    locks = dlock.Locks(redis.Redis(port=proxy.port), request_timeout=request_timeout)
    try:
        locks.features()
        assert cmd(r, "DLOCK.ACQUIRE", "late", "holder", 30000) is not None
        # Between the first RELEASE (when the client gives up) and the second (a pause later).
        late = wait + request_timeout + dlock._common.FORGET_AGAIN_AFTER / 2
        proxy.hold_back_requests_containing(b"WAIT", late)
        threading.Timer(0.1, lambda: cmd(r, "DLOCK.RELEASE", "late", "holder")).start()
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError), locks.hold("late", ttl=30, timeout=wait):
            pytest.fail("the body must not run")
        # Past the late ACQUIRE's arrival, whenever the client returned.
        time.sleep(max(0.0, started + late + 0.2 - time.monotonic()))
        assert server.info()["dlock_acquire_granted"] == 2, "the holder's, and the late one"
        assert owner(r, "late") is None, "the late grant was released"
    finally:
        locks.close()
        proxy.close()


def test_a_blocked_wait_goes_on_while_its_primary_is_a_replica(pair: Pair) -> None:
    """A waiter blocked in ACQUIRE … WAIT (20 s) on a primary that a failover turns into a
    replica, and later back: the server ends the wait (``UNBLOCKED``) and refuses its retries
    (``READONLY``), nothing granted; the same token retries until the primary is one again, waits
    there for what is left, and is served when the holder's lease runs out."""
    held = pair.hold("demoted", 3000)
    client = pair.primary.client()
    locks = dlock.Locks(client, request_timeout=1)
    served: list[tuple[int, bool]] = []
    errors: list[BaseException] = []

    def wait_in_line() -> None:
        try:
            with locks.hold("demoted", ttl=5, timeout=20) as lease:
                with pair.primary.client() as probe:
                    owner = fields(cmd(probe, "DLOCK.INFO", "demoted"))[b"owner"]
                served.append((lease.fence, owner == lease.token.encode()))
        except Exception as error:
            errors.append(error)

    thread = threading.Thread(target=wait_in_line)
    thread.start()
    try:
        with pair.primary.client() as probe:

            def blocked() -> bool:
                return bool(fields(cmd(probe, "DLOCK.INFO", "demoted"))[b"waiters"] == 1)

            assert wait_until(blocked, 5), "the waiter blocks"
        pair.demote()
        assert wait_until(lambda: pair.readonly_answers() >= 2, 5), "retries refused READONLY"
        pair.promote_back()
    finally:
        thread.join(25)
    assert errors == []
    assert len(served) == 1
    fence, owns = served[0]
    assert fence > held
    assert owns
    locks.close()
    client.close()
