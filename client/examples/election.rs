//! Leader election: three nodes campaign to run a scheduler; one leads at a time.
//!
//! Each node campaigns for `election:scheduler` with its address. The leader holds the election's
//! lease while it leads (renewed only while its work runs) and writes under its term's fence, so
//! an old leader's late write is refused once a new term began. node-1 leads first and dies
//! without resigning (its task is dropped): node-2, first in line, leads once node-1's lease runs
//! out. node-2 resigns, and node-3 leads at once. An observer prints every change of leader,
//! "no leader" included, from the election's channel and `DLOCK.INFO`.
//!
//! ```text
//! cargo run -p dlock-client --example election -- redis://127.0.0.1:6379/
//! ```

use std::time::Duration;

use dlock_client::{Client, Leadership};

const ELECTION: &str = "election:scheduler";
/// How long a dead leader may keep the election before the next candidate leads.
const TTL: Duration = Duration::from_millis(1_000);
/// How long each leader's term lasts in this demo.
const TERM: Duration = Duration::from_millis(500);

/// One node: campaigns, then leads for `term` (`None`: until it dies), writing under its fence.
async fn node(dlock: Client, address: &'static str, term: Option<Duration>) -> Result<(), String> {
    let leadership = dlock.campaign(ELECTION, address, TTL).await.map_err(|e| e.to_string())?;
    lead(leadership, term).await
}

async fn lead(leadership: Leadership, term: Option<Duration>) -> Result<(), String> {
    let (fence, address) = (leadership.fence(), leadership.address().to_owned());
    println!("{address}: leading, epoch {fence}");
    // The leader's writes carry its epoch: once another term began, this write would be refused.
    let mut record = redis::cmd("SET");
    record.arg("scheduler:last-leader").arg(&address);
    let _: () = leadership.lease().fenced(&record).await.map_err(|e| e.to_string())?;
    leadership
        .lead(|_cancelled| async move {
            match term {
                Some(term) => tokio::time::sleep(term).await,
                None => std::future::pending().await,
            }
        })
        .await
        .map_err(|e| format!("{address}: {e}"))?;
    println!("{address}: resigned");
    Ok(())
}

/// Runs the observer and the three nodes against the server at `url`; returns what the
/// observer saw: each leader's (address, fence), `None` for no leader.
pub async fn run_demo(url: &str) -> Result<Vec<Option<(String, u64)>>, String> {
    let dlock = Client::connect(url).await.map_err(|e| e.to_string())?;
    let mut changes = dlock.observe(ELECTION);
    let mut seen = vec![observed(changes.changed().await)];
    // node-1 leads first, until it dies.
    let node_1 = tokio::spawn(node(dlock.clone(), "node-1:7000", None));
    seen.push(observed(changes.changed().await));
    // The others line up behind it, node-2 first.
    let node_2 = tokio::spawn(node(dlock.clone(), "node-2:7000", Some(TERM)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let node_3 = tokio::spawn(node(dlock.clone(), "node-3:7000", Some(TERM)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    node_1.abort();
    println!("node-1:7000: died without resigning");
    // node-2 once node-1's lease ran out, node-3 once node-2 resigned, then nobody.
    while seen.len() < 5 {
        seen.push(observed(changes.changed().await));
    }
    for node in [node_2, node_3] {
        node.await.map_err(|e| e.to_string())??;
    }
    Ok(seen)
}

fn observed(leader: Option<dlock_client::Leader>) -> Option<(String, u64)> {
    match &leader {
        Some(leader) => {
            println!("observer: the leader is {:?}, epoch {}", leader.address, leader.fence)
        }
        None => println!("observer: no leader"),
    }
    leader.map(|leader| (leader.address.unwrap_or_default(), leader.fence))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let url = std::env::args().nth(1).unwrap_or_else(|| "redis://127.0.0.1:6379/".to_owned());
    run_demo(&url).await.map(|_| ())
}
