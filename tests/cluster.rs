//! Redis Cluster: three shards with a replica each, the module on every node.

use std::time::{Duration, Instant};

use dlock_testkit::*;

#[test]
fn locks_spread_over_shards_route_by_key_fence_with_hash_tags_and_survive_slot_moves() {
    let cluster = Cluster::start();

    // Many resources land on all three shards; each is locked on the node that owns it.
    let mut owners = std::collections::BTreeSet::new();
    for i in 0..30 {
        let resource = format!("invoice:{i}");
        let owner = cluster.owner(&resource);
        owners.insert(owner);
        let mut con = cluster.node(owner).client();
        let fence = acquire(&mut con, &resource, "w", 60_000).expect("granted on its shard");
        assert_eq!(fencecheck(&mut con, &resource, fence), 1);
    }
    assert_eq!(owners.len(), 3, "the locks are spread over the three shards");
    // Another primary redirects: the key spec routes the command by its resource.
    let owner = cluster.owner("invoice:0");
    let other = *owners.iter().find(|p| **p != owner).expect("another primary");
    let moved = error_text(
        redis::cmd("DLOCK.INFO")
            .arg("invoice:0")
            .query::<redis::Value>(&mut cluster.node(other).client()),
    );
    assert!(moved.starts_with("MOVED"), "{moved}");

    // DLOCK.FENCED with hash-tagged data; a key of another slot is CROSSSLOT.
    let owner = cluster.owner("{order:7}");
    let mut con = cluster.node(owner).client();
    let fence = acquire(&mut con, "{order:7}", "w", 60_000).expect("granted");
    let added: i64 = redis::cmd("DLOCK.FENCED")
        .arg("{order:7}")
        .arg(fence)
        .arg("HSET")
        .arg("{order:7}:data")
        .arg("status")
        .arg("paid")
        .query(&mut con)
        .expect("fenced write in the same slot");
    assert_eq!(added, 1);
    let crossslot = error_text(
        redis::cmd("DLOCK.FENCED")
            .arg("{order:7}")
            .arg(fence)
            .arg("SET")
            .arg("elsewhere:1")
            .arg("x")
            .query::<redis::Value>(&mut con),
    );
    assert!(crossslot.starts_with("CROSSSLOT"), "{crossslot}");
    // A set of resources shares one slot (a hash tag), or the server refuses it.
    let fences: Vec<i64> = redis::cmd("DLOCK.ACQUIREALL")
        .arg(2)
        .arg("{order:7}:a")
        .arg("{order:7}:b")
        .arg("w")
        .arg(60_000)
        .query(&mut con)
        .expect("a set in one slot");
    assert_eq!(fences.len(), 2);
    let crossslot = error_text(
        redis::cmd("DLOCK.ACQUIREALL")
            .arg(2)
            .arg("{order:7}:c")
            .arg("elsewhere:1")
            .arg("w")
            .arg(60_000)
            .query::<redis::Value>(&mut con),
    );
    assert!(crossslot.starts_with("CROSSSLOT"), "{crossslot}");
    assert!(!exists(&mut con, "{order:7}:c"), "a refused set grants nothing");
    let elsewhere = *owners.iter().find(|p| **p != owner).expect("another primary");
    let moved = error_text(
        redis::cmd("DLOCK.ACQUIREALL")
            .arg(2)
            .arg("{order:7}:c")
            .arg("{order:7}:d")
            .arg("w")
            .arg(60_000)
            .query::<redis::Value>(&mut cluster.node(elsewhere).client()),
    );
    assert!(moved.starts_with("MOVED"), "a set is routed by its slot: {moved}");

    // Move the slot holding a live lease to another shard: owner, fence and deadline move with it.
    let resource = "moving:lock";
    let from = cluster.owner(resource);
    let mut source = cluster.node(from).client();
    let granted_at = std::time::Instant::now();
    let fence = acquire(&mut source, resource, "holder", 60_000).expect("granted");
    let to = *owners.iter().find(|p| **p != from).expect("another primary");
    let slot: i64 =
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(resource).query(&mut source).expect("KEYSLOT");
    let (from_id, to_id) = (cluster.node_id(from), cluster.node_id(to));
    let mut target = cluster.node(to).client();
    setslot(&mut target, slot, "IMPORTING", &from_id);
    setslot(&mut source, slot, "MIGRATING", &to_id);
    migrate(&mut source, to, &[resource]);
    for port in [to, from] {
        setslot(&mut cluster.node(port).client(), slot, "NODE", &to_id);
    }
    assert!(eventually(Duration::from_secs(10), || cluster.owner(resource) == to), "slot moved");
    assert_eq!(info_field(&mut target, resource, "owner").as_deref(), Some("holder"));
    assert_eq!(fencecheck(&mut target, resource, fence), 1, "the fence moved with the lease");
    let ttl: i64 = info_field(&mut target, resource, "ttl-ms").expect("live").parse().expect("int");
    let moved_after = granted_at.elapsed().as_millis() as i64;
    assert!(
        ttl >= 60_000 - moved_after - 1_000 && ttl <= 60_000,
        "the deadline moved with it: {ttl}"
    );
    // Until the old owner answered with its counter, the new one answers TRYAGAIN.
    assert_eq!(acquire_retrying(&mut target, resource, "intruder"), None);
    assert_eq!(release(&mut target, resource, "holder"), 1);
    let next = acquire_retrying(&mut target, resource, "next").expect("granted on the new shard");
    assert!(next > fence, "the next fence on the new shard is larger");

    // A replica takes its shard over: the lease it received stays, and fences keep growing.
    let resource = "failover:lock";
    let primary = cluster.owner(resource);
    let replica_port = cluster.replica_of(primary);
    let mut con = cluster.node(primary).client();
    let fence = acquire(&mut con, resource, "holder", 60_000).expect("granted");
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(&mut con).expect("WAIT");
    assert_eq!(acked, 1, "the replica has the lease");
    let mut replica = cluster.node(replica_port).client();
    let _: () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("TAKEOVER")
        .query(&mut replica)
        .expect("TAKEOVER");
    assert!(
        eventually(Duration::from_secs(10), || info_line(&mut replica, "replication", "role")
            .as_deref()
            == Some("master")),
        "the replica took over"
    );
    assert_eq!(fencecheck(&mut replica, resource, fence), 1, "the lease survived the takeover");
    assert_eq!(acquire(&mut replica, resource, "intruder", 1_000), None);
    assert_eq!(release(&mut replica, resource, "holder"), 1);
    assert!(acquire(&mut replica, resource, "next", 1_000).expect("granted") > fence);
}

