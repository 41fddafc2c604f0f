# Acquire, write under the fence, release, from redis-py (tested with redis-py 8.1.0).
import sys
import uuid

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

WAIT_MS = 5000
r = redis.Redis(
    port=int(sys.argv[1]) if len(sys.argv) > 1 else 6379,
    # The socket timeout must outlast the wait in the server, or the client gives up (and, with
    # retries on, sends ACQUIRE again) while the server still holds its place in the queue.
    socket_timeout=WAIT_MS / 1000 + 5,
    # No silent retries: a retried DLOCK.FENCED could run its write twice.
    retry=Retry(NoBackoff(), 0),
)
token = str(uuid.uuid4())  # made before the first send; a retried ACQUIRE sends the same token
try:
    # CLAIM: a lease handed over to a client that gave up (and never claims it) lapses in 10 s.
    fence = r.execute_command(
        "DLOCK.ACQUIRE", "invoice:{123}", token, 30000, "WAIT", WAIT_MS, "CLAIM", 10000
    )
except (redis.ConnectionError, redis.TimeoutError):
    # Failed on this side: the lease may have been handed over as it failed. redis-py closed that
    # connection; release the token (this attempt's alone) from a new one.
    r.execute_command("DLOCK.RELEASE", "invoice:{123}", token)
    raise
if fence is None:
    sys.exit("invoice:{123} is held by someone else; try again later")
# Claim it: the same ACQUIRE again answers the same fence and starts the full ttl.
r.execute_command("DLOCK.ACQUIRE", "invoice:{123}", token, 30000)
try:
    r.execute_command(
        "DLOCK.FENCED", "invoice:{123}", fence, "HSET", "invoice:{123}:data", "status", "paid"
    )
    print(f"paid under fence {fence}")
except redis.ResponseError as error:
    if not str(error).startswith("STALE"):
        raise
    print("the lease ended before the write; nothing was written")
finally:
    r.execute_command("DLOCK.RELEASE", "invoice:{123}", token)  # 0 if the lease had ended
