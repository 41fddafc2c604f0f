//! The mirror checker under the nemesis: at quiet points (after each fault's quiet window, when
//! the replica streams from the primary, and at the end of the run) the replica must hold the
//! primary's leases, fence by fence; at the end of a run with `appendfsync always`, so must a
//! server loaded from a copy of the primary's AOF.
//!
//! A quiet point under load is made by a short `CLIENT PAUSE … WRITE` on the primary (the
//! module decides nothing while writes are paused: no expiry, no hand-over), lifted as soon as
//! both copies are read: once the replica's replication offset equals the primary's, each
//! resource's `DLOCK.INFO` (every holder's token, fence, mode, metadata and ttl left) and
//! `DEBUG DIGEST-VALUE` (tokens, fences, absolute deadlines, modes, metadata) are read on both.
//! A difference must outlast a few such comparisons, each a little later, to count: a lease whose
//! deadline passes between the two reads may show on one side only (it is then at most
//! [`TTL_SLACK_MS`] from its end).
//!
//! The same reads check that every set of resources is whole (`set-atomicity`): a set's token
//! (`s-…-i.j`, see `mixed.rs`) that holds one member holds every member, on the primary and on
//! the replica, after every fault (a failover included). A member near its end is excused as
//! above: a set's members share one deadline, and reads are a moment apart.

use std::thread::sleep;
use std::time::{Duration, Instant};

use dlock_testkit::{Launch, Server, info_value, value_number, value_text};

use crate::check::Finding;
use crate::history::now_ns;

/// How far the ttl left of one lease may differ between two copies read a moment apart, and how
/// close to its end a lease shown by one copy only must be.
const TTL_SLACK_MS: i64 = 250;
/// Comparisons (each after catching up anew) a difference must survive to count.
const ATTEMPTS: usize = 4;
/// The longest write pause one comparison takes (lifted as soon as both copies are read).
const PAUSE_MS: u64 = 1_000;
/// How long the replica may take to reach the primary's offset while writes are paused.
const CATCH_UP: Duration = Duration::from_millis(700);

/// One live lease as `DLOCK.INFO` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Lease {
    token: String,
    fence: u64,
    ttl_ms: i64,
    shared: bool,
    meta: Option<String>,
}

/// One resource on one server.
#[derive(Clone, Debug, Default)]
struct Resource {
    leases: Vec<Lease>,
    waiters: u64,
    tickets: u64,
    /// `DEBUG DIGEST-VALUE` (all zeros without a key); `None` if unread (an AOF copy).
    digest: Option<String>,
}

impl Resource {
    fn describe(&self) -> String {
        let leases: Vec<String> = self
            .leases
            .iter()
            .map(|l| {
                format!(
                    "{}/{}/{}ms/{}{}",
                    l.token,
                    l.fence,
                    l.ttl_ms,
                    if l.shared { "s" } else { "x" },
                    l.meta.as_ref().map(|m| format!("/meta={m}")).unwrap_or_default()
                )
            })
            .collect();
        let digest = self.digest.as_deref().map(|d| format!(" digest={}", &d[..d.len().min(12)]));
        format!(
            "[{}] waiters={} tickets={}{}",
            leases.join(", "),
            self.waiters,
            self.tickets,
            digest.unwrap_or_default()
        )
    }
}

/// What the mirror checker did, for the summary.
#[derive(Clone, Debug, Default)]
pub struct MirrorReport {
    /// Comparisons of the replica that came to a verdict.
    pub replica_checks: usize,
    /// Quiet points skipped: the replica did not stream, or did not catch up while paused.
    pub skipped: usize,
    /// Leases compared on both sides (same fence), and leases seen on one side only near their
    /// end (settling).
    pub holders: usize,
    pub settling: usize,
    /// Digests compared equal (resources with a lock key on both sides).
    pub digests: usize,
    /// Comparisons that differed at first and agreed on a later attempt.
    pub retried: usize,
    /// AOF copies loaded and compared, and their leases compared (same fence).
    pub aof_checks: usize,
    pub aof_holders: usize,
    pub aof_settling: usize,
    /// With `--broken-mirror`: lock keys deleted on the replica, AOF copies taken stale.
    pub broken: usize,
    /// The longest write pause a comparison took (from `CLIENT PAUSE` to `CLIENT UNPAUSE`).
    pub longest_pause_ms: u128,
    /// Sets of resources seen whole (each read of each copy counted), and members seen missing
    /// near their end.
    pub whole_sets: usize,
    pub sets_settling: usize,
}

