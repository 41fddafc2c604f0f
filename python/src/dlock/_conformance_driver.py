"""The Python client's conformance driver: JSON lines on stdin and stdout, as
``docs/protocol.md`` (section 14) specifies. Run as ``python -m dlock._conformance_driver`` with
``DLOCK_URL`` set; the harness (``scripts/conformance.sh``) starts it.

Every request runs in a thread of its own. A held lease (a set: ``hold_all``) is a ``with`` block
of the threaded client in its own thread, which waits there for the harness's ``run`` or
``release``."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.cluster import RedisCluster

from . import __version__
from . import _protocol as protocol
from ._errors import LeaseLost, NotAcquired, Stale, Unsupported
from ._sync import Hold, Lease, Locks, SetHold, SetLease

# How often an idle holder looks at its lease's ``lost`` flag (the event's delay at most).
POLL = 0.01


class WorkFailed(Exception):
    """The work's own failure (a run with ``fail``)."""


@dataclass
class Order:
    """What the harness asks of a held lease: ``release`` or ``run``."""

    id: int
    op: str
    work_ms: int = 0
    fail: bool = False


@dataclass
class Held:
    """A lease the harness named, its orders, and whether its block ended."""

    lease: Lease | SetLease
    orders: queue.Queue[Order] = field(default_factory=queue.Queue)
    ended: bool = False
    lost_reported: bool = False


def jsonable(reply: Any) -> Any:
    """A server's reply as JSON: bytes as text, lists as arrays."""
    if isinstance(reply, bytes):
        return reply.decode("utf-8", "replace")
    if isinstance(reply, (list, tuple)):
        return [jsonable(item) for item in reply]
    if isinstance(reply, dict):
        return [jsonable(part) for pair in reply.items() for part in pair]
    return reply


def error_of(error: BaseException) -> dict[str, Any]:
    """The interface's error for an exception of the client."""
    detail = str(error)
    if isinstance(error, NotAcquired):
        return {"kind": "held", "detail": detail}
    if isinstance(error, LeaseLost):
        return {"kind": "lost", "reason": error.reason, "detail": detail}
    if isinstance(error, Stale):
        return {"kind": "stale", "detail": detail}
    if isinstance(error, Unsupported):
        return {"kind": "unsupported", "detail": detail}
    if isinstance(error, WorkFailed):
        return {"kind": "work", "detail": detail}
    if isinstance(error, redis.TimeoutError):
        return {"kind": "unknown", "detail": detail}
    if isinstance(error, redis.ConnectionError):
        return {"kind": "unreachable", "detail": detail}
    if isinstance(error, redis.RedisError):
        return {"kind": protocol.class_of(error) or "server", "detail": detail}
    return {"kind": "server", "detail": f"{type(error).__name__}: {detail}"}


def connect(url: str) -> Any:
    """A redis-py client for ``url``: several comma-separated URLs are a Cluster's seeds (the
    first is enough for redis-py: it reads the slot map there)."""
    seeds = url.split(",")
    if len(seeds) == 1:
        return redis.Redis.from_url(seeds[0])
    address = seeds[0].split("://", 1)[-1].rstrip("/")
    host, port = address.rsplit(":", 1)
    return RedisCluster(host=host, port=int(port))


