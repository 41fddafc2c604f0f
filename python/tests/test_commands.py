"""The commands as sent, per server features, and the lease's schedule (no server needed), and
what a version 1 server actually receives."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

import dlock
from conftest import Server
from dlock import _common as common
from dlock._common import Features, LeaseState
from dlock._metrics import Metrics

# The real reply of today's server to COMMAND DOCS (RESP2), abridged to the arguments.
V1_DOCS_RESP2: list[Any] = [
    b"dlock.acquire",
    [
        b"summary",
        b"Acquires a lease",
        b"arguments",
        [
            [b"name", b"resource", b"type", b"key", b"key_spec_index", 0],
            [b"name", b"token", b"type", b"string"],
            [b"name", b"ttl-ms", b"type", b"integer"],
            [
                b"name",
                b"timeout-ms",
                b"type",
                b"integer",
                b"token",
                b"WAIT",
                b"flags",
                [b"optional"],
            ],
        ],
    ],
    b"dlock.renew",
    [
        b"arguments",
        [
            [b"name", b"resource", b"type", b"key", b"key_spec_index", 0],
            [b"name", b"token", b"type", b"string"],
            [b"name", b"ttl-ms", b"type", b"integer"],
        ],
    ],
]

# A server with the version 2 options, as RESP3 maps (options nested in a block, as Redis
# documents optional groups).
V2_DOCS_RESP3: dict[Any, Any] = {
    "dlock.acquire": {
        "arguments": [
            {"name": "resource", "type": "key"},
            {"name": "token", "type": "string"},
            {
                "name": "options",
                "type": "block",
                "arguments": [
                    {"name": "timeout-ms", "type": "integer", "token": "WAIT"},
                    {"name": "claim-ms", "type": "integer", "token": "CLAIM"},
                    {"name": "value", "type": "string", "token": "META"},
                ],
            },
        ]
    },
    "dlock.renew": {"arguments": [{"name": "fence", "type": "integer", "token": "FENCE"}]},
    "dlock.release": {"arguments": [{"name": "fence", "type": "integer", "token": "fence"}]},
}


def test_features_of_a_version_1_server() -> None:
    features = Features.from_docs(V1_DOCS_RESP2)
    assert features.acquire == {"WAIT"}
    assert features.renew == frozenset()
    assert features.release == frozenset()
    assert Features.from_docs(None) == Features()
    assert Features.from_docs([]) == Features()


def test_version_1_commands_carry_no_version_2_option() -> None:
    v1 = Features.from_docs(V1_DOCS_RESP2)
    assert common.acquire_command(v1, "r", "t", 100, wait_ms=5, claim_ms=9, meta="m") == [
        "DLOCK.ACQUIRE",
        "r",
        "t",
        100,
        "WAIT",
        5,
    ]
    assert common.renew_command(v1, "r", "t", 100, 42) == ["DLOCK.RENEW", "r", "t", 100]
    assert common.release_command(v1, "r", "t", 42) == ["DLOCK.RELEASE", "r", "t"]


def test_version_2_options_are_sent_once_advertised() -> None:
    v2 = Features.from_docs(V2_DOCS_RESP3)
    assert v2.acquire == {"WAIT", "CLAIM", "META"}
    assert common.acquire_command(v2, "r", "t", 100, wait_ms=5, claim_ms=9, meta="m") == [
        "DLOCK.ACQUIRE",
        "r",
        "t",
        100,
        "WAIT",
        5,
        "CLAIM",
        9,
        "META",
        "m",
    ]
    # CLAIM only matters for a grant from the queue.
    assert common.acquire_command(v2, "r", "t", 100, claim_ms=9) == ["DLOCK.ACQUIRE", "r", "t", 100]
    assert common.renew_command(v2, "r", "t", 100, 42) == [
        "DLOCK.RENEW",
        "r",
        "t",
        100,
        "FENCE",
        42,
    ]
    assert common.release_command(v2, "r", "t", 42) == ["DLOCK.RELEASE", "r", "t", "FENCE", 42]


# A server with shared leases (COMMAND DOCS abridged to the tokens, RESP2).
SHARED_DOCS_RESP2: list[Any] = [
    b"dlock.acquire",
    [
        b"arguments",
        [
            [b"name", b"timeout-ms", b"type", b"integer", b"token", b"WAIT"],
            [b"name", b"shared", b"type", b"pure-token", b"token", b"SHARED"],
            [b"name", b"n", b"type", b"integer", b"token", b"LIMIT"],
        ],
    ],
]


def test_shared_modes_are_sent_as_shared_and_limit() -> None:
    features = Features.from_docs(SHARED_DOCS_RESP2)
    assert features.acquire == {"WAIT", "SHARED", "LIMIT"}
    assert common.acquire_command(features, "r", "t", 100, mode=common.SHARED) == [
        "DLOCK.ACQUIRE",
        "r",
        "t",
        100,
        "SHARED",
    ]
    # The confirming ACQUIRE after a wait carries the mode too (else: LOCKMODE).
    mode = common.semaphore_mode(3)
    for wait_ms in (5, None):
        command = common.acquire_command(features, "r", "t", 100, wait_ms=wait_ms, mode=mode)
        assert command[4:7] == ["SHARED", "LIMIT", 3]
    assert common.acquire_command(features, "r", "t", 100, mode=common.EXCLUSIVE) == [
        "DLOCK.ACQUIRE",
        "r",
        "t",
        100,
    ]


def test_shared_modes_are_refused_on_a_server_too_old_for_them() -> None:
    v1 = Features.from_docs(V1_DOCS_RESP2)
    with pytest.raises(dlock.Unsupported, match="too old") as raised:
        common.acquire_command(v1, "report", "t", 100, mode=common.SHARED)
    assert raised.value.option == "SHARED"
    assert raised.value.resource == "report"
    assert isinstance(raised.value, dlock.DlockError)
    # SHARED without LIMIT is no semaphore: never sent as a plain reader.
    without_limit = Features(acquire=frozenset({"WAIT", "SHARED"}))
    with pytest.raises(dlock.Unsupported) as raised:
        common.acquire_command(without_limit, "pool", "t", 100, mode=common.semaphore_mode(2))
    assert raised.value.option == "LIMIT"


@pytest.mark.parametrize("permits", [0, -1, 1_000_001, 2.5, True, "3"])
def test_permits_are_checked_before_anything_is_sent(permits: Any) -> None:
    # No server at that port: the check comes first.
    locks = dlock.Locks(redis.Redis(port=1))
    with pytest.raises(ValueError, match="permits"):
        locks.semaphore("pool", permits)
    assert common.semaphore_mode(1).limit == 1
    assert common.semaphore_mode(1_000_000).limit == 1_000_000


def test_the_schedule_renews_every_third_and_never_past_max_hold() -> None:
    now = time.monotonic()
    state = LeaseState("r", "t", 7, 3000, now, now + 2.0, Metrics())
    assert state.step(now) is None
    assert state.due() == now + 1.0
    assert state.step(now + 1.0) == 1000  # the renewal is cut to end with the hold
    state.renewed(now + 1.0, 1000)
    assert state.step(now + 2.0) == "max_hold"
    plain = LeaseState("r", "t", 7, 3000, now, None, Metrics())
    assert plain.step(now + 1.0) == 3000
    assert plain.step(now + 3.0) == "unreachable"
    assert plain.lose("unreachable")
    assert not plain.lose("renewal_refused"), "a lease is lost once"
    assert plain.reason == "unreachable"
    assert plain.due() == float("inf")


def test_the_local_expiry_is_unreachable_with_a_renewal_unanswered_else_stalled() -> None:
    now = time.monotonic()
    # No renewal sent (the process did not run in time): stalled, and the renewal that was due
    # is not sent once the expiry passed.
    idle = LeaseState("r", "t", 7, 3000, now, None, Metrics())
    assert idle.step(now + 3.0) == "stalled"
    # A renewal sent and still outstanding, or failed: unreachable.
    outstanding = LeaseState("r", "t", 7, 3000, now, None, Metrics())
    assert outstanding.step(now + 1.0) == 3000
    assert outstanding.step(now + 3.0) == "unreachable"
    failed = LeaseState("r", "t", 7, 3000, now, None, Metrics())
    assert failed.step(now + 1.0) == 3000
    failed.renewal_failed(refused=False)
    assert failed.step(now + 3.0) == "unreachable"
    # Renewed, then nothing sent until past the new expiry: stalled.
    renewed = LeaseState("r", "t", 7, 3000, now, None, Metrics())
    assert renewed.step(now + 1.0) == 3000
    renewed.renewed(now + 1.0, 3000)
    assert renewed.step(now + 4.0) == "stalled"


def test_millis_never_lengthens_a_lease() -> None:
    assert common.millis(0.0004) == 1
    assert common.millis(1.9999) == 1999
    assert common.millis_up(1.0001) == 1001


def watched_hold(
    server: Server, locks: dlock.Locks, hold: dlock.Hold | None = None
) -> tuple[list[list[str]], dlock.Lease]:
    """Holds ``watched`` (with ``hold``, else an exclusive lease) for a renewal's time and returns
    the dlock commands the server received (seen with MONITOR), and the lease."""
    seen: list[list[str]] = []
    ready = threading.Event()

    def watch() -> None:
        with server.client() as watcher, watcher.monitor() as monitor:
            ready.set()
            while True:
                command = str(monitor.next_command()["command"])
                if command.upper().startswith("DLOCK."):
                    seen.append(command.split())
                if command.upper().startswith("DLOCK.RELEASE"):
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert ready.wait(5)
    time.sleep(0.1)  # MONITOR is registered once its reply came; give it a moment
    if hold is None:
        hold = locks.hold("watched", ttl=0.9, meta="worker-a")
    with hold as lease:
        time.sleep(0.5)  # one renewal, a third of the ttl in
        lease.check()
    watcher.join(5)
    return seen, lease


def test_the_commands_sent_are_those_the_server_advertises(server: Server) -> None:
    client = redis.Redis(port=server.port)
    locks = dlock.Locks(client)
    features = locks.features("watched")
    assert "WAIT" in features.acquire
    seen, lease = watched_hold(server, locks)
    fence = ["FENCE", str(lease.fence)]
    meta = ["META", "worker-a"] if "META" in features.acquire else []
    assert seen[0] == ["DLOCK.ACQUIRE", "watched", lease.token, "900", *meta]
    renew_fence = fence if "FENCE" in features.renew else []
    assert seen[1] == ["DLOCK.RENEW", "watched", lease.token, "900", *renew_fence]
    release_fence = fence if "FENCE" in features.release else []
    assert seen[-1] == ["DLOCK.RELEASE", "watched", lease.token, *release_fence]
    client.close()


def test_a_permit_is_asked_for_renewed_and_released_by_its_fence(server: Server) -> None:
    client = redis.Redis(port=server.port)
    locks = dlock.Locks(client)
    permit = locks.semaphore("watched", 4, ttl=0.9)
    seen, lease = watched_hold(server, locks, permit)
    assert lease.mode == "shared"
    fence = ["FENCE", str(lease.fence)]
    assert seen[0] == ["DLOCK.ACQUIRE", "watched", lease.token, "900", "SHARED", "LIMIT", "4"]
    assert seen[1] == ["DLOCK.RENEW", "watched", lease.token, "900", *fence]
    assert seen[-1] == ["DLOCK.RELEASE", "watched", lease.token, *fence]
    assert locks.metrics.get("release_failures") == 0
    client.close()


def test_the_version_1_path_works_against_any_server(server: Server) -> None:
    """A server that advertises no option (dlock before version 2) gets the version 1 commands
    only; newer servers keep answering them the same."""
    client = redis.Redis(port=server.port)
    locks = dlock.Locks(client)
    locks._nodes.for_resource("watched").features = Features(acquire=frozenset({"WAIT"}))
    seen, lease = watched_hold(server, locks)
    assert seen[0] == ["DLOCK.ACQUIRE", "watched", lease.token, "900"]
    assert seen[1] == ["DLOCK.RENEW", "watched", lease.token, "900"]
    assert seen[-1] == ["DLOCK.RELEASE", "watched", lease.token]
    assert locks.metrics.get("release_failures") == 0
    client.close()


def test_a_grant_from_the_queue_is_confirmed_even_at_the_deadline() -> None:
    """A WAIT answered with a fence in the wait's last milliseconds is the caller's lease: it is
    confirmed with a plain ACQUIRE, never abandoned as a timeout (it would block the lock)."""
    plan = common.AcquirePlan(ttl=5, timeout=0.01, max_hold=None, request_timeout=1)
    assert plan.next_wait_ms() is None  # a plain ACQUIRE first
    assert plan.answered(None, waited=False) == "nil"
    assert not plan.gives_up(waited=False)
    assert plan.next_wait_ms() is not None  # then the wait
    time.sleep(0.02)  # the wait ran to its end ...
    assert plan.answered(1234, waited=True) == "confirm"  # ... but was granted at the last moment
    assert plan.next_wait_ms() is None  # confirmed with a plain ACQUIRE, whatever the time
    assert plan.answered(1234, waited=False) == "granted"


def test_a_wait_cut_short_waits_again_for_what_is_left() -> None:
    """A WAIT answered nil long before its end was ended by the server (the key migrated away,
    CLIENT UNBLOCK, …), not timed out: the same token waits again, 10 ms later, for what is
    left. One answered nil within 50 ms of its end timed out."""
    plan = common.AcquirePlan(ttl=5, timeout=0.2, max_hold=None, request_timeout=1)
    token = plan.token
    assert plan.answered(None, waited=False) == "nil"
    assert plan.wait_again_in(waited=False) == 0  # the first WAIT follows the plain ACQUIRE
    first = plan.next_wait_ms()
    assert first is not None
    assert plan.answered(None, waited=True) == "nil"  # at once: cut short
    assert not plan.gives_up(waited=True)
    assert plan.wait_again_in(waited=True) == common.WAIT_AGAIN_PAUSE == 0.01
    time.sleep(0.1)
    again = plan.next_wait_ms()
    assert again is not None
    assert again <= first - 100  # what is left of it
    assert plan.token == token
    time.sleep(0.07)  # within 50 ms of the end: a time-out
    assert plan.answered(None, waited=True) == "nil"
    assert plan.gives_up(waited=True)
