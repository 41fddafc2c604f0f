//! The client against the test kit's Redis Cluster (three primaries, a replica each): every call
//! goes straight to the primary of its resource's slot (no `MOVED` in steady state), ticket
//! waiters and observers subscribe on the shard of their resource, one connection per shard,
//! and a failover moves the calls to the new primary.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_client::{
    AcquireError, AcquireOptions, Client, ClientOptions, FencedError, Replicas, WaitStrategy,
    channel_of,
};
use dlock_testkit::*;

/// Room for a slow test machine.
const SLACK: Duration = Duration::from_secs(10);

/// Waits until `replica` holds `fence` on `resource`. (A WAIT on a connection of the test's own
/// would not say so: that connection wrote nothing, so WAIT counts every replica at once.)
fn replica_holds(cluster: &Cluster, replica: u16, resource: &str, fence: u64) {
    let mut on_replica = cluster.node(replica).client();
    let _: () = redis::cmd("READONLY").query(&mut on_replica).expect("READONLY");
    assert!(
        eventually(SLACK, || info_field(&mut on_replica, resource, "fence")
            == Some(fence.to_string())),
        "the replica never held fence {fence} of {resource}"
    );
}

async fn cluster_client(cluster: &Cluster, options: ClientOptions) -> Client {
    let seed = cluster.nodes[0].url();
    Client::connect_cluster_with(&[&seed], options).await.expect("connect to the cluster")
}

/// The primaries' ports.
fn primaries(cluster: &Cluster) -> Vec<u16> {
    let mut ports: Vec<u16> = cluster
        .nodes
        .iter()
        .map(|node| node.port)
        .filter(|&port| {
            info_line(&mut cluster.node(port).client(), "replication", "role").as_deref()
                == Some("master")
        })
        .collect();
    ports.sort();
    ports
}

/// `MOVED` replies all nodes sent so far (`INFO errorstats`).
fn moved_replies(cluster: &Cluster) -> u64 {
    cluster
        .nodes
        .iter()
        .map(|node| {
            let text: String = redis::cmd("INFO")
                .arg("errorstats")
                .query(&mut node.client())
                .expect("INFO errorstats");
            info_value(&text, "errorstat_MOVED")
                .and_then(|value| value.strip_prefix("count="))
                .map_or(0, |count| count.parse().expect("count"))
        })
        .sum()
}

/// The clients connected to the node on `port`.
fn connections(cluster: &Cluster, port: u16) -> usize {
    let list: String =
        redis::cmd("CLIENT").arg("LIST").query(&mut cluster.node(port).client()).expect("LIST");
    // Less the connection that asks.
    list.lines().count() - 1
}

