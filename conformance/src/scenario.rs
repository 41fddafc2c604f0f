//! Scenarios as data (`protocol/conformance/*.json`) and the steps that run them: requests to
//! the drivers, what the harness does to servers, links and driver processes, and the checks of
//! replies, events and the server's own state. `protocol/conformance/README.md` describes the
//! format.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dlock_testkit::{
    Cluster, LinkProxy, Server, info_fields, primary_and_replica_with, wait_until_replica_streams,
};
use serde_json::{Value, json};

use crate::driver::{Driver, Mutation};
use crate::json_of;
use crate::pattern::{Vars, matches, substitute};

/// How long a reply may take when a step does not say.
const DEFAULT_WITHIN: Duration = Duration::from_secs(10);

/// One scenario, as its file gives it.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// A short name, unique across files.
    pub name: String,
    /// The outcome every client must show, in a sentence.
    pub title: String,
    /// `single` (default), `aof` (appendfsync always, for restarts), `replicated` (a primary
    /// and a replica, every driver behind a proxy), `cluster` (three shards).
    pub topology: String,
    /// The drivers: name → whether it reaches the server through a proxy of its own.
    pub drivers: Vec<(String, bool)>,
    /// Clients the scenario does not apply to, with the reason (shown as n/a).
    pub not_for: BTreeMap<String, String>,
    /// The steps, in order.
    pub steps: Vec<Value>,
}

/// Every scenario in the `.json` files of `dir` (a file holds one scenario or a list), in the
/// order of the file names, then of the lists.
pub fn load(dir: &Path) -> Result<Vec<Scenario>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    let mut scenarios: Vec<Scenario> = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        let list = match value {
            Value::Array(list) => list,
            one => vec![one],
        };
        for value in list {
            let scenario = parse(&value).map_err(|e| format!("{}: {e}", file.display()))?;
            if scenarios.iter().any(|s| s.name == scenario.name) {
                return Err(format!("{}: scenario {} named twice", file.display(), scenario.name));
            }
            scenarios.push(scenario);
        }
    }
    Ok(scenarios)
}