/// `DLOCK.ACQUIRE resource token 1000`, sent again while the node answers `TRYAGAIN` (a slot
/// it just took waits for its old owner's counter), as cluster clients do.
fn acquire_retrying(con: &mut redis::Connection, resource: &str, token: &str) -> Option<i64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match redis::cmd("DLOCK.ACQUIRE").arg(resource).arg(token).arg(1_000).query(con) {
            Err(e) if e.code() == Some("TRYAGAIN") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            reply => return reply.expect("ACQUIRE"),
        }
    }
}

/// Reads the next `smessage` on a connection that sent `SSUBSCRIBE`: its channel and payload.
fn next_shard_message(con: &mut redis::Connection) -> (String, String) {
    loop {
        let reply = con.recv_response().expect("a shard message");
        let parts: Vec<redis::Value> = match reply {
            redis::Value::Array(parts) | redis::Value::Push { data: parts, .. } => parts,
            other => panic!("unexpected {other:?}"),
        };
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        };
        if parts.len() == 3 && text(&parts[0]) == "smessage" {
            return (text(&parts[1]), text(&parts[2]));
        }
    }
}

#[test]
fn ownership_changes_reach_shard_subscribers_on_the_keys_own_node() {
    let cluster = Cluster::start();
    for (resource, channel) in
        [("invoice:{7}", "dlock:key:invoice:{7}"), ("plain:9", "dlock:{plain:9}")]
    {
        let owner = cluster.owner(resource);
        assert_eq!(cluster.owner(channel), owner, "{channel} hashes to {resource}'s slot");
        let node = cluster.node(owner);
        let mut subscriber = node.client();
        subscriber.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let request = redis::cmd("SSUBSCRIBE").arg(channel).get_packed_command();
        subscriber.send_packed_command(&request).expect("SSUBSCRIBE");
        let _confirmed = subscriber.recv_response().expect("ssubscribe reply");
        // A plain subscriber on the same node hears nothing: the module publishes to the shard.
        let mut plain = node.client();
        plain.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
        let request = redis::cmd("SUBSCRIBE").arg(channel).get_packed_command();
        plain.send_packed_command(&request).expect("SUBSCRIBE");
        let _confirmed = plain.recv_response().expect("subscribe reply");

        let mut con = node.client();
        let fence = acquire(&mut con, resource, "A", 60_000).expect("granted");
        assert_eq!(release(&mut con, resource, "A"), 1);
        assert_eq!(
            next_shard_message(&mut subscriber),
            (channel.to_owned(), format!("acquired {fence}"))
        );
        assert_eq!(
            next_shard_message(&mut subscriber),
            (channel.to_owned(), format!("released {fence}"))
        );
        assert!(plain.recv_response().is_err(), "no plain PUBLISH in Cluster");
    }
}

