//! Redis Cluster: three shards with a replica each, the module on every node.

use std::time::Duration;

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
    assert_eq!(acquire(&mut target, resource, "intruder", 1_000), None);
    assert_eq!(release(&mut target, resource, "holder"), 1);
    let next = acquire(&mut target, resource, "next", 1_000).expect("granted on the new shard");
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
        [("invoice:{7}", "dlock:invoice:{7}"), ("plain:9", "dlock:{plain:9}")]
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

fn migrate(source: &mut redis::Connection, to: u16, keys: &[&str]) {
    let _: String = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(to)
        .arg("")
        .arg(0)
        .arg(5_000)
        .arg("KEYS")
        .arg(keys)
        .query(source)
        .expect("MIGRATE");
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
