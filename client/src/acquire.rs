//! Acquiring: one token per attempt made before the first send, waits in the server's queue, and
//! retries of an unknown outcome with the same token until the caller's deadline.

use std::time::{Duration, Instant};

use redis::RedisError;

use crate::connection::millis;
use crate::{AcquireError, Client, Lease, observe};

/// An error after which the request may or may not have been carried out, or that a retry may
/// get past (a server loading its data, a failover in progress).
fn is_ambiguous(error: &RedisError) -> bool {
    error.is_timeout()
        || error.is_connection_dropped()
        || error.is_io_error()
        || matches!(error.code(), Some("LOADING" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN"))
}

impl Client {
    /// Acquires `resource` for `ttl` without waiting: [`AcquireError::Held`] when someone else has it.
    pub async fn acquire(&self, resource: &str, ttl: Duration) -> Result<Lease, AcquireError> {
        self.acquire_waiting(resource, ttl, None).await
    }

    /// Acquires `resource` for `ttl`, waiting in the server's queue for at most `wait` (FIFO, no
    /// polling) when someone else holds it.
    pub async fn acquire_waiting(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Lease, AcquireError> {
        observe::acquire_attempt();
        let started = Instant::now();
        let acquired = self.try_acquire(resource, ttl, wait, started).await;
        match &acquired {
            Ok(lease) => observe::acquired(resource, &lease.token, lease.fence, started.elapsed()),
            Err(error) => observe::acquire_failed(error.kind()),
        }
        acquired
    }

    async fn try_acquire(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Option<Duration>,
        started: Instant,
    ) -> Result<Lease, AcquireError> {
        let token = uuid::Uuid::new_v4().to_string();
        let wait_ends = wait.map(|wait| started + wait);
        let deadline = started + self.options.acquire_deadline + wait.unwrap_or_default();
        let ttl_ms = millis(ttl);
        let mut reached_server = false;
        loop {
            // A retry waits only for what is left of the wait, with the same token: the server
            // replaces this token's earlier place in the queue, or answers with its grant.
            let waiting = wait_ends.map(|end| end.saturating_duration_since(Instant::now()));
            let mut cmd = redis::cmd("DLOCK.ACQUIRE");
            cmd.arg(resource).arg(&token).arg(ttl_ms);
            if let Some(wait) = waiting {
                cmd.arg("WAIT").arg(millis(wait));
            }
            let sent = Instant::now();
            match self.send_write::<Option<u64>>(&cmd, waiting.unwrap_or_default()).await {
                Ok((Some(fence), acked)) => {
                    let lease = Lease {
                        client: self.clone(),
                        resource: resource.to_owned(),
                        token,
                        fence,
                        ttl,
                        local_expiry: sent + Duration::from_millis(ttl_ms),
                        granted: Instant::now(),
                    };
                    return match (self.options.replicas, acked) {
                        (Some(replicas), Some(acked)) if acked < u64::from(replicas.count) => {
                            // Never reported as granted: released without a hold to record.
                            let token = lease.token.clone();
                            let released = matches!(
                                self.release_grant(resource, &token, Some(fence)).await,
                                Ok(true)
                            );
                            Err(AcquireError::NotReplicated {
                                token,
                                acked,
                                wanted: replicas.count,
                                released,
                            })
                        }
                        _ => Ok(lease),
                    };
                }
                Ok((None, _)) => return Err(AcquireError::Held),
                Err(failure) if is_ambiguous(failure.error()) => {
                    // Anything but a request that never left may have left a grant behind.
                    reached_server |= failure.was_sent();
                    let error = RedisError::from(failure);
                    if Instant::now() >= deadline {
                        return Err(if reached_server {
                            AcquireError::Unknown { token, source: error }
                        } else {
                            AcquireError::Unreachable(error)
                        });
                    }
                    // Retry with the same token: the server's idempotent ACQUIRE tells the truth.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // After an attempt that may have been granted, the token must not be lost.
                Err(failure) if reached_server => {
                    return Err(AcquireError::Unknown { token, source: failure.into() });
                }
                Err(failure) => return Err(AcquireError::Server(failure.into())),
            }
        }
    }

    /// Releases a grant known only by its token (after [`AcquireError::Unknown`]): `true` if it
    /// was held and is released now.
    pub async fn release(&self, resource: &str, token: &str) -> Result<bool, RedisError> {
        self.release_grant(resource, token, None).await
    }

    /// Releases the grant of `token` with `fence` (when known): a retried or late RELEASE can then
    /// never free a later grant of the same token.
    pub(crate) async fn release_grant(
        &self,
        resource: &str,
        token: &str,
        fence: Option<u64>,
    ) -> Result<bool, RedisError> {
        let mut cmd = redis::cmd("DLOCK.RELEASE");
        cmd.arg(resource).arg(token);
        if let Some(fence) = fence {
            cmd.arg("FENCE").arg(fence);
        }
        let released: i64 = self.send(&cmd, Duration::ZERO).await?;
        Ok(released == 1)
    }
}