/// Resources named `prefix{i}`, one on each primary.
fn one_per_shard(cluster: &Cluster, prefix: &str) -> Vec<(String, u16)> {
    let mut found: Vec<(String, u16)> = Vec::new();
    for i in 0.. {
        let resource = format!("{prefix}{i}");
        let owner = cluster.owner(&resource);
        if found.iter().all(|(_, port)| *port != owner) {
            found.push((resource, owner));
        }
        if found.len() == 3 {
            return found;
        }
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_all_three_shards_go_straight_to_their_primaries_without_a_redirect() {
    let cluster = Cluster::start();
    let client = cluster_client(&cluster, ClientOptions::default()).await;
    assert!(client.is_cluster());

    // The count can fail: a command sent to the wrong primary is counted.
    let before = moved_replies(&cluster);
    let owner = cluster.owner("probe");
    let other = *primaries(&cluster).iter().find(|&&p| p != owner).expect("another primary");
    let moved =
        error_text(redis::cmd("DLOCK.INFO").arg("probe").query(&mut cluster.node(other).client()));
    assert!(moved.starts_with("MOVED"), "{moved}");
    assert_eq!(moved_replies(&cluster), before + 1, "INFO errorstats counts MOVED");
    let before = moved_replies(&cluster);

    // Mutexes on resources spread over the three shards, each held on its own primary.
    let mut shards = BTreeSet::new();
    for i in 0..12 {
        let resource = format!("{{job:{i}}}");
        let owner = cluster.owner(&resource);
        shards.insert(owner);
        let mut lease = client.acquire(&resource, Duration::from_secs(30)).await.expect("granted");
        let mut on_owner = cluster.node(owner).client();
        assert_eq!(info_field(&mut on_owner, &resource, "owner").as_deref(), Some(lease.token()));
        assert!(lease.renew().await.expect("renewed"), "renewed on its shard");
        assert!(client.fence_is_live(&resource, lease.fence()).await.expect("FENCECHECK"));
        // A fenced write with the resource's hash tag lands on the same primary.
        let data = format!("{resource}:data");
        let mut write = redis::cmd("HSET");
        write.arg(&data).arg("fence").arg(lease.fence());
        let _: i64 = lease.fenced(&write).await.expect("fenced write in the slot");
        let stored: Option<u64> =
            redis::cmd("HGET").arg(&data).arg("fence").query(&mut on_owner).expect("HGET");
        assert_eq!(stored, Some(lease.fence()));
        // Another slot's key is refused as such, and nothing is written: the server answers
        // CROSSSLOT itself, as for a native multi-key command (FENCED declares the inner keys).
        let mut elsewhere = redis::cmd("SET");
        elsewhere.arg(format!("elsewhere:{i}")).arg("x");
        let refused = lease.fenced::<()>(&elsewhere).await;
        assert!(matches!(&refused, Err(FencedError::CrossSlot(_))), "{refused:?}");
        assert!(lease.release().await.expect("released"));
        assert_eq!(info_field(&mut on_owner, &resource, "owner"), None, "released on its shard");
    }
    assert_eq!(shards.len(), 3, "the resources are spread over the three shards");

    // A blocking wait (a connection of its own) on each shard, handed over by a release.
    for (resource, owner) in one_per_shard(&cluster, "wait:") {
        let holder = client.acquire(&resource, Duration::from_secs(30)).await.expect("granted");
        let waiting = {
            let (client, resource) = (client.clone(), resource.clone());
            tokio::spawn(async move {
                client.acquire_waiting(&resource, Duration::from_secs(30), Some(SLACK)).await
            })
        };
        let mut on_owner = cluster.node(owner).client();
        assert!(
            eventually(SLACK, || info_field(&mut on_owner, &resource, "waiters").as_deref()
                == Some("1")),
            "the waiter queues on {owner}"
        );
        let fence = holder.fence();
        assert!(holder.release().await.expect("released"));
        let next = waiting.await.expect("task").expect("handed over");
        assert!(next.fence() > fence);
        assert!(next.release().await.expect("released"));
    }

    // Replicated grants: ACQUIRE and WAIT together on the resource's primary.
    let replicated = ClientOptions {
        replicas: Some(Replicas { count: 1, timeout: Duration::from_secs(5) }),
        ..ClientOptions::default()
    };
    let durable = cluster_client(&cluster, replicated).await;
    for (resource, _) in one_per_shard(&cluster, "durable:") {
        let mut lease = durable.acquire(&resource, Duration::from_secs(30)).await.expect("acked");
        assert!(lease.renew().await.expect("renewal acknowledged"));
        assert!(lease.release().await.expect("released"));
    }

    // A read-write lock and a semaphore.
    let rw = "{rw}:lock";
    let ttl = Duration::from_secs(30);
    let reader_a = client.read(rw, ttl, None).await.expect("reader");
    let reader_b = client.read(rw, ttl, None).await.expect("second reader");
    assert!(matches!(client.write(rw, ttl, None).await, Err(AcquireError::Held)));
    let writer = {
        let client = client.clone();
        tokio::spawn(async move { client.write(rw, ttl, Some(SLACK)).await })
    };
    let mut on_owner = cluster.node(cluster.owner(rw)).client();
    assert!(eventually(SLACK, || info_field(&mut on_owner, rw, "waiters").as_deref() == Some("1")));
    assert!(reader_a.release().await.expect("released"));
    assert!(reader_b.release().await.expect("released"));
    let writer = writer.await.expect("task").expect("the writer after the readers");
    assert!(writer.release().await.expect("released"));
    let permits: Vec<_> = {
        let mut permits = Vec::new();
        for _ in 0..2 {
            permits.push(client.semaphore("pool", 2, ttl, None).await.expect("a permit"));
        }
        permits
    };
    assert!(matches!(client.semaphore("pool", 2, ttl, None).await, Err(AcquireError::Held)));
    for permit in permits {
        assert!(permit.release().await.expect("released"));
    }

    // Sets, their members on one shard by a hash tag: each set's commands (numkeys first) go to
    // its members' primary, where they are granted, renewed and released.
    for (tag, owner) in one_per_shard(&cluster, "order:") {
        let members = [format!("{{{tag}}}:items"), format!("{{{tag}}}:payment")];
        let mut set = client.acquire_all(&members, ttl, Some(SLACK)).await.expect("granted");
        let mut on_owner = cluster.node(owner).client();
        for (member, fence) in members.iter().zip(set.fences()) {
            assert_eq!(info_field(&mut on_owner, member, "fence"), Some(fence.to_string()));
        }
        assert!(set.renew().await.expect("renewed"));
        assert!(set.release().await.expect("released"));
        assert_eq!(info_field(&mut on_owner, &members[0], "owner"), None, "released");
    }

    assert_eq!(client.redirects() + durable.redirects(), 0, "no redirect followed");
    assert_eq!(moved_replies(&cluster), before, "no node answered MOVED to the client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticket_waiters_and_observers_subscribe_once_per_shard_and_are_all_served() {
    const WAITERS: usize = 12;
    let cluster = Cluster::start();
    let options = ClientOptions {
        wait_strategy: WaitStrategy::Tickets { ticket: Duration::from_secs(3) },
        ..ClientOptions::default()
    };
    let client = cluster_client(&cluster, options).await;
    let holder = cluster_client(&cluster, ClientOptions::default()).await;
    let before = moved_replies(&cluster);
    let baseline: Vec<(u16, usize)> =
        primaries(&cluster).into_iter().map(|p| (p, connections(&cluster, p))).collect();

    // On two shards, a held resource with a line of ticket waiters.
    let resources: Vec<(String, u16)> =
        one_per_shard(&cluster, "line:").into_iter().take(2).collect();
    let ttl = Duration::from_secs(30);
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut holders = Vec::new();
    for (resource, owner) in &resources {
        let resource = resource.as_str();
        holders.push(holder.acquire(resource, ttl).await.expect("held"));
        let mut on_owner = cluster.node(*owner).client();
        for i in 0..WAITERS {
            let (client, mine, served) = (client.clone(), resource.to_owned(), served.clone());
            tasks.push(tokio::spawn(async move {
                let options = AcquireOptions { wait: Some(4 * SLACK), ..AcquireOptions::default() };
                let lease = client.acquire_with(&mine, ttl, &options).await.expect("served");
                served.lock().expect("lock").push((mine, i));
                tokio::time::sleep(Duration::from_millis(5)).await;
                assert!(lease.release().await.expect("released"));
            }));
            // One at a time into the line, so that the line's order is known.
            let tickets = (i + 1).to_string();
            assert!(
                eventually(SLACK, || info_field(&mut on_owner, resource, "tickets")
                    .is_some_and(|t| t == tickets)),
                "ticket {i} on {owner}"
            );
        }
        // The shard's subscribers listen on shard channels, on the resource's own primary: the
        // holder's client on the resource's (for a revocation), the waiters' on each ticket's
        // own (where its turn is told), all on the one subscriber connection of the client.
        let channel = channel_of(resource);
        assert!(
            eventually(SLACK, || shard_subscribers(&cluster, *owner, &channel) == 1),
            "the holder's client on {owner}"
        );
        let own = format!("{channel}:*");
        assert!(
            eventually(SLACK, || shard_channels(&cluster, *owner, &own) == WAITERS),
            "a shard channel per ticket on {owner}"
        );
    }
    // A handful of connections: per primary at most the shared ones and the shard subscribers
    // of the two clients, however many wait.
    for (port, before) in &baseline {
        let now = connections(&cluster, *port);
        assert!(now <= before + 4, "{now} connections on {port} (before: {before})");
    }

    // An observer of an election on the third shard, while the lines drain.
    let (election, _) = one_per_shard(&cluster, "leader:").remove(2);
    let mut changes = client.observe(&election);
    assert_eq!(changes.changed().await, None, "nobody leads yet");
    let leadership =
        holder.campaign(&election, "10.0.0.1:80", Duration::from_secs(30)).await.expect("leads");
    let leader = changes.changed().await.expect("a leader");
    assert_eq!(
        (leader.fence, leader.address.as_deref()),
        (leadership.fence(), Some("10.0.0.1:80"))
    );

    for lease in holders {
        assert!(lease.release().await.expect("released"));
    }
    for task in tasks {
        tokio::time::timeout(4 * SLACK, task).await.expect("in time").expect("served");
    }
    let served = served.lock().expect("lock").clone();
    for (resource, _) in &resources {
        let order: Vec<usize> =
            served.iter().filter(|(r, _)| r == resource).map(|(_, i)| *i).collect();
        assert_eq!(order, (0..WAITERS).collect::<Vec<_>>(), "{resource}: served in line order");
    }

    assert!(leadership.resign().await.expect("resigned"));
    assert_eq!(changes.changed().await, None, "the leader resigned");
    assert_eq!(client.redirects() + holder.redirects(), 0, "no redirect followed");
    assert_eq!(moved_replies(&cluster), before, "no node answered MOVED to the client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_leases_renew_waiters_are_served_and_calls_go_to_the_new_primary() {
    let cluster = Cluster::start();
    let options = ClientOptions {
        wait_strategy: WaitStrategy::Tickets { ticket: Duration::from_secs(3) },
        ..ClientOptions::default()
    };
    let client = cluster_client(&cluster, options).await;
    let resource = "{failover}:lock";
    let old = cluster.owner(resource);
    let replica = cluster.replica_of(old);

    // A lease in `run`, a ticket waiter and an observer, all on the shard that fails over.
    let ttl = Duration::from_secs(6);
    let lease = client.acquire(resource, ttl).await.expect("granted");
    let fence = lease.fence();
    let (failed_over_tx, failed_over) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        lease
            .run(|_cancelled| async move {
                let _ = failed_over.await;
                // Two renewals after the failover, on the new primary.
                tokio::time::sleep(ttl).await;
            })
            .await
    });
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            let options = AcquireOptions { wait: Some(4 * SLACK), ..AcquireOptions::default() };
            client.acquire_with(resource, ttl, &options).await
        })
    };
    let mut on_old = cluster.node(old).client();
    assert!(
        eventually(SLACK, || info_field(&mut on_old, resource, "tickets").as_deref() == Some("1"))
    );
    let election = "{failover}:leader";
    let mut changes = client.observe(election);
    assert_eq!(changes.changed().await, None);
    replica_holds(&cluster, replica, resource, fence);

    // The replica takes over (TAKEOVER: no election, which a loaded test machine can make time
    // out). The lease reached it (above); a renewal the old primary took after that only
    // extended a deadline the replica has earlier.
    let _: () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("TAKEOVER")
        .query(&mut cluster.node(replica).client())
        .expect("CLUSTER FAILOVER TAKEOVER");
    assert!(
        eventually(3 * SLACK, || cluster.owner(resource) == replica
            && info_line(&mut cluster.node(old).client(), "replication", "role").as_deref()
                == Some("slave")),
        "the replica took over"
    );
    let started = Instant::now();
    let _ = failed_over_tx.send(());

    // The running lease renews on the new primary and is released there at the end.
    let output = tokio::time::timeout(ttl + SLACK, running).await.expect("in time").expect("task");
    assert!(output.is_ok(), "the lease lived through the failover: {:?}", output.err());
    assert!(started.elapsed() >= ttl);
    // The waiter's ticket moved with its refreshes (tickets are not replicated): served.
    let next = tokio::time::timeout(4 * SLACK, waiter)
        .await
        .expect("in time")
        .expect("task")
        .expect("the waiter is served after the failover");
    assert!(next.fence() > fence, "a larger fence on the new primary");
    let mut on_new = cluster.node(replica).client();
    assert_eq!(info_field(&mut on_new, resource, "owner").as_deref(), Some(next.token()));
    assert!(next.release().await.expect("released"));

    // The observer follows the election on the new primary.
    let other = cluster_client(&cluster, ClientOptions::default()).await;
    let leadership = other.campaign(election, "b", ttl).await.expect("leads");
    let leader = tokio::time::timeout(SLACK, changes.changed()).await.expect("in time");
    assert_eq!(leader.map(|l| l.fence), Some(leadership.fence()));
    assert!(leadership.resign().await.expect("resigned"));

    // From now on, calls go straight to the new primary.
    let redirects = client.redirects();
    assert!(redirects > 0, "the client followed the failover's MOVED");
    let before = moved_replies(&cluster);
    for _ in 0..5 {
        let lease = client.acquire(resource, ttl).await.expect("granted");
        assert_eq!(info_field(&mut on_new, resource, "owner").as_deref(), Some(lease.token()));
        assert!(lease.release().await.expect("released"));
    }
    assert_eq!(client.redirects(), redirects, "no more redirects");
    assert_eq!(moved_replies(&cluster), before, "no node answered MOVED");
}

