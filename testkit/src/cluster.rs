//! A Redis Cluster of three shards with a replica each, the module on every node.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::{Launch, Server, cluster_info, eventually, info_line};

/// Six nodes made into a cluster by `redis-cli --cluster create`; every node is `ok` and every
/// replica streams before [`Cluster::start`] returns.
pub struct Cluster {
    /// Every node, primaries and replicas.
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// Starts six nodes and joins them: three primaries, one replica each.
    pub fn start() -> Self {
        Self::start_with(|_| Launch::new())
    }

    /// [`Cluster::start`], node `i` started from `launch(i)` (its own clock, say). Nodes 0, 1
    /// and 2 become the primaries, 3, 4 and 5 their replicas.
    pub fn start_with(launch: impl Fn(usize) -> Launch) -> Self {
        let nodes: Vec<Server> = (0..6)
            .map(|i| {
                launch(i)
                    .args(&[
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "15000",
                        "--repl-diskless-sync-delay",
                        "0",
                    ])
                    .start()
            })
            .collect();
        let addresses: Vec<String> =
            nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli --cluster create");
        assert!(status.success(), "cluster creation failed");
        let cluster = Cluster { nodes };
        for node in &cluster.nodes {
            let mut con = node.client();
            assert!(
                eventually(Duration::from_secs(30), || {
                    cluster_info(&mut con).get("cluster_state").map(String::as_str) == Some("ok")
                }),
                "cluster not ok on {}",
                node.port
            );
            // Replicas must be streaming before the test relies on them.
            if info_line(&mut con, "replication", "role").as_deref() == Some("slave") {
                let link_up = |con: &mut redis::Connection| {
                    info_line(con, "replication", "master_link_status").as_deref() == Some("up")
                };
                assert!(eventually(Duration::from_secs(30), || link_up(&mut con)), "replica link");
            }
        }
        cluster
    }

    /// The port of the primary that serves `key`'s slot now.
    pub fn owner(&self, key: &str) -> u16 {
        let mut con = self.nodes[0].client();
        let slot: i64 =
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut con).expect("KEYSLOT");
        let ranges: Vec<redis::Value> =
            redis::cmd("CLUSTER").arg("SLOTS").query(&mut con).expect("SLOTS");
        for range in ranges {
            let redis::Value::Array(fields) = range else { continue };
            let (redis::Value::Int(start), redis::Value::Int(end), redis::Value::Array(primary)) =
                (&fields[0], &fields[1], &fields[2])
            else {
                continue;
            };
            if (*start..=*end).contains(&slot)
                && let redis::Value::Int(port) = primary[1]
            {
                return port as u16;
            }
        }
        panic!("no node serves slot {slot}");
    }

    /// The port of the replica that streams from the primary at `primary` (its link up).
    pub fn replica_of(&self, primary: u16) -> u16 {
        let found = std::cell::Cell::new(None);
        let streaming = eventually(Duration::from_secs(30), || {
            found.set(self.nodes.iter().map(|n| n.port).find(|&port| {
                let mut con = self.node(port).client();
                info_line(&mut con, "replication", "master_port").as_deref()
                    == Some(primary.to_string().as_str())
                    && info_line(&mut con, "replication", "master_link_status").as_deref()
                        == Some("up")
            }));
            found.get().is_some()
        });
        assert!(streaming, "no replica of {primary}");
        found.get().unwrap_or_default()
    }

    /// The node listening on `port`.
    pub fn node(&self, port: u16) -> &Server {
        self.nodes.iter().find(|n| n.port == port).expect("node")
    }

    /// `CLUSTER MYID` of the node on `port`.
    pub fn node_id(&self, port: u16) -> String {
        let mut con = self.node(port).client();
        redis::cmd("CLUSTER").arg("MYID").query(&mut con).expect("MYID")
    }
}

/// `MIGRATE` of `keys` from the node `source` is connected to, to the node on `to` (local host,
/// database 0, 5 s timeout): what `redis-cli --cluster reshard` sends for each batch.
pub fn migrate(source: &mut redis::Connection, to: u16, keys: &[&str]) {
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