/// The mirror checker of one run.
pub struct Mirror {
    resources: Vec<String>,
    /// `--broken-mirror` (the self-check): before each comparison a live lock key is deleted on
    /// the replica (made writable), and the AOF copy is taken two seconds early.
    broken: bool,
    pub report: MirrorReport,
    pub findings: Vec<Finding>,
}

/// A connection with timeouts: a comparison must never hang the nemesis.
fn connect(server: &Server) -> Option<redis::Connection> {
    let con = server.try_client().ok()?;
    con.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    con.set_write_timeout(Some(Duration::from_secs(3))).ok()?;
    Some(con)
}

fn replication(con: &mut redis::Connection, field: &str) -> Option<String> {
    let text: String = redis::cmd("INFO").arg("replication").query(con).ok()?;
    info_value(&text, field).map(str::to_owned)
}

/// The replication id and offset a server has reached (a replica: what it applied).
fn position(con: &mut redis::Connection) -> Option<(String, u64)> {
    let text: String = redis::cmd("INFO").arg("replication").query(con).ok()?;
    let id = info_value(&text, "master_replid")?.to_owned();
    let offset = info_value(&text, "master_repl_offset")?.parse().ok()?;
    Some((id, offset))
}

/// A RESP2 `DLOCK.INFO` reply (nil: nothing live, nobody waiting).
fn parse_info(reply: &redis::Value) -> Resource {
    let redis::Value::Array(items) = reply else { return Resource::default() };
    let field = |name: &str| {
        items
            .chunks(2)
            .find(|pair| value_text(&pair[0]).as_deref() == Some(name))
            .map(|pair| &pair[1])
    };
    let mut resource = Resource {
        waiters: field("waiters").map_or(0, value_number) as u64,
        tickets: field("tickets").map_or(0, value_number) as u64,
        ..Resource::default()
    };
    if let Some(redis::Value::Array(leases)) = field("leases") {
        resource.leases = leases
            .iter()
            .filter_map(|lease| match lease {
                redis::Value::Array(parts) if parts.len() == 4 => Some(Lease {
                    token: value_text(&parts[0]).unwrap_or_default(),
                    fence: value_number(&parts[1]) as u64,
                    ttl_ms: value_number(&parts[2]),
                    shared: true,
                    meta: value_text(&parts[3]),
                }),
                _ => None,
            })
            .collect();
    } else if let Some(token) = field("owner").and_then(value_text) {
        resource.leases.push(Lease {
            token,
            fence: field("fence").map_or(0, value_number) as u64,
            ttl_ms: field("ttl-ms").map_or(0, value_number),
            shared: field("mode").and_then(value_text).as_deref() == Some("shared"),
            meta: field("meta").and_then(value_text),
        });
    }
    resource
}

/// Every resource's `DLOCK.INFO` and (with `digests`) `DEBUG DIGEST-VALUE`, in one pipeline.
fn read(con: &mut redis::Connection, resources: &[String], digests: bool) -> Option<Vec<Resource>> {
    let mut pipe = redis::pipe();
    for resource in resources {
        pipe.cmd("DLOCK.INFO").arg(resource);
        if digests {
            pipe.cmd("DEBUG").arg("DIGEST-VALUE").arg(resource);
        }
    }
    let replies: Vec<redis::Value> = pipe.query(con).ok()?;
    let per = if digests { 2 } else { 1 };
    let mut out = Vec::new();
    for chunk in replies.chunks(per) {
        let mut resource = parse_info(&chunk[0]);
        if digests {
            resource.digest = match &chunk[1] {
                redis::Value::Array(values) => values.first().and_then(value_text),
                other => value_text(other),
            };
        }
        out.push(resource);
    }
    (out.len() == resources.len()).then_some(out)
}

/// Counts of one comparison that agreed.
#[derive(Default)]
struct Agreed {
    holders: usize,
    settling: usize,
    digests: usize,
}