/// `CLUSTER SETSLOT slot <how> <node-id>` on the node at `port`.
fn setslot(cluster: &Cluster, port: u16, slot: i64, how: &str, id: &str) {
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(how)
        .arg(id)
        .query(&mut cluster.node(port).client())
        .expect("SETSLOT");
}

/// Subscribers of the shard channel `channel` on the node at `port`.
fn shard_subscribers(cluster: &Cluster, port: u16, channel: &str) -> i64 {
    let numsub: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query(&mut cluster.node(port).client())
        .expect("SHARDNUMSUB");
    match numsub.get(1) {
        Some(redis::Value::Int(n)) => *n,
        other => panic!("unexpected {other:?}"),
    }
}

/// How many shard channels matching `pattern` have subscribers on the node at `port`.
fn shard_channels(cluster: &Cluster, port: u16, pattern: &str) -> usize {
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("SHARDCHANNELS")
        .arg(pattern)
        .query(&mut cluster.node(port).client())
        .expect("SHARDCHANNELS");
    channels.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_to_another_shard_is_followed_by_ask_then_moved_and_subscriptions_move() {
    let cluster = Cluster::start();
    let options = ClientOptions {
        wait_strategy: WaitStrategy::Tickets { ticket: Duration::from_secs(3) },
        ..ClientOptions::default()
    };
    let client = cluster_client(&cluster, options).await;
    let resource = "{moving}:lock";
    let channel = channel_of(resource);
    let from = cluster.owner(resource);
    let to = *primaries(&cluster).iter().find(|&&p| p != from).expect("another primary");
    let ttl = Duration::from_secs(30);

    // A holder, a ticket waiter and an observer, all on the slot's first shard.
    let holder = client.acquire(resource, ttl).await.expect("granted");
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            let options = AcquireOptions { wait: Some(4 * SLACK), ..AcquireOptions::default() };
            client.acquire_with(resource, ttl, &options).await
        })
    };
    let mut on_from = cluster.node(from).client();
    assert!(
        eventually(SLACK, || info_field(&mut on_from, resource, "tickets").as_deref() == Some("1"))
    );
    let mut changes = client.observe(resource);
    let first = changes.changed().await.expect("the holder leads");
    assert_eq!(first.token, holder.token());
    assert!(
        eventually(SLACK, || shard_subscribers(&cluster, from, &channel) == 2),
        "hub, observer"
    );

    // The key migrates: the old shard answers ASK for it, which the client follows.
    let slot: i64 =
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(resource).query(&mut on_from).expect("KEYSLOT");
    let (from_id, to_id) = (cluster.node_id(from), cluster.node_id(to));
    setslot(&cluster, to, slot, "IMPORTING", &from_id);
    setslot(&cluster, from, slot, "MIGRATING", &to_id);
    migrate(&mut on_from, to, &[resource]);
    let redirects = client.redirects();
    assert!(client.fence_is_live(resource, holder.fence()).await.expect("asked the new shard"));
    assert!(client.redirects() > redirects, "the client followed the ASK");

    // The slot is the new shard's: MOVED, then straight there.
    setslot(&cluster, to, slot, "NODE", &to_id);
    setslot(&cluster, from, slot, "NODE", &to_id);
    assert!(eventually(SLACK, || cluster.owner(resource) == to), "slot moved");
    let fence = holder.fence();
    assert!(holder.release().await.expect("released on the new shard"));
    let next = tokio::time::timeout(4 * SLACK, waiter)
        .await
        .expect("in time")
        .expect("task")
        .expect("the waiter is served on the new shard");
    assert!(next.fence() > fence);
    let mut on_to = cluster.node(to).client();
    assert_eq!(info_field(&mut on_to, resource, "owner").as_deref(), Some(next.token()));
    // The observer follows, subscribed on the new shard now.
    let leader = loop {
        let change = tokio::time::timeout(SLACK, changes.changed()).await.expect("in time");
        if let Some(leader) = change.filter(|leader| leader.token == next.token()) {
            break leader;
        }
    };
    assert_eq!(leader.fence, next.fence());
    assert!(
        eventually(SLACK, || shard_subscribers(&cluster, to, &channel) >= 1),
        "the observer subscribed on the new shard"
    );
    assert!(next.release().await.expect("released"));
    let redirects = client.redirects();
    for _ in 0..3 {
        let lease = client.acquire(resource, ttl).await.expect("granted");
        assert!(lease.release().await.expect("released"));
    }
    assert_eq!(client.redirects(), redirects, "straight to the new shard");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watched_events_come_from_the_resources_own_primary() {
    let cluster = Cluster::start();
    for node in &cluster.nodes {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg("Kgd")
            .query(&mut node.client())
            .expect("CONFIG SET");
    }
    let options = ClientOptions { watch_events: true, ..ClientOptions::default() };
    let client = cluster_client(&cluster, options).await;
    for (resource, owner) in one_per_shard(&cluster, "watched:") {
        // A ttl renewals alone would take 10 s to find lost.
        let lease = client.acquire(&resource, Duration::from_secs(30)).await.expect("granted");
        let started = Instant::now();
        let work = tokio::spawn(lease.run(|cancelled| async move { cancelled.cancelled().await }));
        // The subscription is made before the work starts; the key goes on its own primary.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let deleted: i64 =
            redis::cmd("DEL").arg(&resource).query(&mut cluster.node(owner).client()).expect("DEL");
        assert_eq!(deleted, 1);
        let outcome = tokio::time::timeout(SLACK, work).await.expect("in time").expect("task");
        assert!(
            matches!(
                outcome,
                Err(dlock_client::RunError::LockLost(dlock_client::LossReason::Ended(_)))
            ),
            "{outcome:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "the event ended it, not a renewal");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_hears_its_revocation_on_the_shard_channel_of_its_resources_primary() {
    let cluster = Cluster::start();
    let client = cluster_client(&cluster, ClientOptions::default()).await;
    for (resource, owner) in one_per_shard(&cluster, "revoked:") {
        // A ttl renewals alone would take 20 s to find lost.
        let lease = client.acquire(&resource, Duration::from_secs(60)).await.expect("granted");
        let work = tokio::spawn(lease.run(|cancelled| async move { cancelled.cancelled().await }));
        // The holder listens on the shard channel, on the resource's own primary.
        let channel = channel_of(&resource);
        assert!(
            eventually(SLACK, || shard_subscribers(&cluster, owner, &channel) == 1),
            "no shard subscriber of {channel} on {owner}"
        );
        let revoked: i64 = redis::cmd("DLOCK.REVOKE")
            .arg(&resource)
            .arg("REASON")
            .arg("shard drill")
            .query(&mut cluster.node(owner).client())
            .expect("REVOKE");
        assert_eq!(revoked, 1);
        match work.await.expect("task") {
            Err(dlock_client::RunError::LockLost(dlock_client::LossReason::Revoked(reason))) => {
                assert_eq!(reason, "shard drill");
            }
            other => panic!("expected a revocation, got {other:?}"),
        }
        assert!(
            eventually(SLACK, || shard_subscribers(&cluster, owner, &channel) == 0),
            "left {channel} with the lease"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_taken_over_by_its_replica_is_left_for_the_new_one() {
    let mut cluster = Cluster::start();
    let options = ClientOptions {
        wait_strategy: WaitStrategy::Tickets { ticket: Duration::from_secs(3) },
        ..ClientOptions::default()
    };
    let client = cluster_client(&cluster, options).await;
    // A resource whose primary is not the node the cluster's helpers ask.
    let seed = cluster.nodes[0].port;
    let (resource, old) = (0..)
        .map(|i| format!("{{dead}}:{i}"))
        .map(|resource| {
            let owner = cluster.owner(&resource);
            (resource, owner)
        })
        .find(|(_, owner)| *owner != seed)
        .expect("a resource on another primary");
    let elsewhere = one_per_shard(&cluster, "alive:")
        .into_iter()
        .find(|(_, owner)| *owner != old)
        .expect("a resource on another shard")
        .0;
    let replica = cluster.replica_of(old);

    // A lease in `run` and a ticket waiter on the shard whose primary dies.
    let ttl = Duration::from_secs(6);
    let lease = client.acquire(&resource, ttl).await.expect("granted");
    let fence = lease.fence();
    replica_holds(&cluster, replica, &resource, fence);
    let (taken_over_tx, taken_over) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(lease.run(move |_cancelled| async move {
        let _ = taken_over.await;
        tokio::time::sleep(ttl).await; // renewals on the new primary
    }));
    let waiter = {
        let (client, resource) = (client.clone(), resource.clone());
        tokio::spawn(async move {
            let options = AcquireOptions { wait: Some(4 * SLACK), ..AcquireOptions::default() };
            client.acquire_with(&resource, ttl, &options).await
        })
    };
    let mut on_old = cluster.node(old).client();
    assert!(
        eventually(SLACK, || info_field(&mut on_old, &resource, "tickets").as_deref() == Some("1"))
    );

    // The primary dies; the other shards serve on.
    cluster.nodes.iter_mut().find(|node| node.port == old).expect("node").kill();
    let other = client.acquire(&elsewhere, ttl).await.expect("another shard serves on");
    assert!(other.release().await.expect("released"));

    // Its replica takes over (TAKEOVER: without waiting for the cluster to notice the death).
    let _: () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("TAKEOVER")
        .query(&mut cluster.node(replica).client())
        .expect("CLUSTER FAILOVER TAKEOVER");
    assert!(eventually(3 * SLACK, || cluster.owner(&resource) == replica), "took over");
    let started = Instant::now();
    let _ = taken_over_tx.send(());

    // The lease found the new primary before its local expiry, renewed and was released there.
    let output = tokio::time::timeout(ttl + SLACK, running).await.expect("in time").expect("task");
    assert!(output.is_ok(), "the lease lived through the takeover: {:?}", output.err());
    assert!(started.elapsed() >= ttl);
    let next = tokio::time::timeout(4 * SLACK, waiter)
        .await
        .expect("in time")
        .expect("task")
        .expect("the waiter is served by the new primary");
    assert!(next.fence() > fence);
    let mut on_new = cluster.node(replica).client();
    assert_eq!(info_field(&mut on_new, &resource, "owner").as_deref(), Some(next.token()));
    assert!(next.release().await.expect("released"));
}

/// A blocking waiter (`WAIT`, the default strategy) for `resource`, held on the raw connection
/// `holder` for `held_ms`: the spawned wait, and the holder's fence.
async fn blocked_waiter(
    client: &Client,
    cluster: &Cluster,
    resource: &'static str,
    held_ms: u64,
) -> (tokio::task::JoinHandle<Result<dlock_client::Lease, AcquireError>>, i64) {
    let owner = cluster.owner(resource);
    let mut on_owner = cluster.node(owner).client();
    let fence = acquire(&mut on_owner, resource, "holder", held_ms).expect("the holder");
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            let options = AcquireOptions { wait: Some(2 * SLACK), ..AcquireOptions::default() };
            client.acquire_with(resource, Duration::from_secs(10), &options).await
        })
    };
    assert!(
        eventually(SLACK, || info_field(&mut on_owner, resource, "waiters").as_deref()
            == Some("1")),
        "the waiter blocks on {owner}"
    );
    (waiter, fence)
}

/// The slot of a blocked waiter's resource moves to another shard (the key with it): the old
/// node ends the wait as the key leaves (nil, long before the wait's end), and the client waits
/// again on the new node, where the lease passes to it when the holder's runs out. It used to
/// report `Held` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_wait_survives_its_slot_moving_to_another_shard() {
    let cluster = Cluster::start();
    let client = cluster_client(&cluster, ClientOptions::default()).await;
    let resource = "{wait-moves}:lock";
    let from = cluster.owner(resource);
    let to = *primaries(&cluster).iter().find(|&&p| p != from).expect("another primary");
    let (waiter, held) = blocked_waiter(&client, &cluster, resource, 3_000).await;
    let started = Instant::now();

    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(resource)
        .query(&mut cluster.node(from).client())
        .expect("KEYSLOT");
    let (from_id, to_id) = (cluster.node_id(from), cluster.node_id(to));
    setslot(&cluster, to, slot, "IMPORTING", &from_id);
    setslot(&cluster, from, slot, "MIGRATING", &to_id);
    migrate(&mut cluster.node(from).client(), to, &[resource]);
    setslot(&cluster, to, slot, "NODE", &to_id);
    setslot(&cluster, from, slot, "NODE", &to_id);

    let lease = tokio::time::timeout(3 * SLACK, waiter)
        .await
        .expect("in time")
        .expect("task")
        .expect("the wait goes on on the new shard and is served there");
    assert!(lease.fence() > held as u64, "a larger fence than the holder's");
    assert!(started.elapsed() < 2 * SLACK, "served when the holder's lease ran out");
    let mut on_to = cluster.node(to).client();
    assert_eq!(info_field(&mut on_to, resource, "owner").as_deref(), Some(lease.token()));
    assert!(lease.release().await.expect("released"));
}

/// The primary of a blocked waiter fails over: the server answers the wait `UNBLOCKED` as it
/// turns into a replica (Redis 7.0) or redirects it, and the client waits again on the new
/// primary, where the replicated lease runs out and passes to it. It used to surface the
/// `UNBLOCKED` error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_wait_survives_a_failover_of_its_primary() {
    wait_across_a_failover(ClientOptions::default(), "{wait-fails-over}:lock").await;
}

