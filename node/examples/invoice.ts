// The invoice worker: one worker at a time pays an invoice under a lease on "invoice:<id>", and
// PostgreSQL refuses the write of a worker whose lease was lost meanwhile, whatever that worker
// still does: the row keeps the highest fence that wrote it, and every UPDATE names its own
// fence in its WHERE clause (the same fence may write again; an older one changes nothing).
import { fileURLToPath } from "node:url";

import { Redis } from "ioredis";
import pg from "pg";
import { fencedSql, Locks, type Lease } from "@dlock/client";

/** The table; fence starts at 0, below every fence the server gives. */
export const SCHEMA = `CREATE TABLE IF NOT EXISTS invoices (
  id     text PRIMARY KEY,
  status text NOT NULL,
  fence  bigint NOT NULL DEFAULT 0
)`;

/** Writes status under the lease's fence; StaleError (nothing written) once a newer fence wrote. */
export async function setStatus(db: pg.Pool, lease: Lease, id: string, status: string): Promise<void> {
  await fencedSql(db, lease, "UPDATE invoices SET status = $1, fence = $2 WHERE id = $3 AND fence <= $2", [
    status,
    lease.fence,
    id,
  ]);
}

/** Pays the invoice under a lease on invoice:<id>; process gets the lease's signal (aborted on a loss). */
export async function pay(locks: Locks, db: pg.Pool, id: string, process: (signal: AbortSignal) => Promise<void>): Promise<void> {
  await locks.using(`invoice:${id}`, { ttl: 30_000 }, async (lease) => {
    await setStatus(db, lease, id, "processing");
    await process(lease.signal); // charge the card, passing the signal along
    await setStatus(db, lease, id, "paid");
  });
}

// As a program: pays invoice 42 ($REDIS_URL, $DATABASE_URL).
if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const redis = new Redis(process.env["REDIS_URL"] ?? "redis://127.0.0.1:6379");
  const db = new pg.Pool({ connectionString: process.env["DATABASE_URL"] });
  const locks = new Locks(redis);
  try {
    await db.query(SCHEMA);
    await db.query("INSERT INTO invoices (id, status) VALUES ('42', 'open') ON CONFLICT (id) DO NOTHING");
    await pay(locks, db, "42", () => Promise.resolve());
    const { rows } = await db.query<{ status: string; fence: string }>("SELECT status, fence FROM invoices WHERE id = '42'");
    console.log(`invoice 42: ${rows[0]?.status ?? "missing"} under fence ${rows[0]?.fence ?? "none"}`);
  } finally {
    locks.close();
    redis.disconnect();
    await db.end();
  }
}
