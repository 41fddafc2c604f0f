//! Fenced SQL writes: the protected rows carry a `fencing_token BIGINT NOT NULL` column and every
//! write is `UPDATE … SET …, fencing_token = $fence WHERE … AND fencing_token <= $fence`. The
//! database then refuses a write from a worker whose lease was superseded, even if the worker
//! never noticed (a stall, a lost renewal, a partition): a newer lease's write raised the
//! row's fencing token above the stale fence.
//!
//! [`check_rows`] turns a statement's row count into that verdict for any SQL library;
//! with the `postgres` feature, [`execute_fenced`] runs the statement through `tokio-postgres`.

/// A fenced write matched no row: a newer lease already wrote it. The worker holding `fence` is
/// stale and must stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleWrite {
    /// The fence the refused write carried.
    pub fence: u64,
}

impl std::fmt::Display for StaleWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stale fence {}: a newer lease already wrote this row", self.fence)
    }
}

impl std::error::Error for StaleWrite {}

/// The verdict on a fenced statement that changed `rows` rows: `Ok(rows)` when it wrote,
/// [`StaleWrite`] when it matched nothing. The statement's other conditions (the row's key) must
/// match an existing row, so that no match means the fence condition refused it.
pub fn check_rows(rows: u64, fence: u64) -> Result<u64, StaleWrite> {
    if rows == 0 {
        crate::observe::stale_write_refused();
        Err(StaleWrite { fence })
    } else {
        Ok(rows)
    }
}

/// Why [`execute_fenced`] did not write.
#[cfg(feature = "postgres")]
#[derive(Debug)]
pub enum SqlFencedError {
    /// The fence condition refused the write: the worker is stale.
    Stale(StaleWrite),
    /// PostgreSQL's own error.
    Postgres(tokio_postgres::Error),
}

#[cfg(feature = "postgres")]
impl std::fmt::Display for SqlFencedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stale(stale) => write!(f, "{stale}"),
            Self::Postgres(e) => write!(f, "{e}"),
        }
    }
}

#[cfg(feature = "postgres")]
impl std::error::Error for SqlFencedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Stale(stale) => Some(stale),
            Self::Postgres(e) => Some(e),
        }
    }
}

/// Runs the fenced `statement` with `params` and then `fence` (as `BIGINT`) as its last
/// parameter, so the statement names the fence `$N` with `N = params.len() + 1`:
///
/// ```no_run
/// # async fn example(pg: &tokio_postgres::Client, lease: &dlock_client::Lease)
/// #     -> Result<(), dlock_client::sql::SqlFencedError> {
/// let id: i64 = 42;
/// dlock_client::sql::execute_fenced(
///     pg,
///     "UPDATE invoices SET status = 'paid', fencing_token = $2 \
///      WHERE id = $1 AND fencing_token <= $2",
///     &[&id],
///     lease.fence(),
/// )
/// .await?;
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "postgres")]
pub async fn execute_fenced<C: tokio_postgres::GenericClient>(
    pg: &C,
    statement: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    fence: u64,
) -> Result<u64, SqlFencedError> {
    // The server never mints a fence above 2^63 - 1, so a fence always fits a BIGINT.
    let bigint = i64::try_from(fence).unwrap_or(i64::MAX);
    let mut all: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params.to_vec();
    all.push(&bigint);
    let rows = pg.execute(statement, &all).await.map_err(SqlFencedError::Postgres)?;
    check_rows(rows, fence).map_err(SqlFencedError::Stale)
}