/// The same with grants acknowledged by a replica: the wait and its `WAIT 1` go as one pipeline,
/// and on Valkey 9 the pipeline's `WAIT` reaches the old primary once it is a replica ("WAIT
/// cannot be used with replica instances"), which the client now takes for the failover it is.
/// It used to surface that error (the cluster chaos profile, seed 21 on Valkey 9, during a
/// `failover`: `client-errors`, "Acquire … returned server: … WAIT cannot be used with replica
/// instances").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_wait_acknowledged_by_a_replica_survives_a_failover_of_its_primary() {
    let replicas = Some(Replicas { count: 1, timeout: Duration::from_millis(500) });
    let options = ClientOptions { replicas, ..ClientOptions::default() };
    wait_across_a_failover(options, "{wait-acked-fails-over}:lock").await;
}

async fn wait_across_a_failover(options: ClientOptions, resource: &'static str) {
    let cluster = Cluster::start();
    let client = cluster_client(&cluster, options).await;
    let old = cluster.owner(resource);
    let replica = cluster.replica_of(old);
    let (waiter, held) = blocked_waiter(&client, &cluster, resource, 4_000).await;
    replica_holds(&cluster, replica, resource, held as u64);
    let _: () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("TAKEOVER")
        .query(&mut cluster.node(replica).client())
        .expect("CLUSTER FAILOVER TAKEOVER");
    let lease = tokio::time::timeout(3 * SLACK, waiter)
        .await
        .expect("in time")
        .expect("task")
        .expect("the wait goes on on the new primary and is served there");
    assert_eq!(cluster.owner(resource), replica, "served by the new primary");
    assert!(lease.fence() > held as u64);
    let mut on_new = cluster.node(replica).client();
    assert_eq!(info_field(&mut on_new, resource, "owner").as_deref(), Some(lease.token()));
    assert!(lease.release().await.expect("released"));
}

