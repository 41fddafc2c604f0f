//! `dlock`: the operator's tools for a dlock server.
//!
//! `dlock top [--url URL] [--by waiters|held-ms|handovers] [--count N] [--interval SECONDS]
//! [--iterations N]` shows the locks that hurt most (`DLOCK.TOP`), refreshed every `--interval`
//! seconds (1 by default) until interrupted, or `--iterations` times: the holder and its
//! metadata, how long it has held, the line, the hand-overs and the 99th percentiles of waits
//! and holds, under a header with the server's totals (`INFO dlock`). On a terminal each frame
//! replaces the last, as `top` does; otherwise frames follow each other, separated by a blank
//! line. Exits 1 with a message naming the problem when the server cannot be reached or refuses.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use redis::aio::MultiplexedConnection;

const USAGE: &str = "usage: dlock top [--url URL] [--by waiters|held-ms|handovers] [--count N] \
                     [--interval SECONDS] [--iterations N]";

struct Options {
    url: String,
    by: String,
    count: u32,
    interval: Duration,
    iterations: Option<u64>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        url: "redis://127.0.0.1:6379/".to_owned(),
        by: "waiters".to_owned(),
        count: 20,
        interval: Duration::from_secs(1),
        iterations: None,
    };
    let mut rest = args.iter();
    match rest.next().map(String::as_str) {
        Some("top") => {}
        Some("-h" | "--help") | None => return Err(USAGE.to_owned()),
        Some(other) => return Err(format!("dlock: unknown command {other:?}\n{USAGE}")),
    }
    while let Some(flag) = rest.next() {
        let mut value = || rest.next().ok_or_else(|| format!("dlock top: {flag} needs a value"));
        match flag.as_str() {
            "--url" => options.url = value()?.clone(),
            "--by" => {
                let by = value()?.to_ascii_lowercase();
                if !matches!(by.as_str(), "waiters" | "held-ms" | "handovers") {
                    return Err(format!(
                        "dlock top: --by must be waiters, held-ms or handovers, got {by:?}"
                    ));
                }
                options.by = by;
            }
            "--count" => {
                let text = value()?;
                options.count =
                    text.parse().ok().filter(|n| (1..=1_000).contains(n)).ok_or_else(|| {
                        format!("dlock top: --count must be 1 to 1000, got {text:?}")
                    })?;
            }
            "--interval" => {
                let text = value()?;
                let seconds: f64 = text
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.05 && *s <= 3_600.0)
                    .ok_or_else(|| {
                        format!("dlock top: --interval must be 0.05 to 3600 seconds, got {text:?}")
                    })?;
                options.interval = Duration::from_secs_f64(seconds);
            }
            "--iterations" => {
                let text = value()?;
                options.iterations =
                    Some(text.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                        format!("dlock top: --iterations must be a positive integer, got {text:?}")
                    })?);
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("dlock top: unknown option {other:?}\n{USAGE}")),
        }
    }
    Ok(options)
}

/// One lock of the view.
#[derive(Default)]
struct Row {
    fields: Vec<(String, String)>,
}

impl Row {
    fn get(&self, name: &str) -> &str {
        self.fields.iter().find(|(n, _)| n == name).map_or("", |(_, v)| v.as_str())
    }
}

fn text(value: &redis::Value) -> String {
    match value {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::Int(n) => n.to_string(),
        redis::Value::Nil => "-".to_owned(),
        other => format!("{other:?}"),
    }
}

fn rows(reply: &redis::Value) -> Vec<Row> {
    let redis::Value::Array(entries) = reply else { return Vec::new() };
    entries
        .iter()
        .map(|entry| match entry {
            redis::Value::Array(items) => Row {
                fields: items.chunks(2).map(|pair| (text(&pair[0]), text(&pair[1]))).collect(),
            },
            redis::Value::Map(items) => {
                Row { fields: items.iter().map(|(k, v)| (text(k), text(v))).collect() }
            }
            _ => Row::default(),
        })
        .collect()
}

