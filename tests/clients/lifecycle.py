"""The whole dlock lifecycle from redis-py (tested with 8.1.0), under RESP2 and RESP3.

Usage: lifecycle.py PORT
"""
import sys

import redis

port = int(sys.argv[1])
for protocol in (2, 3):
    r = redis.Redis(port=port, protocol=protocol)
    resource = f"invoice:{{py{protocol}}}"
    fence = r.execute_command("DLOCK.ACQUIRE", resource, "py-worker", 30000)
    assert isinstance(fence, int) and fence > 0, fence
    assert r.execute_command("DLOCK.ACQUIRE", resource, "other", 30000) is None
    assert r.execute_command("DLOCK.RENEW", resource, "py-worker", 30000) == 1
    added = r.execute_command("DLOCK.FENCED", resource, fence, "HSET", f"{resource}:data", "status", "paid")
    assert added == 1, added
    try:
        r.execute_command("DLOCK.FENCED", resource, fence + 1, "HSET", f"{resource}:data", "status", "stale")
        raise AssertionError("a stale fence was accepted")
    except redis.ResponseError as error:
        # The snippet in docs/clients.md tests for a STALE refusal exactly this way.
        assert str(error).startswith("STALE"), error
    assert r.execute_command("DLOCK.FENCECHECK", resource, fence) == 1
    info = r.execute_command("DLOCK.INFO", resource)
    fields = info if isinstance(info, dict) else dict(zip(info[::2], info[1::2]))
    fields = {k.decode() if isinstance(k, bytes) else k: v for k, v in fields.items()}
    assert fields["owner"] in (b"py-worker", "py-worker"), fields
    assert fields["fence"] == fence, fields
    assert r.execute_command("DLOCK.RELEASE", resource, "py-worker") == 1
    assert r.execute_command("DLOCK.INFO", resource) is None
print("redis-py: OK")