/// The primary of a held lease is killed and its replica takes over: the holder's RELEASE, which
/// finds the old primary refusing connections, is sent again to the new one (it holds the lease:
/// the replica had received it) and releases it there. It used to return the refused connection
/// as an error, and the lease stayed until its ttl (the cluster chaos profile's first run, seed 1,
/// `client-errors`: "Release … returned Connection refused").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_its_primary_died_releases_the_lease_on_the_replica_that_took_over() {
    let mut cluster = Cluster::start();
    let client = cluster_client(&cluster, ClientOptions::default()).await;
    let seed = cluster.nodes[0].port;
    let (resource, old) = (0..)
        .map(|i| format!("{{released}}:{i}"))
        .map(|resource| {
            let owner = cluster.owner(&resource);
            (resource, owner)
        })
        .find(|(_, owner)| *owner != seed)
        .expect("a resource on another primary");
    let replica = cluster.replica_of(old);
    let lease = client.acquire(&resource, Duration::from_secs(20)).await.expect("granted");
    let fence = lease.fence();
    replica_holds(&cluster, replica, &resource, fence);

    cluster.nodes.iter_mut().find(|node| node.port == old).expect("node").kill();
    let _: () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("TAKEOVER")
        .query(&mut cluster.node(replica).client())
        .expect("CLUSTER FAILOVER TAKEOVER");
    assert!(eventually(3 * SLACK, || cluster.owner(&resource) == replica), "took over");

    let released = lease.release().await;
    assert!(matches!(released, Ok(true)), "released on the new primary: {released:?}");
    let mut on_new = cluster.node(replica).client();
    assert_eq!(info_field(&mut on_new, &resource, "owner"), None, "nobody holds it");
}