fn setslot(con: &mut redis::Connection, slot: i64, state: &str, node: &str) {
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(state)
        .arg(node)
        .query(con)
        .unwrap_or_else(|e| panic!("SETSLOT {state}: {e}"));
}

fn fenced_push(con: &mut redis::Connection, fence: i64, item: &str) -> redis::RedisResult<i64> {
    redis::cmd("DLOCK.FENCED")
        .arg("{r}lock")
        .arg(fence)
        .arg("RPUSH")
        .arg("{r}data")
        .arg(item)
        .query(con)
}

/// A slot moves in batches of keys (`redis-cli --cluster reshard` moves 10 at a time), so the lock
/// key can reach the target before its data key. A fenced write then must not follow the lock
/// key there: it would create a second `{r}data` on the target, and one of the two lists is lost
/// when the migration ends. The server knows every key of the call, so it answers TRYAGAIN on
/// both sides until both keys are on one node, as for a native multi-key command.
#[test]
fn a_fenced_write_during_a_slot_migration_waits_until_its_keys_are_together() {
    let cluster = Cluster::start();
    let from = cluster.owner("{r}lock");
    let to = cluster
        .nodes
        .iter()
        .map(|n| n.port)
        .find(|&p| {
            p != from
                && info_line(&mut cluster.node(p).client(), "replication", "role").as_deref()
                    == Some("master")
        })
        .expect("another primary");
    let mut source = cluster.node(from).client();
    let fence = acquire(&mut source, "{r}lock", "w", 60_000).expect("granted");
    assert_eq!(fenced_push(&mut source, fence, "before").expect("fenced write"), 1);
    let slot: i64 =
        redis::cmd("CLUSTER").arg("KEYSLOT").arg("{r}lock").query(&mut source).expect("KEYSLOT");
    let (from_id, to_id) = (cluster.node_id(from), cluster.node_id(to));
    let mut target = cluster.node(to).client();
    setslot(&mut target, slot, "IMPORTING", &from_id);
    setslot(&mut source, slot, "MIGRATING", &to_id);
    migrate(&mut source, to, &["{r}lock"]);

    let on_source = error_text(fenced_push(&mut source, fence, "during").map(redis::Value::Int));
    assert!(on_source.starts_with("TRYAGAIN"), "the source: {on_source}");
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").ignore();
    pipe.cmd("DLOCK.FENCED").arg("{r}lock").arg(fence).arg("RPUSH").arg("{r}data").arg("during");
    let on_target =
        error_text(pipe.query::<Vec<redis::Value>>(&mut target).map(|mut v| v.remove(0)));
    assert!(on_target.starts_with("TRYAGAIN"), "the target after ASKING: {on_target}");
    assert!(!exists_asking(&mut target, "{r}data"), "no second copy of the data key");

    migrate(&mut source, to, &["{r}data"]);
    for port in [to, from] {
        setslot(&mut cluster.node(port).client(), slot, "NODE", &to_id);
    }
    assert!(eventually(Duration::from_secs(10), || cluster.owner("{r}lock") == to), "moved");
    assert_eq!(fenced_push(&mut target, fence, "after").expect("fenced write on the new node"), 2);
    let items: Vec<String> =
        redis::cmd("LRANGE").arg("{r}data").arg(0).arg(-1).query(&mut target).expect("LRANGE");
    assert_eq!(items, ["before", "after"], "every acknowledged write, in one list");
}

/// EXISTS on a node importing the key's slot (ASKING first).
fn exists_asking(con: &mut redis::Connection, key: &str) -> bool {
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").ignore().cmd("EXISTS").arg(key);
    let (found,): (i64,) = pipe.query(con).expect("EXISTS");
    found == 1
}

