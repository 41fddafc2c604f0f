//! The cluster's node servers, each in its own network namespace ([`super::net`]) with its own
//! clock (testkit's clock shim), started with `ip netns exec`, and what the harness asks them:
//! `CLUSTER NODES` read as a table, health, and `redis-cli --cluster` for the operator's work.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use dlock_testkit::{Clock, module_path, server_binary};

use super::net::{self, Net};

/// The cluster's node timeout: a primary unreachable this long is failed over.
pub const NODE_TIMEOUT_MS: u64 = 2_000;

/// One node: its process (while it runs), directory and clock.
pub struct Node {
    pub endpoint: String,
    child: Option<Child>,
    dir: PathBuf,
    pub clock: Clock,
    /// Stopped by SIGSTOP.
    pub paused: bool,
}

/// Every node the run may use: the six it starts with, then the spares that `add-node` joins.
pub struct Nodes {
    pub net: Net,
    pub list: Vec<Node>,
    args: Vec<String>,
}

impl Nodes {
    /// `count` node slots on `net`, none started; `args` are every node's extra arguments.
    pub fn new(net: Net, root: &std::path::Path, args: Vec<String>) -> Self {
        let list = (0..net.nodes())
            .map(|i| Node {
                endpoint: net.endpoint(i),
                child: None,
                dir: root.join(format!("node-{i}")),
                clock: Clock::new(),
                paused: false,
            })
            .collect();
        Nodes { net, list, args }
    }

    /// Starts node `i` on its directory (`fresh`: emptied first, a node the cluster never saw),
    /// and waits until it answers PING.
    pub fn start(&mut self, i: usize, fresh: bool) {
        let node = &mut self.list[i];
        if fresh {
            let _ = std::fs::remove_dir_all(&node.dir);
        }
        std::fs::create_dir_all(&node.dir).expect("node dir");
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.net.namespace(i)])
            .arg(server_binary())
            .args(["--port", &net::port(i).to_string(), "--bind", &self.net.address(i)])
            .arg("--dir")
            .arg(&node.dir)
            .arg("--logfile")
            .arg(node.dir.join("server.log"))
            .args(["--loglevel", "verbose", "--enable-debug-command", "yes"])
            // The nodes listen on their namespace's address, not on loopback.
            .args(["--protected-mode", "no"])
            .arg("--loadmodule")
            .arg(module_path())
            .args(&self.args)
            .envs(node.clock.env())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = net::unblock_in_child(&mut command).spawn().expect("ip netns exec");
        net::track(child.id());
        node.child = Some(child);
        node.paused = false;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if query::<String>(&node.endpoint, &redis::cmd("PING")).is_ok() {
                return;
            }
            sleep(Duration::from_millis(20));
        }
        panic!("node {i} ({}) did not start; see {}", node.endpoint, node.dir.display());
    }

    /// SIGKILL of node `i` (it may be stopped: a killed process needs no SIGCONT).
    pub fn kill(&mut self, i: usize) {
        let node = &mut self.list[i];
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            net::untrack(child.id());
        }
        node.paused = false;
    }

    /// SIGSTOP (`stop`) or SIGCONT of node `i`.
    pub fn signal(&mut self, i: usize, stop: bool) {
        let node = &mut self.list[i];
        if let Some(child) = &node.child {
            let signal = if stop { libc::SIGSTOP } else { libc::SIGCONT };
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
            node.paused = stop;
        }
    }

    /// Whether node `i` runs (and is not stopped).
    pub fn running(&self, i: usize) -> bool {
        self.list[i].child.is_some() && !self.list[i].paused
    }

    /// The node whose endpoint is `endpoint`.
    pub fn index_of(&self, endpoint: &str) -> Option<usize> {
        self.list.iter().position(|n| n.endpoint == endpoint)
    }

    /// A running node that is a member of the cluster (answers CLUSTER NODES with itself and
    /// some slots known), to ask the cluster's state.
    pub fn entry(&self) -> Option<&str> {
        self.list
            .iter()
            .filter(|n| n.child.is_some() && !n.paused)
            .map(|n| n.endpoint.as_str())
            .find(|e| view(e).is_some_and(|v| v.iter().any(|n| n.slots > 0)))
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for i in 0..self.list.len() {
            self.signal(i, false);
            self.kill(i);
        }
    }
}