/// A fenced write while its slot migrates with the lock key already on the target and the data
/// key not yet: both nodes answer TRYAGAIN (the server knows every key of the write), and the
/// client sends it again until the keys are together, then it lands once, on the new owner. It
/// used to return the TRYAGAIN (the cluster chaos profile, seed 21 on Valkey 9: `client-errors`,
/// "RedisWrite … returned … TryAgain: Multiple keys request during rehashing of slot").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_during_a_slot_migration_is_sent_again_until_its_keys_are_together() {
    let cluster = Cluster::start();
    let client = cluster_client(&cluster, ClientOptions::default()).await;
    let (lock, data) = ("{split}lock", "{split}data");
    let from = cluster.owner(lock);
    let to = *primaries(&cluster).iter().find(|&&p| p != from).expect("another primary");
    let lease = client.acquire(lock, Duration::from_secs(20)).await.expect("granted");
    let first: i64 = lease.fenced(redis::cmd("RPUSH").arg(data).arg("before")).await.expect("1");
    assert_eq!(first, 1);

    let mut source = cluster.node(from).client();
    let mut target = cluster.node(to).client();
    let slot: i64 =
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(lock).query(&mut source).expect("slot");
    let (from_id, to_id) = (cluster.node_id(from), cluster.node_id(to));
    setslot(&cluster, to, slot, "IMPORTING", &from_id);
    setslot(&cluster, from, slot, "MIGRATING", &to_id);
    migrate(&mut source, to, &[lock]);

    let writing = tokio::spawn(async move {
        let pushed: Result<i64, _> =
            lease.fenced(redis::cmd("RPUSH").arg(data).arg("during")).await;
        (pushed, lease)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writing.is_finished(), "the write waits while the keys are apart");
    migrate(&mut source, to, &[data]);
    setslot(&cluster, to, slot, "NODE", &to_id);
    setslot(&cluster, from, slot, "NODE", &to_id);

    let (pushed, lease) =
        tokio::time::timeout(SLACK, writing).await.expect("in time").expect("task");
    assert_eq!(pushed.expect("the write landed once the keys were together"), 2);
    let list: Vec<String> =
        redis::cmd("LRANGE").arg(data).arg(0).arg(-1).query(&mut target).expect("LRANGE");
    assert_eq!(list, ["before", "during"], "one list, on the new owner, the write in it once");
    assert!(lease.release().await.expect("released"));
}