/// Milliseconds as a person reads them: `850ms`, `12.4s`, `3m05s`, `2h01m`.
fn millis(ms: &str) -> String {
    let Ok(ms) = ms.parse::<u64>() else { return ms.to_owned() };
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1_000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1_000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// Microseconds likewise (`-` for none).
fn micros(us: &str) -> String {
    match us.parse::<u64>() {
        Ok(0) => "-".to_owned(),
        Ok(us) if us < 1_000 => format!("{us}us"),
        Ok(us) => millis(&(us / 1_000).to_string()),
        Err(_) => us.to_owned(),
    }
}

/// The server's totals for the header, from `INFO dlock`.
fn totals(info: &str) -> String {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix("dlock_")?.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or("?")
            .trim()
            .to_owned()
    };
    format!(
        "locks {}  waiters {}  tickets {}  granted {}  expired {}  revoked {}  wait p99 {}",
        field("lock_keys"),
        field("waiters"),
        field("tickets"),
        field("acquire_granted"),
        field("leases_expired"),
        field("leases_revoked"),
        micros(&field("wait_time_us_p99")),
    )
}

/// One frame of the view, as printed.
fn frame(url: &str, by: &str, info: &str, rows: &[Row]) -> String {
    let header = [
        "RESOURCE",
        "MODE",
        "HOLDERS",
        "OWNER",
        "META",
        "FENCE",
        "HELD",
        "TTL",
        "LINE",
        "HANDOVERS",
        "WAIT-P99",
        "HOLD-P99",
    ];
    let mut table: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for row in rows {
        table.push(vec![
            row.get("resource").to_owned(),
            row.get("mode").to_owned(),
            row.get("holders").to_owned(),
            row.get("owner").to_owned(),
            row.get("meta").to_owned(),
            row.get("fence").to_owned(),
            millis(row.get("held-ms")),
            millis(row.get("ttl-ms")),
            row.get("line").to_owned(),
            row.get("handovers").to_owned(),
            micros(row.get("wait-p99-us")),
            micros(row.get("hold-p99-us")),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|column| table.iter().map(|line| line[column].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = format!("dlock top - {url} - by {by}\n{}\n\n", totals(info));
    for line in &table {
        let cells: Vec<String> =
            line.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    if rows.is_empty() {
        out.push_str("(no lock anyone waited for)\n");
    }
    out
}

async fn show(con: &mut MultiplexedConnection, options: &Options) -> Result<String, String> {
    let reply: redis::Value = redis::cmd("DLOCK.TOP")
        .arg("BY")
        .arg(&options.by)
        .arg("COUNT")
        .arg(options.count)
        .query_async(con)
        .await
        .map_err(|e| format!("dlock top: DLOCK.TOP failed: {e}"))?;
    let info: String = redis::cmd("INFO")
        .arg("dlock")
        .query_async(con)
        .await
        .map_err(|e| format!("dlock top: INFO dlock failed: {e}"))?;
    Ok(frame(&options.url, &options.by, &info, &rows(&reply)))
}

async fn top(options: Options) -> Result<(), String> {
    let client = redis::Client::open(options.url.as_str())
        .map_err(|e| format!("dlock top: bad --url {:?}: {e}", options.url))?;
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("dlock top: cannot reach {}: {e}", options.url))?;
    let terminal = std::io::stdout().is_terminal();
    let mut shown = 0u64;
    loop {
        let view = show(&mut con, &options).await?;
        let mut out = std::io::stdout().lock();
        let separator = match (terminal, shown) {
            (true, _) => "\x1b[H\x1b[2J",
            (false, 0) => "",
            (false, _) => "\n",
        };
        write!(out, "{separator}{view}").and_then(|()| out.flush()).map_err(|e| e.to_string())?;
        shown += 1;
        if options.iterations.is_some_and(|n| shown >= n) {
            return Ok(());
        }
        tokio::time::sleep(options.interval).await;
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("dlock: {e}");
            std::process::exit(1);
        }
    };
    if let Err(message) = runtime.block_on(top(options)) {
        eprintln!("{message}");
        std::process::exit(1);
    }
}
