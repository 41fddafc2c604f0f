//! The quick start of `client/README.md` (which prints this file from its first `use`): one
//! lease around one piece of work.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p dlock-client --example quickstart
//! ```

use std::time::Duration;

use dlock_client::{CancellationToken, Client, RunError};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    println!("{}", pay_invoice(&url).await?);
    Ok(())
}

/// One lease around one piece of work; answers what the work returned.
pub async fn pay_invoice(url: &str) -> Result<String, Box<dyn std::error::Error>> {
    let client = Client::connect(url).await?;
    // Wait up to 5 s in the server's queue for a 30 s lease.
    let lease = client
        .acquire_waiting("invoice:123", Duration::from_secs(30), Some(Duration::from_secs(5)))
        .await?;
    let fence = lease.fence(); // send it with every write
    // Renewals run while the work runs; `cancelled` (a CancellationToken) fires if the lease is
    // lost, and the lease is released when the work returns.
    let written = match lease.run(|cancelled| process_invoice(fence, cancelled)).await {
        Ok(done) => done?,
        Err(RunError::LockLost(reason)) => return Err(format!("lease lost: {reason}").into()),
        Err(RunError::NotReleased { output, reason }) => {
            eprintln!("not released ({reason}): it expires by itself");
            output?
        }
    };
    Ok(written)
}

/// The work the lease protects: here it only reports the fence it would send with its writes.
async fn process_invoice(fence: u64, cancelled: CancellationToken) -> Result<String, String> {
    tokio::select! {
        () = cancelled.cancelled() => Err("the lease was lost: stop writing".to_owned()),
        () = tokio::time::sleep(Duration::from_millis(50)) => Ok(format!("invoice 123 written under fence {fence}")),
    }
}
