//! `INFO` and `CLUSTER INFO` text: `field:value` lines, section headers and blank lines between.

use std::collections::BTreeMap;
use std::time::Duration;

use super::eventually;

/// The value of `field` in INFO-style text, trimmed.
pub fn info_value<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines().find_map(|line| line.strip_prefix(field)?.strip_prefix(':')).map(str::trim)
}

/// How many calls of `command` (lower case, e.g. `dlock.acquire`) `INFO commandstats` text
/// counts (0 when the server has run none).
pub fn command_calls(commandstats: &str, command: &str) -> u64 {
    info_value(commandstats, &format!("cmdstat_{command}"))
        .and_then(|stats| stats.strip_prefix("calls=")?.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Every `field:value` line of INFO-style text, values trimmed.
pub fn info_fields(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(field, value)| (field.to_owned(), value.trim().to_owned()))
        .collect()
}

/// The value of `field` in `INFO section`.
pub fn info_line(con: &mut redis::Connection, section: &str, field: &str) -> Option<String> {
    let text: String = redis::cmd("INFO").arg(section).query(con).expect("INFO");
    info_value(&text, field).map(str::to_owned)
}

/// `CLUSTER INFO` as a map.
pub fn cluster_info(con: &mut redis::Connection) -> BTreeMap<String, String> {
    let text: String = redis::cmd("CLUSTER").arg("INFO").query(con).expect("CLUSTER INFO");
    info_fields(&text)
}

/// Waits until no AOF rewrite or RDB save runs.
pub fn wait_for_background_persistence(con: &mut redis::Connection) {
    let idle = |con: &mut redis::Connection| {
        ["aof_rewrite_in_progress", "aof_rewrite_scheduled", "rdb_bgsave_in_progress"]
            .iter()
            .all(|field| info_line(con, "persistence", field).as_deref() == Some("0"))
    };
    assert!(
        eventually(Duration::from_secs(20), || idle(con)),
        "background persistence did not finish"
    );
}

/// `INFO dlock` as (field without the `dlock_` prefix, value): every field but `version` (text).
pub fn dlock_counters(con: &mut redis::Connection) -> BTreeMap<String, u64> {
    let text: String = redis::cmd("INFO").arg("dlock").query(con).expect("INFO dlock");
    text.lines()
        .filter_map(|line| line.strip_prefix("dlock_")?.split_once(':'))
        .filter(|(name, _)| *name != "version")
        .map(|(name, value)| (name.to_owned(), value.trim().parse().expect("integer field")))
        .collect()
}

/// The two identities docs/operations.md states, on one reading of [`dlock_counters`]:
///
/// - `waits_started = waits_granted + waits_timed_out + waits_abandoned + waiters`: every blocked
///   wait ended in exactly one counter, or still waits;
/// - `tickets_queued = tickets_granted + tickets_lapsed + tickets_withdrawn + tickets_dismissed
///   + tickets`: every ticket left its line in exactly one counter, or still stands.
///
/// `Err` says which one does not hold, with both sides and every counter.
pub fn counters_add_up(stats: &BTreeMap<String, u64>) -> Result<(), String> {
    let field = |name: &str| -> Result<u64, String> {
        stats.get(name).copied().ok_or_else(|| format!("INFO dlock has no {name}: {stats:?}"))
    };
    let sum = |names: &[&str]| -> Result<u64, String> {
        names.iter().map(|name| field(name)).sum::<Result<u64, String>>()
    };
    let identities: [(&str, &[&str]); 2] = [
        ("waits_started", &["waits_granted", "waits_timed_out", "waits_abandoned", "waiters"]),
        (
            "tickets_queued",
            &[
                "tickets_granted",
                "tickets_lapsed",
                "tickets_withdrawn",
                "tickets_dismissed",
                "tickets",
            ],
        ),
    ];
    for (total, parts) in identities {
        let (left, right) = (field(total)?, sum(parts)?);
        if left != right {
            return Err(format!(
                "{total} = {left}, but {} = {right}: {stats:?}",
                parts.join(" + ")
            ));
        }
    }
    Ok(())
}
