//! `INFO` and `CLUSTER INFO` text: `field:value` lines, section headers and blank lines between.

use std::collections::BTreeMap;
use std::time::Duration;

use super::eventually;

/// The value of `field` in INFO-style text, trimmed.
pub fn info_value<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines().find_map(|line| line.strip_prefix(field)?.strip_prefix(':')).map(str::trim)
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
