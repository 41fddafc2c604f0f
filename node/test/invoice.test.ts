// The PostgreSQL invoice example (examples/invoice.ts) end to end: a real, throwaway PostgreSQL
// and a server with the module, one of each for the file. The example imports @dlock/client (the
// built package): its errors are told apart by `code` here.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { after, before, describe, test } from "node:test";

import type { Redis } from "ioredis";
import pg from "pg";

import { Locks, type Lease } from "@dlock/client";
import { pay, SCHEMA, setStatus } from "../examples/invoice.js";
import { Postgres, Server } from "./kit.js";

const run = promisify(execFile);

describe("the invoice example against PostgreSQL", { timeout: 60_000 }, () => {
  let postgres: Postgres | null;
  let server: Server;
  let redis: Redis;
  let db: pg.Pool;
  let locks: Locks;
  before(async () => {
    [postgres, server] = await Promise.all([Postgres.start(), Server.start()]);
    redis = server.ioredis();
    locks = new Locks(redis);
    if (postgres !== null) {
      db = new pg.Pool({ connectionString: postgres.url });
      // pool.end() does not wait for its clients' goodbyes: one may still hear the shutdown.
      db.on("error", () => undefined);
    }
  });
  after(async () => {
    locks.close();
    redis.disconnect();
    if (postgres !== null) await db.end();
    postgres?.stop();
    server.stop();
  });

  const row = async (): Promise<{ status: string; fence: number }> => {
    const { rows } = await db.query<{ status: string; fence: string }>("SELECT status, fence FROM invoices WHERE id = '42'");
    assert.ok(rows[0] !== undefined, "no row for invoice 42");
    return { status: rows[0].status, fence: Number(rows[0].fence) };
  };

  test("run as a program, it creates invoice 42 and pays it under its lease's fence", async (t) => {
    if (postgres === null) {
      t.skip("PostgreSQL is not installed (DLOCK_PG_BIN, /usr/lib/postgresql)");
      return;
    }
    const program = join(import.meta.dirname, "..", "examples", "invoice.js");
    const { stdout } = await run(process.execPath, [program], { env: { ...process.env, REDIS_URL: server.url, DATABASE_URL: postgres.url } });
    const paid = await row();
    assert.equal(paid.status, "paid");
    assert.ok(paid.fence > 0);
    assert.equal(stdout.trim(), `invoice 42: paid under fence ${String(paid.fence)}`);
  });

  test("a stale worker's write is refused: the row keeps the newer worker's status and fence", async (t) => {
    if (postgres === null) {
      t.skip("PostgreSQL is not installed (DLOCK_PG_BIN, /usr/lib/postgresql)");
      return;
    }
    await db.query(SCHEMA);
    await db.query("INSERT INTO invoices (id, status) VALUES ('42', 'open') ON CONFLICT (id) DO UPDATE SET status = 'open', fence = 0");
    let leaseA: Lease | null = null;
    let afterB = { status: "", fence: 0 };
    const errorA: unknown = await locks
      .using("invoice:42", { ttl: 5_000 }, async (lease) => {
        leaseA = lease;
        await setStatus(db, lease, "42", "processing");
        // A's lease ends while A still works (an operator's DEL stands for a pause past its ttl).
        await redis.del("invoice:42");
        // B takes the invoice over and pays it.
        await pay(locks, db, "42", () => Promise.resolve());
        afterB = await row();
        // A cannot stop at once: its write goes out anyway, after B's, under A's older fence.
        await setStatus(db, lease, "42", "failed");
      })
      .then(
        () => null,
        (error: unknown) => error,
      );
    const a = leaseA as Lease | null;
    assert.ok(a !== null);
    // A's own error is the refused write; its lease was found gone at the end (ended).
    assert.equal((errorA as { code?: string } | null)?.code, "ERR_DLOCK_STALE");
    assert.equal(a.lost?.reason, "ended");
    assert.equal(afterB.status, "paid");
    assert.ok(afterB.fence > a.fence, `B's fence ${String(afterB.fence)} after A's ${String(a.fence)}`);
    assert.deepEqual(await row(), afterB);
  });
});
