//! Runs the invoice example end to end: a throwaway PostgreSQL, a redis-server with the module,
//! a stalled worker and healthy ones.

#[path = "../examples/invoice_worker.rs"]
#[allow(dead_code)] // the example's `main`
mod invoice_worker;

use dlock_testkit::{Postgres, Server};

#[test]
fn a_stalled_workers_late_update_is_refused_and_every_invoice_is_paid_once() {
    let server = Server::start();
    let pg = Postgres::start();
    let report = invoice_worker::run_demo(&server.url(), &pg.config(), 6, 2);

    let stalled = report.stalled_fence;
    assert!(stalled > 0, "{report:#?}");
    assert_eq!(
        report.refused,
        vec![(1, "worker-stalled".to_owned(), stalled)],
        "the stalled worker's late update of invoice 1 was refused, and nothing else: {report:#?}"
    );
    assert!(
        report.lost.iter().any(|(id, worker, _)| *id == 1 && worker == "worker-stalled"),
        "the stalled worker learnt it lost the lease: {report:#?}"
    );
    assert_eq!(report.rows.len(), 6);
    for (id, status, by, fence) in &report.rows {
        assert_eq!(status, "paid", "invoice {id}: {report:#?}");
        let by = by.as_deref().unwrap_or_default();
        assert!(by.starts_with("worker-") && by != "worker-stalled", "invoice {id} paid by {by}");
        let paid: Vec<_> = report.paid.iter().filter(|(paid_id, ..)| paid_id == id).collect();
        assert_eq!(paid.len(), 1, "invoice {id} paid exactly once: {report:#?}");
        assert_eq!(paid[0].2 as i64, *fence, "the row carries the fence of its payment");
    }
    let row_1_fence = report.rows[0].3;
    assert!(row_1_fence > stalled as i64, "invoice 1 was taken over with a larger fence");
}
