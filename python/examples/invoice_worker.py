"""The invoice worker: a lease from dlock, and every write to PostgreSQL fenced by it.

The protected row carries a ``fencing_token BIGINT NOT NULL DEFAULT 0`` column, and every write
sets it to the lease's fence *only if* no newer lease wrote the row before::

    UPDATE invoices SET status = %(status)s, fencing_token = %(fence)s
     WHERE id = %(id)s AND fencing_token <= %(fence)s

So a worker that stalled past its lease (a GC pause, a stopped VM, a lost renewal) and wakes up
after another worker took over cannot overwrite the newer state, even if it never noticed that
its lease was gone: the database refuses the write, and :func:`fenced_update` raises
:class:`dlock.Stale`. (``<=`` lets one lease write the same row several times; a newer lease's
write raises the token above every older fence.)

Run it against a server with the module and a PostgreSQL database::

    python examples/invoice_worker.py redis://127.0.0.1:6379/0 "host=127.0.0.1 user=postgres" 42
"""

from __future__ import annotations

import sys
from typing import Any

import psycopg
import redis
from typing_extensions import LiteralString

import dlock

SCHEMA = """
CREATE TABLE IF NOT EXISTS invoices (
    id            BIGINT PRIMARY KEY,
    status        TEXT   NOT NULL,
    fencing_token BIGINT NOT NULL DEFAULT 0
)
"""


def fenced_update(
    pg: psycopg.Connection[Any], lease: dlock.Lease, sql: LiteralString, **params: Any
) -> int:
    """Runs the fenced ``sql`` with ``params`` and the lease's fence as ``%(fence)s``; raises
    :class:`dlock.Stale` when the fence condition refused it. The statement's other conditions
    must match an existing row, so that no match means a newer lease wrote it."""
    with pg.cursor() as cursor:
        cursor.execute(sql, {**params, "fence": lease.fence})
        if cursor.rowcount == 0:
            raise dlock.Stale(lease.resource, lease.fence, "a newer lease already wrote this row")
        return cursor.rowcount


SET_STATUS = (
    "UPDATE invoices SET status = %(status)s, fencing_token = %(fence)s"
    " WHERE id = %(id)s AND fencing_token <= %(fence)s"
)


def pay_invoice(locks: dlock.Locks, pg: psycopg.Connection[Any], invoice_id: int) -> int:
    """Processes one invoice under its lock; returns the fence it was paid under."""
    with locks.hold(f"invoice:{invoice_id}", ttl=30, timeout=10) as lease:
        fenced_update(pg, lease, SET_STATUS, status="processing", id=invoice_id)
        # ... charge the customer, render the PDF ...
        lease.check()  # stop early if the lease is already known to be gone
        fenced_update(pg, lease, SET_STATUS, status="paid", id=invoice_id)
        return lease.fence


def main() -> None:
    redis_url, pg_dsn, invoice = sys.argv[1], sys.argv[2], int(sys.argv[3])
    locks = dlock.Locks(redis.Redis.from_url(redis_url))
    with psycopg.connect(pg_dsn, autocommit=True) as pg:
        pg.execute(SCHEMA)
        pg.execute(
            "INSERT INTO invoices (id, status) VALUES (%s, 'open') ON CONFLICT DO NOTHING",
            (invoice,),
        )
        fence = pay_invoice(locks, pg, invoice)
        print(f"invoice {invoice} paid under fence {fence}")


if __name__ == "__main__":
    main()
