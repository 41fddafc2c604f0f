package invoice_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	_ "github.com/lib/pq"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/examples/invoice"
	"github.com/dlock-dev/dlock/go/internal/testkit"
)

// Worker A's lease is lost while it processes (an operator's DEL stands for a pause past its ttl);
// worker B takes over and pays; A's late write, with the older fence, changes nothing.
func TestAStaleWorkersWriteIsRefusedByPostgreSQL(t *testing.T) {
	url := testkit.StartPostgres(t)
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	db, err := sql.Open("postgres", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, invoice.Schema); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO invoices (id, status) VALUES ('123', 'open')`); err != nil {
		t.Fatal(err)
	}
	locks := dlock.New(rdb)
	defer locks.Close()

	var fenceA, fenceB uint64
	errA := locks.Do(ctx, "invoice:123", func(ctx context.Context, lease *dlock.Lease) error {
		fenceA = lease.Fence()
		if err := invoice.SetStatus(ctx, db, "123", "processing", fenceA); err != nil {
			return err
		}
		rdb.Del(ctx, "invoice:123") // A's lease ends while A still works
		// B takes the invoice over and pays it.
		errB := invoice.Pay(context.Background(), locks, db, "123", func(context.Context) error { return nil })
		if errB != nil {
			t.Errorf("worker B: %v", errB)
		}
		var status string
		_ = db.QueryRowContext(ctx, `SELECT status, fence FROM invoices WHERE id = '123'`).Scan(&status, &fenceB)
		// A cannot stop at once: its write goes out anyway, after B's, with A's fence.
		return invoice.SetStatus(context.WithoutCancel(ctx), db, "123", "failed", fenceA)
	}, dlock.TTL(5*time.Second))

	if !errors.Is(errA, invoice.ErrStaleWorker) || !errors.Is(errA, dlock.ErrLeaseLost) {
		t.Fatalf("worker A: %v, want its stale write refused and its loss reported", errA)
	}
	var status string
	var fence uint64
	if err := db.QueryRowContext(ctx, `SELECT status, fence FROM invoices WHERE id = '123'`).Scan(&status, &fence); err != nil {
		t.Fatal(err)
	}
	if status != "paid" || fence != fenceB || fenceB <= fenceA {
		t.Fatalf("row: %s under fence %d (A %d, B %d)", status, fence, fenceA, fenceB)
	}
}
