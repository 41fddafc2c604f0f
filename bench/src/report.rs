//! The results as a markdown table, printed as it grows and written to `BENCH_OUT`.

use std::fmt::Write as _;
use std::thread;

use dlock_testkit::{Server, info_value};

use crate::harness::Result;

/// The markdown table, printed as it grows and written to `BENCH_OUT` at the end.
pub struct Report {
    text: String,
}

impl Report {
    pub fn new(server: &Server) -> Result<Self> {
        let mut con = server.try_client()?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut con)?;
        let version = info_value(&info, "redis_version").unwrap_or("?");
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| {
                c.lines()
                    .find_map(|l| l.strip_prefix("model name"))
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
            .unwrap_or_else(|| "unknown CPU".to_owned());
        let cores = thread::available_parallelism().map_or(0, |n| n.get());
        let mut text = String::from("# dlock benchmark results\n\n");
        let _ = writeln!(
            text,
            "Machine: {cores} cores, {cpu}; Redis {version}; benchmark clients on the same machine.\n\
             Every figure in a table was measured in the same run on the same server: read the ratios.\n"
        );
        let mut settings: Vec<String> = std::env::vars()
            .filter(|(name, _)| name.starts_with("BENCH_") || name == "DLOCK_MODULE")
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        settings.sort();
        let args: Vec<String> = std::env::args().collect();
        let _ = writeln!(
            text,
            "Command: `{}{}` (unset settings take their defaults, see `bench/src/main.rs`).\n",
            settings.iter().map(|s| format!("{s} ")).collect::<String>(),
            args.join(" ")
        );
        print!("{text}");
        Ok(Self { text })
    }

    fn push(&mut self, line: &str) {
        println!("{line}");
        self.text.push_str(line);
        self.text.push('\n');
    }

    pub fn section(&mut self, title: &str) {
        self.push(&format!("\n## {title}\n"));
    }

    pub fn header(&mut self, columns: &[&str]) {
        self.push(&format!("| {} |", columns.join(" | ")));
        self.push(&format!("|{}", "---|".repeat(columns.len())));
    }

    pub fn row(&mut self, cells: &[String]) {
        self.push(&format!("| {} |", cells.join(" | ")));
    }

    pub fn note(&mut self, line: &str) {
        self.push(&format!("\n{line}"));
    }

    pub fn finish(self) -> Result<()> {
        let out = std::env::var("BENCH_OUT")
            .unwrap_or_else(|_| format!("{}/results.md", env!("CARGO_MANIFEST_DIR")));
        std::fs::write(&out, &self.text)?;
        println!("\nwritten to {out}");
        Ok(())
    }
}

/// A rate, whole.
pub fn fmt_rate(rate: f64) -> String {
    format!("{rate:.0}")
}

/// The cells a comparison row ends with: the rates of SET NX PX, the Lua script and dlock, then
/// dlock's ratio to each of the other two.
pub fn versus(set: f64, lua: f64, dlock: f64) -> [String; 5] {
    [fmt_rate(set), fmt_rate(lua), fmt_rate(dlock), ratio(dlock, set), ratio(dlock, lua)]
}

/// `a / b` as `1.23×`.
pub fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 { format!("{:.2}×", a / b) } else { "n/a".to_owned() }
}

/// The `p`th percentile of sorted values (0 when there are none).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}