/// `DLOCK.ACQUIRE` on a node taking the resource's slot (ASKING first while it imports it),
/// retried while the node answers TRYAGAIN; the fence, and how many TRYAGAINs came first.
fn acquire_moving(con: &mut redis::Connection, resource: &str, asking: bool) -> (i64, u32) {
    acquire_moving_as(con, resource, "t", asking, &[])
}

/// [`acquire_moving`] for `token`, with options (`SHARED`, …).
fn acquire_moving_as(
    con: &mut redis::Connection,
    resource: &str,
    token: &str,
    asking: bool,
    options: &[&str],
) -> (i64, u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut tries = 0;
    loop {
        let mut pipe = redis::pipe();
        if asking {
            pipe.cmd("ASKING").ignore();
        }
        pipe.cmd("DLOCK.ACQUIRE").arg(resource).arg(token).arg(60_000).arg(options);
        match pipe.query::<(Option<i64>,)>(con) {
            Ok((Some(fence),)) => return (fence, tries),
            Ok((None,)) => panic!("{resource} not granted"),
            Err(e) if e.code() == Some("TRYAGAIN") && Instant::now() < deadline => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("ACQUIRE {resource}: {e}"),
        }
    }
}

/// A slot moves to a node whose clock is ten minutes behind (far past `dlock.fence-lead-ms`):
/// a free resource's next fence there is still larger than its last on the old node, during the
/// import (through ASK) and after it; a held one carries its fence in its key; a reader of a
/// shared lock whose newest reader left before the key moved still gets a larger fence.
#[test]
fn fences_keep_rising_across_a_slot_move_to_a_node_whose_clock_is_behind() {
    // Behind from the start, so that its counter's start-up lead is behind too.
    let behind = Clock::new();
    behind.backward(Duration::from_secs(600));
    let cluster =
        Cluster::start_with(|i| if i == 1 { Launch::new().clock(&behind) } else { Launch::new() });
    let (from, to) = (cluster.nodes[0].port, cluster.nodes[1].port);
    let mut source = cluster.node(from).client();
    let mut target = cluster.node(to).client();
    for (port, con) in [(from, &mut source), (to, &mut target)] {
        let role = info_line(con, "replication", "role");
        assert_eq!(role.as_deref(), Some("master"), "node {port} is a primary");
    }
    // Three resources of one slot that node 0 serves.
    let tag = (0..)
        .map(|i| format!("{{m{i}}}"))
        .find(|tag| cluster.owner(tag) == from)
        .expect("a tag on node 0");
    let [during, after, held] = ["during", "after", "held"].map(|name| format!("{tag}{name}"));
    let mut last_on_source = std::collections::HashMap::new();
    for resource in [&during, &after] {
        let fence = acquire(&mut source, resource, "old", 60_000).expect("granted on the source");
        assert_eq!(release(&mut source, resource, "old"), 1);
        last_on_source.insert(resource.clone(), fence);
    }
    let held_fence = acquire(&mut source, &held, "old", 60_000).expect("granted on the source");
    let shared = format!("{tag}shared");
    let read = |con: &mut redis::Connection, token: &str| -> Option<i64> {
        redis::cmd("DLOCK.ACQUIRE")
            .arg(&shared)
            .arg(token)
            .arg(60_000)
            .arg("SHARED")
            .query(con)
            .expect("ACQUIRE SHARED")
    };
    read(&mut source, "reader-1").expect("first reader");

    let slot: i64 =
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(&tag).query(&mut source).expect("KEYSLOT");
    let (from_id, to_id) = (cluster.node_id(from), cluster.node_id(to));
    setslot(&mut target, slot, "IMPORTING", &from_id);
    setslot(&mut source, slot, "MIGRATING", &to_id);
    let (fence, tries) = acquire_moving(&mut target, &during, true);
    assert!(tries > 0, "the first grant during the import waits for the source's counter");
    assert!(
        fence > last_on_source[&during],
        "during the import: {fence} after {}",
        last_on_source[&during]
    );
    // The source still serves the shared key (it is there): newer readers come and go, then the
    // key moves with only the first reader in it.
    let mut newest_reader = 0;
    for _ in 0..5 {
        newest_reader = read(&mut source, "reader-2").expect("second reader");
        assert_eq!(release(&mut source, &shared, "reader-2"), 1);
    }
    migrate(&mut source, to, &[&shared]);
    let (fence, _) = acquire_moving_as(&mut target, &shared, "reader-3", true, &["SHARED"]);
    assert!(fence > newest_reader, "a reader after the move: {fence} after {newest_reader}");

    migrate(&mut source, to, &[&held]);
    for port in [to, from] {
        setslot(&mut cluster.node(port).client(), slot, "NODE", &to_id);
    }
    let (fence, _) = acquire_moving(&mut target, &after, false);
    assert!(
        fence > last_on_source[&after],
        "after the move: {fence} after {}",
        last_on_source[&after]
    );
    assert_eq!(release(&mut target, &held, "old"), 1, "the held lease moved with its key");
    let (fence, _) = acquire_moving(&mut target, &held, false);
    assert!(fence > held_fence, "a moved key's next fence: {fence} after {held_fence}");
}