/// Whether `copy` holds `primary`'s leases: the same fences with the same token, mode and
/// metadata, and ttl left within [`TTL_SLACK_MS`] once `elapsed_ms` (how much later the copy
/// was read) is added to the copy's; a lease on one side only is allowed within
/// [`TTL_SLACK_MS`] (plus `elapsed_ms` on the primary's side) of its end. With digests on both
/// sides they must be equal, except where the primary keeps a lease-less key for its waiters
/// (during a grant delay; replicas and the AOF drop it: docs/persistence.md).
fn compare(primary: &Resource, copy: &Resource, elapsed_ms: i64) -> Result<Agreed, String> {
    let mut agreed = Agreed::default();
    let mut fences: Vec<u64> = primary.leases.iter().chain(&copy.leases).map(|l| l.fence).collect();
    fences.sort_unstable();
    fences.dedup();
    for fence in fences {
        let a = primary.leases.iter().find(|l| l.fence == fence);
        let b = copy.leases.iter().find(|l| l.fence == fence);
        match (a, b) {
            (Some(a), Some(b)) => {
                let ttl_apart = (a.ttl_ms - (b.ttl_ms + elapsed_ms)).abs();
                if a.token != b.token || a.shared != b.shared || a.meta != b.meta {
                    return Err(format!("fence {fence} is held differently"));
                }
                if ttl_apart > TTL_SLACK_MS {
                    return Err(format!("fence {fence}'s ttl left is {ttl_apart} ms apart"));
                }
                agreed.holders += 1;
            }
            (Some(a), None) if a.ttl_ms <= TTL_SLACK_MS + elapsed_ms => agreed.settling += 1,
            (None, Some(b)) if b.ttl_ms <= TTL_SLACK_MS => agreed.settling += 1,
            (Some(_), None) => return Err(format!("fence {fence} is missing from the copy")),
            (None, Some(_)) => return Err(format!("fence {fence} is not on the primary")),
            (None, None) => unreachable!("each fence comes from one side"),
        }
    }
    if let (Some(a), Some(b)) = (&primary.digest, &copy.digest) {
        let keeps_for_waiters = primary.leases.is_empty() && primary.waiters + primary.tickets > 0;
        if a != b && !keeps_for_waiters {
            return Err("the digests differ".into());
        }
        // A resource without a key on either side has the empty digest: not counted.
        let empty = a.bytes().all(|c| c == b'0');
        agreed.digests += usize::from(!keeps_for_waiters && !empty);
    }
    Ok(agreed)
}

/// Compares two reads of every resource: the counts, or the first difference with both states.
fn compare_all(
    label: &str,
    resources: &[String],
    primary: &[Resource],
    copy: &[Resource],
    elapsed_ms: i64,
) -> Result<Agreed, (String, String)> {
    let mut total = Agreed::default();
    for ((name, a), b) in resources.iter().zip(primary).zip(copy) {
        match compare(a, b, elapsed_ms) {
            Ok(agreed) => {
                total.holders += agreed.holders;
                total.settling += agreed.settling;
                total.digests += agreed.digests;
            }
            Err(why) => {
                let why = why.replace("the copy", label);
                return Err((
                    name.clone(),
                    format!("{why}: primary {}, {label} {}", a.describe(), b.describe()),
                ));
            }
        }
    }
    Ok(total)
}

/// The members of a set's token `s-{worker}-{nonce}-{n}-{i}.{j}…`: `rw:{i}`, `rw:{j}`, …;
/// `None` for any other token.
pub fn set_members(token: &str) -> Option<Vec<String>> {
    let rest = token.strip_prefix("s-")?;
    let members = rest.rsplit('-').next()?;
    members.split('.').map(|i| i.parse::<u32>().ok().map(crate::mixed::rw_resource)).collect()
}

