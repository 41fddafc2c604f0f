"""The invoice worker example end to end: dlock leases and fenced writes to a real, throwaway
PostgreSQL (Debian's ``postgresql`` package: ``initdb`` and ``postgres`` from
``/usr/lib/postgresql/*/bin``, or ``DLOCK_PG_BIN``)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import dlock
from conftest import Server, free_port

psycopg = pytest.importorskip("psycopg")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import invoice_worker  # noqa: E402


def pg_bin() -> Path | None:
    configured = os.environ.get("DLOCK_PG_BIN")
    if configured:
        return Path(configured)
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: int(Path(path).parts[-3]) if Path(path).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


def as_postgres(*command: str) -> list[str]:
    """initdb refuses to run as root: run the server as the ``postgres`` user then."""
    return ["runuser", "-u", "postgres", "--", *command] if os.getuid() == 0 else list(command)


class Postgres:
    def __init__(self, bin_dir: Path) -> None:
        self.dir = tempfile.mkdtemp(prefix="dlock-py-pg-")
        if os.getuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        data = os.path.join(self.dir, "data")
        subprocess.run(
            as_postgres(
                str(bin_dir / "initdb"),
                "-D",
                data,
                "-A",
                "trust",
                "-U",
                "dlock",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ),
            check=True,
            capture_output=True,
        )
        self.port = free_port()
        with open(os.path.join(self.dir, "postgres.log"), "wb") as log:
            self.process = subprocess.Popen(
                as_postgres(
                    str(bin_dir / "postgres"),
                    "-D",
                    data,
                    "-p",
                    str(self.port),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    f"unix_socket_directories={self.dir}",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                ),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.dsn = f"host=127.0.0.1 port={self.port} user=dlock dbname=postgres"
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.dsn, connect_timeout=1).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.close()
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        pid_file = os.path.join(self.dir, "data", "postmaster.pid")
        if os.path.exists(pid_file):
            with open(pid_file) as pids:
                subprocess.run(["kill", "-INT", pids.readline().strip()], check=False)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    bin_dir = pg_bin()
    if bin_dir is None:
        if os.environ.get("DLOCK_REQUIRE_POSTGRES"):
            pytest.fail("PostgreSQL is not installed (apt-get install postgresql)")
        pytest.skip("PostgreSQL is not installed")
    server = Postgres(bin_dir)
    yield server
    server.close()


@pytest.fixture
def pg(postgres: Postgres) -> Iterator[Any]:
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        connection.execute("DROP TABLE IF EXISTS invoices")
        connection.execute(invoice_worker.SCHEMA)
        connection.execute("INSERT INTO invoices (id, status) VALUES (1, 'open'), (2, 'open')")
        yield connection


def row(pg: Any, invoice: int) -> tuple[str, int]:
    found = pg.execute(
        "SELECT status, fencing_token FROM invoices WHERE id = %s", (invoice,)
    ).fetchone()
    assert found is not None
    return (found[0], found[1])


def test_the_invoice_worker_pays_under_its_fence(server: Server, pg: Any) -> None:
    locks = dlock.Locks(redis.Redis(port=server.port))
    fence = invoice_worker.pay_invoice(locks, pg, 1)
    assert row(pg, 1) == ("paid", fence)
    assert server.client().exists("invoice:1") == 0


def test_a_stalled_worker_cannot_overwrite_a_newer_lease(server: Server, pg: Any) -> None:
    """The seed's scenario: worker A stalls past its lease, worker B takes over and writes; A
    wakes up and tries to write: PostgreSQL refuses it, and A learns it with dlock.Stale."""
    r = redis.Redis(port=server.port)
    locks = dlock.Locks(r)
    sql = invoice_worker.SET_STATUS
    with pytest.raises(dlock.Stale) as raised, locks.hold("invoice:2", ttl=30) as a:
        invoice_worker.fenced_update(pg, a, sql, status="processing", id=2)
        # A stalls; its lease ends (here an operator's DEL stands for the expiry) ...
        r.delete("invoice:2")
        # ... and B takes the invoice over.
        with locks.hold("invoice:2", ttl=30, timeout=0) as b:
            assert b.fence > a.fence
            invoice_worker.fenced_update(pg, b, sql, status="paid", id=2)
        # A wakes up without having noticed anything, and writes.
        invoice_worker.fenced_update(pg, a, sql, status="failed", id=2)
    assert raised.value.fence == a.fence
    assert row(pg, 2) == ("paid", b.fence)


def test_concurrent_workers_pay_once_each_under_increasing_fences(
    server: Server, postgres: Postgres, pg: Any
) -> None:
    locks = dlock.Locks(redis.Redis(port=server.port))
    fences: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with psycopg.connect(postgres.dsn, autocommit=True) as own:
                fences.append(invoice_worker.pay_invoice(locks, own, 1))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert len(set(fences)) == 4
    assert row(pg, 1) == ("paid", max(fences))