fn parse(value: &Value) -> Result<Scenario, String> {
    let text = |field: &str| value[field].as_str().map(str::to_owned);
    let name = text("name").ok_or("a scenario without a name")?;
    let drivers = match &value["drivers"] {
        Value::Object(drivers) => drivers
            .iter()
            .map(|(name, spec)| (name.clone(), spec["proxy"].as_bool().unwrap_or(false)))
            .collect(),
        Value::Null => vec![("a".to_owned(), false)],
        other => return Err(format!("{name}: drivers must be an object, not {other}")),
    };
    let not_for = value["not_for"]
        .as_object()
        .map(|clients| {
            clients
                .iter()
                .map(|(c, why)| (c.clone(), why.as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let steps = value["steps"].as_array().cloned().ok_or(format!("{name}: no steps"))?;
    for (index, step) in steps.iter().enumerate() {
        let actions = step
            .as_object()
            .map_or(0, |fields| fields.keys().filter(|k| ACTIONS.contains(&k.as_str())).count());
        if actions != 1 {
            return Err(format!(
                "{name}: step {} needs one action of {ACTIONS:?}: {step}",
                index + 1
            ));
        }
    }
    let topology = text("topology").unwrap_or_else(|| "single".to_owned());
    if !["single", "aof", "replicated", "cluster"].contains(&topology.as_str()) {
        return Err(format!("{name}: unknown topology {topology}"));
    }
    Ok(Scenario {
        title: text("title").ok_or(format!("{name}: no title"))?,
        name,
        topology,
        drivers,
        not_for,
        steps,
    })
}

/// The servers a scenario runs against.
enum Servers {
    Single(Server),
    Replicated { primary: Option<Server>, replica: Server },
    Cluster(Cluster),
}

/// A scenario under way.
struct Run {
    servers: Servers,
    proxies: HashMap<String, LinkProxy>,
    drivers: HashMap<String, Driver>,
    vars: Vars,
    marks: HashMap<String, Instant>,
    sent: HashMap<String, (String, u64, Instant)>,
}

/// Runs `scenario` with drivers started from `command`: the client's name and version as its
/// driver gave them, or `Err` saying which step failed and why.
pub fn run(
    scenario: &Scenario,
    command: &str,
    workdir: &Path,
    mutation: Option<Mutation>,
) -> Result<Option<String>, String> {
    let servers = match scenario.topology.as_str() {
        "single" => Servers::Single(Server::start()),
        "aof" => Servers::Single(Server::start_with(dlock_testkit::AOF_ALWAYS)),
        "replicated" => {
            let (primary, replica) = primary_and_replica_with(&[], &[]);
            Servers::Replicated { primary: Some(primary), replica }
        }
        _ => Servers::Cluster(Cluster::start()),
    };
    let mut run = Run {
        servers,
        proxies: HashMap::new(),
        drivers: HashMap::new(),
        vars: Vars::new(),
        marks: HashMap::new(),
        sent: HashMap::new(),
    };
    for (name, proxied) in &scenario.drivers {
        let url = run.url_for(name, *proxied);
        let stderr = workdir.join(format!("{}-{name}.stderr", scenario.name));
        let driver = Driver::start(name, command, &url, stderr, mutation)?;
        run.drivers.insert(name.clone(), driver);
    }
    run.marks.insert("start".to_owned(), Instant::now());
    for (index, step) in scenario.steps.iter().enumerate() {
        if let Err(why) = run.step(step) {
            let mut report = format!("step {} {}: {why}", index + 1, compact(step));
            for (name, driver) in &run.drivers {
                let pending = driver.pending_events();
                if !pending.is_empty() {
                    report.push_str(&format!("\n  driver {name}'s other events: {pending:?}"));
                }
                let stderr = driver.stderr_tail();
                if !stderr.is_empty() {
                    report.push_str(&format!("\n  driver {name}'s stderr:\n{stderr}"));
                }
            }
            return Err(report);
        }
    }
    Ok(run.drivers.values().find_map(Driver::client_version))
}

fn compact(step: &Value) -> String {
    let text = step.to_string();
    if text.chars().count() > 160 {
        format!("{}…", text.chars().take(160).collect::<String>())
    } else {
        text
    }
}

fn millis(step: &Value, field: &str) -> Option<Duration> {
    step[field].as_u64().map(Duration::from_millis)
}

impl Run {
    /// The URL driver `name` connects to: the server's (every primary's, for a cluster), or
    /// a proxy's of its own in front of the primary.
    fn url_for(&mut self, name: &str, proxied: bool) -> String {
        let primary = match &self.servers {
            Servers::Single(server) => server.port,
            Servers::Replicated { primary, .. } => primary.as_ref().expect("primary").port,
            Servers::Cluster(cluster) => {
                return cluster.nodes[..3]
                    .iter()
                    .map(|node| format!("redis://127.0.0.1:{}/", node.port))
                    .collect::<Vec<_>>()
                    .join(",");
            }
        };
        // Behind a replicated pair every driver goes through a proxy: a failover retargets it.
        if proxied || matches!(self.servers, Servers::Replicated { .. }) {
            let proxy = LinkProxy::start(primary);
            let url = format!("redis://127.0.0.1:{}/", proxy.port);
            self.proxies.insert(name.to_owned(), proxy);
            url
        } else {
            format!("redis://127.0.0.1:{primary}/")
        }
    }

    /// A connection to the primary that serves `key` (the only primary outside a cluster).
    fn connection(&self, key: Option<&str>) -> Result<redis::Connection, String> {
        let server = match &self.servers {
            Servers::Single(server) => server,
            Servers::Replicated { primary: Some(primary), .. } => primary,
            Servers::Replicated { replica, .. } => replica,
            Servers::Cluster(cluster) => cluster.node(cluster.owner(key.unwrap_or("any"))),
        };
        server.try_client().map_err(|e| format!("cannot reach the server: {e}"))
    }

    fn driver(&self, step: &Value, field: &str) -> Result<&Driver, String> {
        let name = step[field].as_str().unwrap_or("a");
        self.drivers.get(name).ok_or(format!("no driver {name}"))
    }

    fn since(&self, step: &Value, default: Instant) -> Result<Instant, String> {
        match step["since"].as_str() {
            Some(mark) => self.marks.get(mark).copied().ok_or(format!("no mark {mark}")),
            None => Ok(default),
        }
    }

    fn step(&mut self, step: &Value) -> Result<(), String> {
        let Some(action) = step
            .as_object()
            .and_then(|fields| fields.keys().find(|k| ACTIONS.contains(&k.as_str())))
        else {
            return Err(format!("no action (one of {ACTIONS:?})"));
        };
        let action = action.clone();
        match action.as_str() {
            "call" | "send" => {
                let name = step[action.as_str()].as_str().unwrap_or("a").to_owned();
                let request = substitute(&step["request"], &self.vars);
                let driver = self.drivers.get_mut(&name).ok_or(format!("no driver {name}"))?;
                let sent_at = Instant::now();
                let id = driver.send(request)?;
                let label = step["as"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("#{id}@{name}"));
                self.sent.insert(label.clone(), (name, id, sent_at));
                self.marks.insert(label.clone(), sent_at);
                if action == "call" {
                    self.await_reply(&label, step)?;
                }
                Ok(())
            }
            "await" => {
                let label = step["await"].as_str().unwrap_or_default().to_owned();
                self.await_reply(&label, step)
            }
            "event" => {
                let driver = self.driver(step, "event")?;
                let pattern = substitute(&step["match"], &self.vars);
                let since = self.since(step, Instant::now())?;
                let within = millis(step, "within_ms").unwrap_or(DEFAULT_WITHIN);
                let deadline = since + within;
                let wait = deadline.saturating_duration_since(Instant::now());
                let mut vars = self.vars.clone();
                // Without `not_before_ms`, an event that came before the step's mark counts too.
                let not_before = millis(step, "not_before_ms").map(|after| since + after);
                match driver.event(&pattern, wait, &mut vars) {
                    Some((at, event)) if not_before.is_some_and(|not_before| at < not_before) => {
                        Err(format!(
                            "event {event} came {} ms after its mark, earlier than {} ms",
                            (at - since).as_millis(),
                            millis(step, "not_before_ms").unwrap_or_default().as_millis()
                        ))
                    }
                    Some((at, _)) if at <= deadline => {
                        self.vars = vars;
                        if let Some(mark) = step["as"].as_str() {
                            self.marks.insert(mark.to_owned(), at);
                        }
                        Ok(())
                    }
                    Some((at, event)) => Err(format!(
                        "event {event} came {} ms after its mark, later than {} ms",
                        (at - since).as_millis(),
                        within.as_millis()
                    )),
                    None => {
                        Err(format!("no event matching {pattern} within {} ms", within.as_millis()))
                    }
                }
            }
            "no_event" => {
                let for_ms = millis(step, "for_ms").unwrap_or_default();
                std::thread::sleep(for_ms);
                let driver = self.driver(step, "no_event")?;
                let pattern = substitute(&step["match"], &self.vars);
                match driver.event(&pattern, Duration::ZERO, &mut self.vars.clone()) {
                    Some((_, event)) => Err(format!("unexpected event {event}")),
                    None => Ok(()),
                }
            }
            "sleep_ms" => {
                std::thread::sleep(millis(step, "sleep_ms").unwrap_or_default());
                Ok(())
            }
            "mark" => {
                self.marks
                    .insert(step["mark"].as_str().unwrap_or_default().to_owned(), Instant::now());
                Ok(())
            }
            "pending" => {
                let label = step["pending"].as_str().unwrap_or_default();
                let (name, id, _) =
                    self.sent.get(label).cloned().ok_or(format!("nothing sent as {label}"))?;
                let driver = self.drivers.get(&name).ok_or(format!("no driver {name}"))?;
                match driver.reply(id, Instant::now()) {
                    Some((_, reply)) => Err(format!("{label} was answered too early: {reply}")),
                    None => Ok(()),
                }
            }
            "compare" => {
                let value = substitute(&step["compare"], &self.vars);
                self.check(step, &value)
            }
            "redis" | "info" | "stats" => {
                // A check of the server's state may say how long it has to get there.
                let deadline = Instant::now() + millis(step, "eventually_ms").unwrap_or_default();
                loop {
                    match self.inspect(&action, step) {
                        Err(_) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        done => return done,
                    }
                }
            }
            "server" => self.server(step["server"].as_str().unwrap_or_default()),
            "signal" => {
                let driver = self.driver(step, "driver")?;
                match step["signal"].as_str() {
                    Some("stop") => driver.signal("-STOP"),
                    Some("cont") => driver.signal("-CONT"),
                    other => Err(format!("unknown signal {other:?}")),
                }
            }
            "proxy" => {
                let name = step["driver"].as_str().unwrap_or("a");
                let proxy = self.proxies.get(name).ok_or(format!("driver {name} has no proxy"))?;
                match step["proxy"].as_str() {
                    Some("silence") => proxy.silence_open_connections(),
                    Some("drop_next_reply") => proxy.drop_next_reply(),
                    Some("cut") => proxy.cut(),
                    Some("heal") => proxy.heal(),
                    other => return Err(format!("unknown proxy fault {other:?}")),
                }
                Ok(())
            }
            "move_slot" => self.move_slot(step["move_slot"].as_str().unwrap_or_default()),
            _ => Err(format!("unknown action {action}")),
        }
    }

    /// A check of the server's state: a command's reply, `DLOCK.INFO` as an object, or an
    /// `INFO` section's fields.
    fn inspect(&mut self, action: &str, step: &Value) -> Result<(), String> {
        match action {
            "redis" => {
                let args = substitute(&step["redis"], &self.vars);
                let args: Vec<String> = args
                    .as_array()
                    .ok_or("redis: a list of arguments")?
                    .iter()
                    .map(|arg| arg.as_str().map_or_else(|| arg.to_string(), str::to_owned))
                    .collect();
                let key = step["key"].as_str().or(args.get(1).map(String::as_str));
                let mut con = self.connection(key)?;
                let mut cmd = redis::cmd(&args[0]);
                for arg in &args[1..] {
                    cmd.arg(arg);
                }
                let reply = match cmd.query::<redis::Value>(&mut con) {
                    Ok(value) => json_of(&value),
                    Err(error) => json!({"error": error.to_string()}),
                };
                self.check(step, &reply)
            }
            "info" => {
                let resource = substitute(&step["info"], &self.vars);
                let resource = resource.as_str().unwrap_or_default();
                let mut con = self.connection(Some(resource))?;
                let reply: redis::Value = redis::cmd("DLOCK.INFO")
                    .arg(resource)
                    .query(&mut con)
                    .map_err(|e| format!("DLOCK.INFO: {e}"))?;
                self.check(step, &info_object(&json_of(&reply)))
            }
            "stats" => {
                let section = step["stats"].as_str().unwrap_or("dlock");
                let mut con = self.connection(step["key"].as_str())?;
                let text: String = redis::cmd("INFO")
                    .arg(section)
                    .query(&mut con)
                    .map_err(|e| format!("INFO: {e}"))?;
                let fields: serde_json::Map<String, Value> =
                    info_fields(&text).into_iter().map(|(k, v)| (k, json!(v))).collect();
                self.check(step, &Value::Object(fields))
            }
            _ => Err(format!("not a check: {action}")),
        }
    }

    fn check(&mut self, step: &Value, actual: &Value) -> Result<(), String> {
        let pattern = substitute(&step["match"], &self.vars);
        if step.get("match").is_none() {
            return Ok(());
        }
        matches(&pattern, actual, &mut self.vars).map_err(|why| format!("{why} (whole: {actual})"))
    }

    fn await_reply(&mut self, label: &str, step: &Value) -> Result<(), String> {
        let (name, id, sent_at) =
            self.sent.get(label).cloned().ok_or(format!("nothing sent as {label}"))?;
        let since = self.since(step, sent_at)?;
        let within = millis(step, "within_ms").unwrap_or(DEFAULT_WITHIN);
        let deadline = since + within;
        let driver = self.drivers.get(&name).ok_or(format!("no driver {name}"))?;
        let Some((at, reply)) = driver.reply(id, deadline.max(Instant::now())) else {
            return Err(format!("no reply to {label} within {} ms", within.as_millis()));
        };
        if at > deadline {
            return Err(format!(
                "the reply to {label} came after {} ms: {reply}",
                within.as_millis()
            ));
        }
        if let Some(not_before) = millis(step, "not_before_ms")
            && at < since + not_before
        {
            return Err(format!(
                "the reply to {label} came after {} ms, before {} ms: {reply}",
                (at - since).as_millis(),
                not_before.as_millis()
            ));
        }
        if let Some(mark) = step["mark_as"].as_str() {
            self.marks.insert(mark.to_owned(), at);
        }
        let mut line = reply.clone();
        if let Some(fields) = line.as_object_mut() {
            fields.remove("id");
        }
        self.check(&json!({"match": step["match"]}), &line)
            .map_err(|why| format!("reply to {label}: {why}"))
    }

    fn server(&mut self, action: &str) -> Result<(), String> {
        match (&mut self.servers, action) {
            (Servers::Single(server), "pause") => server.pause(),
            (Servers::Single(server), "resume") => server.resume(),
            (Servers::Single(server), "restart") => server.crash_and_restart(),
            (Servers::Replicated { primary, replica }, "failover") => {
                let old = primary.take().ok_or("failed over already")?;
                // What the replica has is what the failover keeps: wait for the stream first.
                if !wait_until_replica_streams(&old, replica) {
                    return Err("the replica does not stream".to_owned());
                }
                drop(old); // SIGKILL
                let mut con = replica.try_client().map_err(|e| e.to_string())?;
                let _: () = redis::cmd("REPLICAOF")
                    .arg("NO")
                    .arg("ONE")
                    .query(&mut con)
                    .map_err(|e| format!("REPLICAOF NO ONE: {e}"))?;
                for proxy in self.proxies.values() {
                    proxy.retarget(replica.port);
                }
            }
            _ => return Err(format!("server {action:?} is not possible in this topology")),
        }
        Ok(())
    }

    /// Moves the (empty) slot of `key` to another primary: `CLUSTER SETSLOT … NODE` on every
    /// primary, the new owner first. A client that learned the old owner meets `MOVED`.
    fn move_slot(&self, key: &str) -> Result<(), String> {
        let Servers::Cluster(cluster) = &self.servers else {
            return Err("move_slot needs a cluster".to_owned());
        };
        let owner = cluster.owner(key);
        let target = cluster.nodes[..3]
            .iter()
            .map(|n| n.port)
            .find(|&p| p != owner)
            .ok_or("no other primary")?;
        let target_id = cluster.node_id(target);
        let mut con = cluster.node(target).try_client().map_err(|e| e.to_string())?;
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut con)
            .map_err(|e| e.to_string())?;
        for port in std::iter::once(target)
            .chain(cluster.nodes[..3].iter().map(|n| n.port).filter(|&p| p != target))
        {
            let mut con = cluster.node(port).try_client().map_err(|e| e.to_string())?;
            let _: () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&target_id)
                .query(&mut con)
                .map_err(|e| format!("CLUSTER SETSLOT on {port}: {e}"))?;
        }
        let moved =
            dlock_testkit::eventually(Duration::from_secs(10), || cluster.owner(key) == target);
        if moved { Ok(()) } else { Err(format!("slot {slot} did not move")) }
    }
}

/// The step kinds.
const ACTIONS: [&str; 16] = [
    "call",
    "send",
    "await",
    "pending",
    "event",
    "no_event",
    "sleep_ms",
    "mark",
    "compare",
    "redis",
    "info",
    "stats",
    "server",
    "signal",
    "proxy",
    "move_slot",
];

/// A `DLOCK.INFO` reply (RESP2: field, value, …) as an object; nil stays null.
fn info_object(reply: &Value) -> Value {
    match reply.as_array() {
        Some(items) => Value::Object(
            items
                .chunks(2)
                .filter_map(|pair| Some((pair[0].as_str()?.to_owned(), pair.get(1)?.clone())))
                .collect(),
        ),
        None => reply.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scenarios_load_and_there_are_at_least_25() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protocol/conformance");
        let scenarios = load(&dir).expect("scenarios");
        assert!(scenarios.len() >= 25, "{} scenarios", scenarios.len());
        for scenario in &scenarios {
            assert!(!scenario.title.is_empty(), "{}", scenario.name);
        }
    }

    #[test]
    fn a_step_without_an_action_is_refused() {
        let scenario = json!({"name": "x", "title": "t", "steps": [{"calll": "a"}]});
        assert!(parse(&scenario).is_err());
        let scenario = json!({"name": "x", "title": "t", "steps": [{"call": "a", "info": "r"}]});
        assert!(parse(&scenario).is_err());
    }
}