/// Sets seen whole, and members missing near their end, in one read of every resource; or the
/// first set seen in part, with the resource that lacks it.
fn whole_sets(resources: &[String], read: &[Resource]) -> Result<(usize, usize), (String, String)> {
    let lease_of = |name: &str, token: &str| {
        let at = resources.iter().position(|r| r == name)?;
        read.get(at)?.leases.iter().find(|lease| lease.token == token)
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut settling = 0;
    for (name, resource) in resources.iter().zip(read) {
        for lease in &resource.leases {
            let Some(members) = set_members(&lease.token) else { continue };
            if !seen.insert(lease.token.clone()) {
                continue;
            }
            for member in &members {
                if lease_of(member, &lease.token).is_some() {
                    continue;
                }
                if lease.ttl_ms <= TTL_SLACK_MS {
                    settling += 1;
                    continue;
                }
                return Err((
                    member.clone(),
                    format!(
                        "set {} holds {name} (fence {}, {} ms left) but not {member}: {}",
                        lease.token,
                        lease.fence,
                        lease.ttl_ms,
                        members
                            .iter()
                            .map(|m| format!(
                                "{m}: {}",
                                lease_of(m, &lease.token)
                                    .map_or("-".to_owned(), |l| l.fence.to_string())
                            ))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
    }
    Ok((seen.len(), settling))
}

/// Writes paused on the primary until dropped (`CLIENT UNPAUSE`).
struct Paused<'a>(&'a mut redis::Connection);

impl<'a> Paused<'a> {
    fn start(con: &'a mut redis::Connection) -> Option<Self> {
        let paused: redis::RedisResult<()> =
            redis::cmd("CLIENT").arg("PAUSE").arg(PAUSE_MS).arg("WRITE").query(con);
        paused.ok().map(|()| Self(con))
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        let _: redis::RedisResult<()> = redis::cmd("CLIENT").arg("UNPAUSE").query(self.0);
    }
}

/// One attempt's reads: the primary's and the replica's, taken while writes were paused at the
/// same replication offset.
type Reads = (Vec<Resource>, Vec<Resource>);

impl Mirror {
    pub fn new(resources: Vec<String>, broken: bool) -> Self {
        Self { resources, broken, report: MirrorReport::default(), findings: Vec::new() }
    }

    fn note_pause(&mut self, paused_at: Instant) {
        let ms = paused_at.elapsed().as_millis();
        self.report.longest_pause_ms = self.report.longest_pause_ms.max(ms);
    }

    /// Waits (up to 5 s) until the replica streams from the primary: its link is up and the
    /// primary counts it.
    fn streaming(p: &mut redis::Connection, r: &mut redis::Connection) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let up = replication(r, "master_link_status").as_deref() == Some("up");
            let counted = replication(p, "connected_slaves").is_some_and(|n| n != "0");
            if up && counted {
                return true;
            }
            sleep(Duration::from_millis(20));
        }
        false
    }

    /// Pauses writes, waits until the replica reached the primary's offset, reads both.
    fn read_paused(
        &mut self,
        p: &mut redis::Connection,
        r: &mut redis::Connection,
    ) -> Option<Reads> {
        let paused = Paused::start(p)?;
        let target = position(paused.0)?;
        let deadline = Instant::now() + CATCH_UP;
        while position(r)? != target {
            if Instant::now() > deadline {
                return None;
            }
            sleep(Duration::from_millis(2));
        }
        let on_primary = read(paused.0, &self.resources, true)?;
        if self.broken {
            self.break_replica(r, &on_primary);
        }
        let on_replica = read(r, &self.resources, true)?;
        // Nothing reached the replication stream meanwhile: both reads are of one state.
        (position(paused.0)? == target).then_some((on_primary, on_replica))
    }

    /// The self-check's break: deletes, on the replica, a lock key the primary shows a lease on
    /// (far from its end), as if the replica had missed a grant.
    fn break_replica(&mut self, r: &mut redis::Connection, on_primary: &[Resource]) {
        let live = self
            .resources
            .iter()
            .zip(on_primary)
            .find(|(_, res)| res.leases.iter().any(|l| l.ttl_ms > 2 * TTL_SLACK_MS));
        let Some((name, _)) = live else { return };
        let writable: redis::RedisResult<()> =
            redis::cmd("CONFIG").arg("SET").arg("replica-read-only").arg("no").query(r);
        let deleted: redis::RedisResult<i64> = redis::cmd("DEL").arg(name).query(r);
        if writable.is_ok() && deleted == Ok(1) {
            self.report.broken += 1;
        }
    }

    /// Every set whole in one read of `copy` (the primary or the replica), or a finding.
    fn sets_whole(&mut self, read: &[Resource], copy: &str, when: &str) {
        match whole_sets(&self.resources, read) {
            Ok((whole, settling)) => {
                self.report.whole_sets += whole;
                self.report.sets_settling += settling;
            }
            Err((resource, message)) => {
                let at = now_ns();
                self.findings.push(Finding {
                    checker: "set-atomicity",
                    message: format!("on {copy} ({when}): {message}"),
                    resource,
                    from: at,
                    to: at,
                });
            }
        }
    }

    /// At a quiet point (`when`: after which fault, or the run's end): the replica holds the
    /// primary's leases. Skipped (and counted) when the replica does not stream from it.
    pub fn replica(&mut self, primary: &Server, replica: &Server, when: &str) {
        let (Some(mut p), Some(mut r)) = (connect(primary), connect(replica)) else {
            self.report.skipped += 1;
            return;
        };
        if !Self::streaming(&mut p, &mut r) {
            self.report.skipped += 1;
            return;
        }
        let started = now_ns();
        let mut last_difference = None;
        let mut compared = false;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                sleep(Duration::from_millis(30));
            }
            let paused_at = Instant::now();
            let reads = self.read_paused(&mut p, &mut r);
            self.note_pause(paused_at);
            let Some((on_primary, on_replica)) = reads else { continue };
            if !compared {
                // Once per quiet point: a set is whole or not in the first reads.
                self.sets_whole(&on_primary, "the primary", when);
                self.sets_whole(&on_replica, "the replica", when);
            }
            compared = true;
            match compare_all("the replica", &self.resources, &on_primary, &on_replica, 0) {
                Ok(agreed) => {
                    self.report.replica_checks += 1;
                    self.report.holders += agreed.holders;
                    self.report.settling += agreed.settling;
                    self.report.digests += agreed.digests;
                    self.report.retried += usize::from(attempt > 0);
                    return;
                }
                Err(difference) => last_difference = Some(difference),
            }
        }
        match last_difference {
            Some((resource, difference)) => {
                self.report.replica_checks += 1;
                self.findings.push(Finding {
                    checker: "mirror",
                    message: format!(
                        "the replica differs from the primary ({when}), {ATTEMPTS} times caught up: {}",
                        difference
                    ),
                    resource,
                    from: started,
                    to: now_ns(),
                });
            }
            None if !compared => self.report.skipped += 1,
            None => {}
        }
    }

    /// At the end of a run with `appendfsync always`: a server loaded from a copy of the
    /// primary's AOF (taken while writes were paused, with the primary's reads) holds the
    /// primary's leases. Its reads come later by the time it took to start: its ttl left is
    /// counted back by that.
    pub fn aof(&mut self, primary: &Server) {
        let Some(mut p) = connect(primary) else {
            self.report.skipped += 1;
            return;
        };
        let stale = if self.broken {
            self.report.broken += 1;
            let files = aof_files(primary);
            sleep(Duration::from_secs(2));
            Some(files)
        } else {
            None
        };
        let started = now_ns();
        let mut last_difference = None;
        for attempt in 0..ATTEMPTS {
            let paused_at = Instant::now();
            let taken = {
                let Some(paused) = Paused::start(&mut p) else { continue };
                let on_primary = read(paused.0, &self.resources, false);
                let files = aof_files(primary);
                (on_primary, Instant::now(), files)
            };
            self.note_pause(paused_at);
            let (Some(on_primary), read_at, files) = taken else { continue };
            let files = stale.clone().unwrap_or(files);
            let Ok(copy) = files
                .iter()
                .fold(Launch::new(), |launch, (name, bytes)| launch.file(name, bytes))
                .args(&["--save", "", "--appendonly", "yes"])
                .try_start()
            else {
                continue;
            };
            let Some(on_copy) =
                connect(&copy).and_then(|mut c| read(&mut c, &self.resources, false))
            else {
                continue;
            };
            let elapsed_ms = read_at.elapsed().as_millis() as i64;
            match compare_all("the AOF copy", &self.resources, &on_primary, &on_copy, elapsed_ms) {
                Ok(agreed) => {
                    self.report.aof_checks += 1;
                    self.report.aof_holders += agreed.holders;
                    self.report.aof_settling += agreed.settling;
                    self.report.retried += usize::from(attempt > 0);
                    return;
                }
                Err(difference) => last_difference = Some((difference, elapsed_ms)),
            }
        }
        let Some(((resource, difference), elapsed_ms)) = last_difference else {
            self.report.skipped += 1;
            return;
        };
        self.report.aof_checks += 1;
        self.findings.push(Finding {
            checker: "mirror",
            message: format!(
                "a server loaded from the primary's AOF differs from it (at the end, read {elapsed_ms} ms later), {ATTEMPTS} times: {}",
                difference
            ),
            resource,
            from: started,
            to: now_ns(),
        });
    }
}

/// The primary's AOF directory as it is now: each file's name (under `appendonlydir/`) and bytes.
fn aof_files(server: &Server) -> Vec<(String, Vec<u8>)> {
    let dir = server.dir().join("appendonlydir");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if let Ok(bytes) = std::fs::read(&path) {
            files.push((format!("appendonlydir/{name}"), bytes));
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(token: &str, fence: u64, ttl_ms: i64) -> Lease {
        Lease { token: token.into(), fence, ttl_ms, shared: false, meta: None }
    }

    fn resource(leases: Vec<Lease>, digest: &str) -> Resource {
        Resource { leases, waiters: 0, tickets: 0, digest: Some(digest.into()) }
    }

    #[test]
    fn equal_copies_agree_and_a_lease_near_its_end_may_show_on_one_side() {
        let a = resource(vec![lease("w-1", 7, 800), lease("r-2", 8, 100)], "d");
        let b = resource(vec![lease("w-1", 7, 790)], "d");
        let agreed = compare(&a, &b, 0).expect("agree");
        assert_eq!((agreed.holders, agreed.settling, agreed.digests), (1, 1, 1));
    }

    #[test]
    fn a_missing_or_changed_lease_or_digest_is_a_difference() {
        let a = resource(vec![lease("w-1", 7, 800)], "d");
        assert!(compare(&a, &resource(vec![], "d"), 0).is_err(), "missing");
        assert!(compare(&a, &resource(vec![lease("w-2", 7, 800)], "d"), 0).is_err(), "owner");
        assert!(compare(&a, &resource(vec![lease("w-1", 7, 400)], "d"), 0).is_err(), "ttl");
        let mut shared = lease("w-1", 7, 800);
        shared.shared = true;
        assert!(compare(&a, &resource(vec![shared], "d"), 0).is_err(), "mode");
        let mut meta = lease("w-1", 7, 800);
        meta.meta = Some("host=a".into());
        assert!(compare(&a, &resource(vec![meta], "d"), 0).is_err(), "meta");
        assert!(compare(&a, &resource(vec![lease("w-1", 7, 800)], "e"), 0).is_err(), "digest");
        assert!(compare(&resource(vec![], "d"), &a, 0).is_err(), "extra");
    }

    #[test]
    fn a_later_copy_is_counted_back_and_a_key_kept_for_waiters_is_no_difference() {
        let a = resource(vec![lease("w-1", 7, 800)], "d");
        assert!(compare(&a, &resource(vec![lease("w-1", 7, 500)], "d"), 300).is_ok());
        let waiting = Resource { waiters: 2, ..resource(vec![], "d") };
        assert!(compare(&waiting, &resource(vec![], "z"), 0).is_ok());
    }

    #[test]
    fn a_set_holding_one_member_but_not_another_is_partial_unless_near_its_end() {
        let names: Vec<String> = (0..3).map(crate::mixed::rw_resource).collect();
        let set = "s-1-ab-7-0.2";
        assert_eq!(set_members(set), Some(vec![names[0].clone(), names[2].clone()]));
        assert_eq!(set_members("w-1-ab-7"), None);
        let held = |ttl| resource(vec![lease(set, 5, ttl)], "");
        let free = resource(vec![], "");
        let whole = [held(900), free.clone(), held(900)];
        assert_eq!(whole_sets(&names, &whole), Ok((1, 0)));
        let partial = [held(900), free.clone(), free.clone()];
        let Err((resource, message)) = whole_sets(&names, &partial) else { panic!("partial") };
        assert_eq!(resource, names[2]);
        assert!(message.contains("but not rw:{2}"), "{message}");
        let ending = [held(TTL_SLACK_MS), free.clone(), free];
        assert_eq!(whole_sets(&names, &ending), Ok((1, 1)));
    }
}
