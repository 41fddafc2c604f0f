// Package invoice is the worker of the article dlock started from, for real: one worker at a
// time pays an invoice under a lease, and PostgreSQL refuses the write of a worker whose lease
// was lost meanwhile, whatever that worker still does: the row keeps the highest fence that wrote
// it, and an UPDATE names its own fence in the WHERE clause.
package invoice

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	dlock "github.com/dlock-dev/dlock/go"
)

// Schema: fence starts at 0, below every fence the server gives.
const Schema = `CREATE TABLE IF NOT EXISTS invoices (
	id     text PRIMARY KEY,
	status text NOT NULL,
	fence  bigint NOT NULL DEFAULT 0
)`

// ErrStaleWorker: the row was written under a newer fence; this worker's write changed nothing.
var ErrStaleWorker = errors.New("invoice: stale worker, write refused")

// SetStatus writes status under fence: only if no newer fence wrote the row (the same fence may
// write again).
func SetStatus(ctx context.Context, db *sql.DB, id, status string, fence uint64) error {
	result, err := db.ExecContext(ctx,
		`UPDATE invoices SET status = $1, fence = $2 WHERE id = $3 AND fence <= $2`,
		status, int64(fence), id)
	if err != nil {
		return err
	}
	rows, err := result.RowsAffected()
	if err != nil {
		return err
	}
	if rows == 0 {
		return fmt.Errorf("%w: invoice %s, fence %d", ErrStaleWorker, id, fence)
	}
	return nil
}

// Pay marks the invoice paid under a lease on "invoice:<id>"; process does the work in between
// (its context is cancelled if the lease is lost).
func Pay(ctx context.Context, locks *dlock.Locks, db *sql.DB, id string, process func(ctx context.Context) error) error {
	return locks.Do(ctx, "invoice:"+id, func(ctx context.Context, lease *dlock.Lease) error {
		if err := SetStatus(ctx, db, id, "processing", lease.Fence()); err != nil {
			return err
		}
		if err := process(ctx); err != nil {
			return err
		}
		return SetStatus(ctx, db, id, "paid", lease.Fence())
	})
}