/// One request to the node at `endpoint`, with short timeouts.
pub fn query<T: redis::FromRedisValue>(endpoint: &str, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://{endpoint}/"))?;
    let mut con = client.get_connection_with_timeout(Duration::from_millis(500))?;
    con.set_read_timeout(Some(Duration::from_secs(2)))?;
    con.set_write_timeout(Some(Duration::from_secs(2)))?;
    cmd.query(&mut con)
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
pub struct Member {
    pub id: String,
    /// `host:port`.
    pub endpoint: String,
    pub primary: bool,
    /// A replica's primary's id.
    pub primary_id: Option<String>,
    /// `fail` or `fail?` flagged.
    pub failing: bool,
    pub slots: usize,
    /// The slot ranges it serves, first and last included.
    pub ranges: Vec<(usize, usize)>,
    /// Slots in migration (`[slot->-id]` or `[slot-<-id]`).
    pub open_slots: usize,
    pub connected: bool,
}

/// The cluster as the node at `endpoint` sees it.
pub fn view(endpoint: &str) -> Option<Vec<Member>> {
    let text: String = query(endpoint, redis::cmd("CLUSTER").arg("NODES")).ok()?;
    Some(text.lines().filter_map(member).collect())
}

fn member(line: &str) -> Option<Member> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 8 {
        return None;
    }
    let endpoint = fields[1].split('@').next()?.to_owned();
    let flags = fields[2];
    let mut ranges = Vec::new();
    let mut open_slots = 0;
    for range in &fields[8..] {
        if range.starts_with('[') {
            open_slots += 1;
        } else if let Some((from, to)) = range.split_once('-') {
            ranges.push((from.parse().ok()?, to.parse().ok()?));
        } else {
            let slot = range.parse().ok()?;
            ranges.push((slot, slot));
        }
    }
    let slots = ranges.iter().map(|(from, to)| to + 1 - from).sum();
    Some(Member {
        id: fields[0].to_owned(),
        endpoint,
        primary: flags.contains("master"),
        primary_id: (fields[3] != "-").then(|| fields[3].to_owned()),
        failing: flags.contains("fail"),
        slots,
        ranges,
        open_slots,
        connected: fields[7] == "connected",
    })
}

/// The primaries that serve slots and have a replica streaming from them: those a failover
/// nemesis may take down without leaving slots unserved.
pub fn primaries_with_replica(view: &[Member]) -> Vec<(Member, Member)> {
    let mut pairs = Vec::new();
    for primary in view.iter().filter(|m| m.primary && m.slots > 0 && !m.failing) {
        let replica = view.iter().find(|m| {
            !m.primary && m.primary_id.as_deref() == Some(&primary.id) && !m.failing && m.connected
        });
        if let Some(replica) = replica {
            let link_up = info_field(&replica.endpoint, "replication", "master_link_status");
            if link_up.as_deref() == Some("up") {
                pairs.push((primary.clone(), replica.clone()));
            }
        }
    }
    pairs
}

/// A field of `INFO section` on the node at `endpoint`.
pub fn info_field(endpoint: &str, section: &str, name: &str) -> Option<String> {
    let text: String = query(endpoint, redis::cmd("INFO").arg(section)).ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_owned()))
}

/// A primary and the slot ranges it serves, as one node sees them.
type Served = (String, Vec<(usize, usize)>);

/// Whether every running member agrees the cluster is whole: `cluster_state:ok` with every
/// slot served, nobody flagged failing, no slot in migration, every replica's link up.
pub fn healthy(nodes: &Nodes, members: &[String]) -> bool {
    // Every member must see the same primaries serving the same slots: a restarted old primary
    // may still count itself one until it hears of the epoch that replaced it.
    let mut seen: Option<Vec<Served>> = None;
    for endpoint in members {
        let Some(i) = nodes.index_of(endpoint) else { return false };
        if !nodes.running(i) {
            return false;
        }
        let info: Option<String> = query(endpoint, redis::cmd("CLUSTER").arg("INFO")).ok();
        let Some(info) = info else { return false };
        if !info.contains("cluster_state:ok") || !info.contains("cluster_slots_ok:16384") {
            return false;
        }
        let Some(view) = view(endpoint) else { return false };
        if view.iter().any(|m| m.failing || m.open_slots > 0 || !m.connected) {
            return false;
        }
        let mut served: Vec<Served> = view
            .iter()
            .filter(|m| m.primary && m.slots > 0)
            .map(|m| (m.endpoint.clone(), m.ranges.clone()))
            .collect();
        served.sort();
        if seen.as_ref().is_some_and(|seen| *seen != served) {
            return false;
        }
        seen = Some(served);
        let me = view.iter().find(|m| &m.endpoint == endpoint);
        if me.is_some_and(|m| !m.primary)
            && info_field(endpoint, "replication", "master_link_status").as_deref() != Some("up")
        {
            return false;
        }
    }
    true
}

/// Waits up to `within` until [`healthy`]; whether it became so.
pub fn await_healthy(nodes: &Nodes, members: &[String], within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if healthy(nodes, members) {
            return true;
        }
        sleep(Duration::from_millis(100));
    }
    false
}

/// Waits up to `within` until the node at `endpoint` is a primary; whether it became one.
pub fn await_primary(endpoint: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if info_field(endpoint, "replication", "role").as_deref() == Some("master") {
            return true;
        }
        sleep(Duration::from_millis(50));
    }
    false
}

/// `redis-cli --cluster <args>` (the system's redis-cli: the `--cluster` tool speaks to Redis
/// 7.0 and Valkey 9 alike); its output, and whether it succeeded. Bounded to `within`.
pub fn redis_cli(args: &[&str], within: Duration) -> (bool, String) {
    let mut command = Command::new("redis-cli");
    command.arg("--cluster").args(args).stdin(Stdio::null());
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let Ok(child) = command.spawn() else { return (false, "redis-cli not found".into()) };
    let pid = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output());
    let deadline = Instant::now() + within;
    while !waiter.is_finished() && Instant::now() < deadline {
        sleep(Duration::from_millis(50));
    }
    if !waiter.is_finished() {
        // SAFETY: kill(2) on our own child's pid, which has not been waited for yet.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
    match waiter.join() {
        Ok(Ok(output)) => {
            let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&output.stderr));
            (output.status.success(), text)
        }
        _ => (false, "redis-cli did not finish".into()),
    }
}
