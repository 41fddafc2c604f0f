// Fenced writes elsewhere (SQL): the row keeps the highest fence seen, and a write goes through
// only when the lease's fence is at least that. 0 rows updated means a newer holder wrote: stale.

import { StaleError } from "./errors.js";

/** Anything with pg's `query(text, values)` returning `rowCount` (pg's Client, Pool, PoolClient). */
export interface SqlClient {
  query(text: string, values?: unknown[]): Promise<{ rowCount: number | null }>;
}

/**
 * Runs a fenced UPDATE: `sql` must guard itself with the fence (`… WHERE id = $1 AND fence <= $2`,
 * setting `fence = $2`). Rejects with StaleError when it updated no row.
 */
export async function fencedSql(
  db: SqlClient,
  lease: { resource: string; fence: number },
  sql: string,
  values: unknown[],
): Promise<number> {
  const result = await db.query(sql, values);
  const rows = result.rowCount ?? 0;
  if (rows === 0) throw new StaleError(lease.resource, lease.fence, "0 rows updated: a newer fence wrote");
  return rows;
}