class Driver:
    """Answers the harness's requests with one ``dlock.Locks`` per wait strategy."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._out = threading.Lock()
        self._state = threading.Lock()
        self._locks: dict[tuple[str, float], Locks] = {}
        self._leases: dict[str, Held] = {}

    def write(self, line: dict[str, Any]) -> None:
        text = json.dumps(line)
        with self._out:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def reply(self, id: int, ok: Any = None, error: dict[str, Any] | None = None) -> None:
        if error is not None:
            self.write({"id": id, "error": error})
        else:
            self.write({"id": id, "ok": ok})

    def locks(self, wait: str, ticket_ttl: float) -> Locks:
        with self._state:
            key = (wait, ticket_ttl)
            if key not in self._locks:
                self._locks[key] = Locks(self.client, wait=wait, ticket_ttl=ticket_ttl)
            return self._locks[key]

    def serve(self, request: dict[str, Any]) -> None:
        id = int(request.get("id", 0))
        op = str(request.get("op", ""))
        try:
            if op in ("hold", "wait", "ticket", "shared", "semaphore", "campaign"):
                self.hold(id, op, request)
            elif op == "hold_all":
                self.hold_all(id, request)
            elif op in ("release", "run"):
                order = Order(
                    id,
                    op,
                    int(request.get("work_ms", 0)),
                    bool(request.get("fail", False)),
                )
                self.order(str(request.get("lease", "")), order)
            elif op == "fenced":
                self.fenced(id, request)
            elif op == "observe":
                self.observe(id, str(request.get("name", "")))
            else:
                self.reply(id, error={"kind": "usage", "detail": f"unknown op {op!r}"})
        except Exception as error:  # a driver's own mistake: answered, never silent
            self.reply(id, error={"kind": "server", "detail": f"driver: {error!r}"})

    def _hold_of(self, op: str, request: dict[str, Any]) -> Hold:
        tickets = op == "ticket" or request.get("strategy") == "tickets"
        ticket_ttl = int(request.get("ticket_ms", 6000)) / 1000
        locks = self.locks("tickets" if tickets else "block", ticket_ttl)
        ttl = int(request.get("ttl_ms", 30000)) / 1000
        wait_ms = request.get("wait_ms")
        timeout = 0.0 if wait_ms is None else int(wait_ms) / 1000
        meta = request.get("meta")
        mode = request.get("mode")
        max_hold_ms = request.get("max_hold_ms")
        bound = None if max_hold_ms is None else int(max_hold_ms) / 1000
        if op == "campaign":
            name, address = str(request["name"]), str(request["address"])
            return locks.campaign(name, address=address, ttl=ttl, timeout=timeout, max_hold=bound)
        resource = str(request["resource"])
        if op == "shared" or mode == "shared":
            return locks.read(resource, ttl=ttl, timeout=timeout, meta=meta, max_hold=bound)
        if op == "semaphore" or mode == "permits":
            permits = int(request.get("permits", 1))
            return locks.semaphore(
                resource, permits, ttl=ttl, timeout=timeout, meta=meta, max_hold=bound
            )
        return locks.hold(resource, ttl=ttl, timeout=timeout, meta=meta, max_hold=bound)

    def hold(self, id: int, op: str, request: dict[str, Any]) -> None:
        hold = self._hold_of(op, request)
        try:
            lease = hold.__enter__()
        except Exception as error:
            self.reply(id, error=error_of(error))
            return
        granted: dict[str, Any] = {"fence": lease.fence, "token": lease.token}
        self.held(id, str(request.get("lease", "")), hold, lease, granted)

    def hold_all(self, id: int, request: dict[str, Any]) -> None:
        resources = [str(resource) for resource in request["resources"]]
        ttl = int(request.get("ttl_ms", 30000)) / 1000
        wait_ms = request.get("wait_ms")
        timeout = 0.0 if wait_ms is None else int(wait_ms) / 1000
        hold = self.locks("block", 6.0).hold_all(resources, ttl=ttl, timeout=timeout)
        try:
            lease = hold.__enter__()
        except Exception as error:
            self.reply(id, error=error_of(error))
            return
        granted: dict[str, Any] = {"fences": list(lease.fences), "token": lease.token}
        self.held(id, str(request.get("lease", "")), hold, lease, granted)

    def held(
        self,
        id: int,
        name: str,
        hold: Hold | SetHold,
        lease: Lease | SetLease,
        granted: dict[str, Any],
    ) -> None:
        """Answers the grant, then holds the lease (its block open) until the harness's
        ``run`` or ``release``, or its loss."""
        held = Held(lease)
        with self._state:
            self._leases[name] = held
        self.reply(id, granted)
        order: Order | None = None
        while order is None and not lease.lost.is_set():
            with contextlib.suppress(queue.Empty):
                order = held.orders.get(timeout=POLL)
        failure: BaseException | None = None
        if order is not None and order.op == "run":
            try:
                ends = time.monotonic() + order.work_ms / 1000
                while (left := ends - time.monotonic()) > 0:
                    lease.check()
                    time.sleep(min(POLL, left))
                if order.fail:
                    raise WorkFailed("the work failed")
            except (LeaseLost, WorkFailed) as error:
                failure = error
        self.report_loss(name, held)
        exit_error: LeaseLost | None = None
        try:
            hold.__exit__(type(failure) if failure else None, failure, None)
        except LeaseLost as error:  # the release found the lease gone
            exit_error = error
        self.report_loss(name, held)
        with self._state:
            held.ended = True
            late = []
            while not held.orders.empty():
                late.append(held.orders.get())
        if order is not None:
            self.answer(order, failure, exit_error)
        for other in late:
            self.answer_ended(other)

    def report_loss(self, name: str, held: Held) -> None:
        """The ``lost`` event, once, as soon as the lease says it is lost."""
        if held.lease.lost.is_set() and not held.lost_reported:
            held.lost_reported = True
            self.write({"event": "lost", "lease": name, "reason": held.lease.lost_reason})

    def answer(
        self, order: Order, failure: BaseException | None, exit_error: LeaseLost | None
    ) -> None:
        if order.op == "release":
            self.reply(order.id, {"released": failure is None and exit_error is None})
        elif failure is not None:
            # The work's own error wins over anything the release met.
            self.reply(order.id, error=error_of(failure))
        elif exit_error is not None:
            self.reply(order.id, error=error_of(exit_error))
        else:
            self.reply(order.id, {"output": "done"})

    def answer_ended(self, order: Order) -> None:
        if order.op == "release":
            self.reply(order.id, {"released": False})
        else:
            self.reply(order.id, error={"kind": "lost", "detail": "the lease already ended"})

    def order(self, name: str, order: Order) -> None:
        with self._state:
            held = self._leases.get(name)
            if held is None:
                self.reply(order.id, error={"kind": "usage", "detail": f"no lease {name!r}"})
                return
            if not held.ended:
                held.orders.put(order)
                return
        self.answer_ended(order)

    def fenced(self, id: int, request: dict[str, Any]) -> None:
        name = str(request.get("lease", ""))
        with self._state:
            held = self._leases.get(name)
        if held is None:
            self.reply(id, error={"kind": "usage", "detail": f"no lease {name!r}"})
            return
        command = [str(arg) for arg in request.get("command", [])]
        try:
            if isinstance(held.lease, SetLease):
                member = str(request.get("resource", ""))
                if member not in held.lease.resources:
                    detail = f"{member!r} is not in the set {name!r}"
                    self.reply(id, error={"kind": "usage", "detail": detail})
                    return
                reply = held.lease.fenced(member, *command)
            else:
                reply = held.lease.fenced(*command)
        except Exception as error:
            self.reply(id, error=error_of(error))
            return
        self.reply(id, {"reply": jsonable(reply)})

    def observe(self, id: int, name: str) -> None:
        changes = self.locks("block", 6.0).observe(name, interval=1.0)
        self.reply(id, {})
        for leader in changes:
            shown = None
            if leader is not None:
                address = leader.address
                if isinstance(address, bytes):
                    address = address.decode("utf-8", "replace")
                shown = {"token": leader.token, "fence": leader.fence, "address": address}
            self.write({"event": "leader", "name": name, "leader": shown})


def main() -> None:
    url = os.environ["DLOCK_URL"]
    driver = Driver(connect(url))
    driver.write({"event": "ready", "client": f"dlock (Python) {__version__}"})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError:
            print(f"dlock conformance driver: not JSON: {line!r}", file=sys.stderr)
            continue
        threading.Thread(target=driver.serve, args=(request,), daemon=True).start()
    # Stdin closed: exit without releasing anything (no block exits, no renewer waits).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