/// A slot moves as `redis-cli --cluster reshard` moves it (IMPORTING, MIGRATING, the keys, then
/// NODE on the target and the source) to a node whose clock is behind, and no ACQUIRE reaches
/// the target during the import: the first ACQUIRE there, after the move, must still be granted a
/// fence above the resource's last one on the old node. The cluster chaos profile found fences
/// falling back by the clocks' difference this way (seed 21, Redis 7.0 and Valkey 9:
/// `fence-order`, "fence … granted after fence … was granted", after reshards and rebalances).
#[test]
fn fences_keep_rising_across_a_slot_move_with_no_acquire_during_the_import() {
    let behind = Clock::new();
    behind.backward(Duration::from_secs(600));
    let cluster =
        Cluster::start_with(|i| if i == 1 { Launch::new().clock(&behind) } else { Launch::new() });
    let (from, to) = (cluster.nodes[0].port, cluster.nodes[1].port);
    let mut source = cluster.node(from).client();
    let mut target = cluster.node(to).client();
    let tag = (0..)
        .map(|i| format!("{{q{i}}}"))
        .find(|tag| cluster.owner(tag) == from)
        .expect("a tag on node 0");
    let resource = format!("{tag}free");
    let last = acquire(&mut source, &resource, "old", 60_000).expect("granted on the source");
    assert_eq!(release(&mut source, &resource, "old"), 1);

    let slot: i64 =
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(&tag).query(&mut source).expect("KEYSLOT");
    let (from_id, to_id) = (cluster.node_id(from), cluster.node_id(to));
    setslot(&mut target, slot, "IMPORTING", &from_id);
    setslot(&mut source, slot, "MIGRATING", &to_id);
    let keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(100)
        .query(&mut source)
        .expect("GETKEYSINSLOT");
    if !keys.is_empty() {
        migrate(&mut source, to, &keys.iter().map(String::as_str).collect::<Vec<_>>());
    }
    for port in [to, from] {
        setslot(&mut cluster.node(port).client(), slot, "NODE", &to_id);
    }
    let (fence, _) = acquire_moving(&mut target, &resource, false);
    assert!(fence > last, "the first grant after the move: {fence} after {last}");
}

/// The old owner does not answer (paused): the node taking the slot stops waiting after 2 s and
/// grants, on its lead (docs/scaling.md states the limit).
#[test]
fn a_slot_whose_old_owner_does_not_answer_is_granted_after_the_wait_limit() {
    let cluster = Cluster::start();
    let (from, to) = (cluster.nodes[0].port, cluster.nodes[1].port);
    let tag =
        (0..).map(|i| format!("{{p{i}}}")).find(|tag| cluster.owner(tag) == from).expect("tag");
    let mut source = cluster.node(from).client();
    let mut target = cluster.node(to).client();
    let slot: i64 =
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(&tag).query(&mut source).expect("KEYSLOT");
    setslot(&mut target, slot, "IMPORTING", &cluster.node_id(from));
    cluster.node(from).pause();
    let started = Instant::now();
    let (fence, tries) = acquire_moving(&mut target, &format!("{tag}r"), true);
    let waited = started.elapsed();
    cluster.node(from).resume();
    assert!(fence > 0 && tries > 0);
    assert!(waited >= Duration::from_millis(1_900), "granted after {waited:?}, before the limit");
    assert!(waited < Duration::from_secs(5), "still waiting after {waited:?}");
}

/// Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`) to a node whose clock is ten
/// minutes behind: a held lease arrives with its owner and fence, and a free resource's next
/// fence there is larger than its last on the old node (the node asks the old owner for its
/// counter when the import completes). Redis has no such command: it must say so.
#[test]
fn an_atomic_slot_migration_keeps_leases_and_fence_order() {
    let behind = Clock::new();
    behind.backward(Duration::from_secs(600));
    let cluster =
        Cluster::start_with(|i| if i == 1 { Launch::new().clock(&behind) } else { Launch::new() });
    let (from, to) = (cluster.nodes[0].port, cluster.nodes[1].port);
    let tag =
        (0..).map(|i| format!("{{asm{i}}}")).find(|tag| cluster.owner(tag) == from).expect("tag");
    let (held, free) = (format!("{tag}held"), format!("{tag}free"));
    let mut source = cluster.node(from).client();
    let held_fence = acquire(&mut source, &held, "holder", 60_000).expect("granted");
    let free_fence = acquire(&mut source, &free, "old", 60_000).expect("granted");
    assert_eq!(release(&mut source, &free, "old"), 1);
    let slot: i64 =
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(&held).query(&mut source).expect("KEYSLOT");
    let started: redis::RedisResult<()> = redis::cmd("CLUSTER")
        .arg("MIGRATESLOTS")
        .arg("SLOTSRANGE")
        .arg(slot)
        .arg(slot)
        .arg("NODE")
        .arg(cluster.node_id(to))
        .query(&mut source);
    let valkey = info_line(&mut source, "server", "valkey_version").is_some();
    if !valkey {
        let error = started.expect_err("Redis has no MIGRATESLOTS");
        assert!(error.to_string().to_lowercase().contains("unknown subcommand"), "{error}");
        return;
    }
    started.expect("the migration starts (the module declares it can follow one)");
    assert!(eventually(Duration::from_secs(20), || cluster.owner(&held) == to), "moved");
    let mut target = cluster.node(to).client();
    assert_eq!(info_field(&mut target, &held, "owner").as_deref(), Some("holder"));
    assert_eq!(info_field(&mut target, &held, "fence"), Some(held_fence.to_string()));
    let (fence, _) = acquire_moving(&mut target, &free, false);
    assert!(fence > free_fence, "a free resource after the move: {fence} after {free_fence}");
    let (fence, _) = acquire_moving_as(&mut target, &held, "holder", false, &[]);
    assert_eq!(fence, held_fence, "the holder re-acquires its own lease there");
}

/// The `DEL`s an expiry sweep replicates are gathered per slot in Redis Cluster: leases of three
/// slots ending together reach the shard's replica as a few `DEL`s, at least one per slot, and
/// the replica then holds none of them.
#[test]
fn expiries_reach_the_replica_as_one_del_per_slot_at_a_time() {
    const PER_SLOT: usize = 200;
    let cluster = Cluster::start();
    // Three hash tags (three slots) served by one primary.
    let primary = cluster.owner("{e0}");
    let tags: Vec<String> = (0..1_000)
        .map(|i| format!("e{i}"))
        .filter(|tag| cluster.owner(&format!("{{{tag}}}")) == primary)
        .take(3)
        .collect();
    assert_eq!(tags.len(), 3, "three slots on {primary}");
    let replica = cluster.replica_of(primary);
    let mut r = cluster.node(replica).client();
    let dels_before = del_calls(&mut r);
    let mut p = cluster.node(primary).client();
    let mut pipe = redis::pipe();
    for tag in &tags {
        for i in 0..PER_SLOT {
            pipe.cmd("DLOCK.ACQUIRE").arg(format!("{{{tag}}}:{i}")).arg("w").arg(2_000).ignore();
        }
    }
    pipe.query::<()>(&mut p).expect("acquired");
    // Every lease on the replica first: its DBSIZE of 0 must be the expiries' doing.
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(1_500).query(&mut p).expect("WAIT");
    assert_eq!(acked, 1, "the replica acknowledged the grants");
    assert_eq!(dbsize(&mut r), 3 * PER_SLOT as i64, "replicated");
    assert!(eventually(Duration::from_secs(10), || dbsize(&mut p) == 0), "all expired");
    assert!(eventually(Duration::from_secs(10), || dbsize(&mut r) == 0), "gone on the replica");
    let dels = del_calls(&mut r) - dels_before;
    assert!(
        (3..=60).contains(&dels),
        "{} expiries of 3 slots in {dels} DELs: gathered, never across slots",
        3 * PER_SLOT
    );
}

/// How many `DEL` calls the server has run (`INFO commandstats`).
fn del_calls(con: &mut redis::Connection) -> u64 {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(con).expect("INFO");
    command_calls(&stats, "del")
}
