"""What redis-py's defaults (tested with 8.1.0) do to DLOCK.ACQUIRE ... WAIT, and the settings
docs/clients.md recommends. Prints `name=value` lines that tests/clients.rs checks.

redis-py 8 reads with a 5 s socket timeout and retries a timed-out command 10 times by default,
each time on a new connection (it closes the one that timed out).

Usage: timeouts_redis_py.py PORT
"""
import sys
import threading
import time
import uuid

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

port = int(sys.argv[1])
other = redis.Redis(port=port, decode_responses=True)


def counter(name: str) -> int:
    return int(other.info("dlock")[f"dlock_{name}"])


def poll(probe, deadline_s: float, what: str) -> float:
    """Polls `probe` until it is true; returns the seconds it took. Fails after the deadline."""
    started = time.monotonic()
    while not probe():
        if time.monotonic() - started > deadline_s:
            raise AssertionError(f"{what}: not within {deadline_s} s")
        time.sleep(0.005)
    return time.monotonic() - started


def report(name: str, value) -> None:
    print(f"{name}={value}", flush=True)


def ms(seconds: float) -> int:
    return round(seconds * 1000)


defaults = redis.Redis(port=port)
report("default_socket_timeout_s", defaults.get_connection_kwargs()["socket_timeout"])
report("default_retries", defaults.get_retry().get_retries())
other.execute_command("DLOCK.ACQUIRE", "job:{py}", "holder", 60000)

# A WAIT shorter than the socket timeout: one wait in the server, ended by the server.
started = time.monotonic()
reply = defaults.execute_command(
    "DLOCK.ACQUIRE", "job:{py}", str(uuid.uuid4()), 30000, "WAIT", 1000, "CLAIM", 1000
)
assert reply is None, reply
report("short_wait_elapsed_ms", ms(time.monotonic() - started))
report("short_wait_waits_started", counter("waits_started"))

# A WAIT longer than the socket timeout: redis-py gives up after 5 s, closes the connection (the
# server drops the waiter) and sends the same ACQUIRE again on a new one, at the back of the line.
outcome = {}


def long_wait() -> None:
    call_started = time.monotonic()
    outcome["fence"] = defaults.execute_command(
        "DLOCK.ACQUIRE", "job:{py}", str(uuid.uuid4()), 30000, "WAIT", 6000, "CLAIM", 1000
    )
    outcome["elapsed"] = time.monotonic() - call_started


thread = threading.Thread(target=long_wait)
started = time.monotonic()
thread.start()
poll(lambda: counter("waits_started") == 2, 2, "the long WAIT blocks")
poll(lambda: counter("waits_started") == 3, 8, "redis-py sends the WAIT again")
report("resent_after_ms", ms(time.monotonic() - started))
# The server sees the old connection close about when the new one sends.
poll(lambda: counter("waits_abandoned") == 1, 2, "the server drops the first waiter")
report("abandoned_when_resent", counter("waits_abandoned"))
report("waiters_when_resent", counter("waiters"))
# Release: the second attempt (the only waiter left) gets the lease; the caller sees one call.
other.execute_command("DLOCK.RELEASE", "job:{py}", "holder")
thread.join(5)
assert not thread.is_alive(), "the long WAIT did not return"
assert isinstance(outcome["fence"], int), outcome
report("long_wait_call_ms", ms(outcome["elapsed"]))
report("long_wait_waits_started", counter("waits_started") - 1)
report("long_wait_waits_granted", counter("waits_granted"))
other.delete("job:{py}")

# Recommended: socket timeout above the wait, no retries, CLAIM (tests/clients/snippet.py).
WAIT_MS = 6000
recommended = redis.Redis(port=port, socket_timeout=WAIT_MS / 1000 + 5, retry=Retry(NoBackoff(), 0))
other.execute_command("DLOCK.ACQUIRE", "job:{py}", "holder", 60000)
before = {name: counter(name) for name in ("waits_started", "waits_granted", "grants_claimed")}
token = str(uuid.uuid4())
outcome.clear()


def recommended_wait() -> None:
    outcome["fence"] = recommended.execute_command(
        "DLOCK.ACQUIRE", "job:{py}", token, 30000, "WAIT", WAIT_MS, "CLAIM", 1000
    )


thread = threading.Thread(target=recommended_wait)
thread.start()
poll(lambda: counter("waiters") == 1, 2, "the recommended WAIT blocks")
other.execute_command("DLOCK.RELEASE", "job:{py}", "holder")
thread.join(5)
fence = outcome["fence"]
assert isinstance(fence, int), outcome
# Claim: the same ACQUIRE again answers the same fence and starts the full ttl.
assert recommended.execute_command("DLOCK.ACQUIRE", "job:{py}", token, 30000) == fence
for name, value in before.items():
    report(f"recommended_{name}", counter(name) - value)
assert recommended.execute_command("DLOCK.RELEASE", "job:{py}", token) == 1
