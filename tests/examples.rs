//! Every redis-cli transcript in `README.md`, `docs/*.md` and `docs/commands/*.md` replays against
//! a real server, in page order, and answers as printed.
//!
//! What counts as a transcript: a fenced code block without a language whose first line is a
//! redis-cli prompt (`127.0.0.1:6379> …`), a shell line `$ redis-cli …`, or a two-client header
//! (`# client 1   # client 2`). Each page gets a fresh server (`Server::start()`); its blocks run in
//! order on it, so one block sees what the blocks above it left behind.
//!
//! How replies are compared (after trimming trailing spaces), the mask rules:
//! - **Fences.** Any integer of 13 or more digits in a command or a reply stands for a value of
//!   this run: the first reply that shows a printed number binds it to the number the server sent,
//!   and every later use (in a command or a reply) must be that same number. Different printed
//!   numbers must bind to different values, in the same order (a larger printed fence must be a
//!   larger fence in the replay too). A number never bound is sent as printed.
//! - **Times.** The integer after `"ttl-ms"` or `"held-ms"` (the next line in RESP2, the same line
//!   after `=>` in RESP3), and the third element of a shared lease in `leases` (`3) (integer) …`
//!   right after its fence), matches within ±1500 ms of the printed one.
//! - **Elapsed time.** A `(2.00s)` line (redis-cli prints one after a command that took 0.5 s or
//!   more) requires the command to have taken at least that long, less 50 ms; nothing else.
//! - Everything else matches exactly, formatted as redis-cli 7 prints it in a terminal (`INFO` as
//!   raw text; `the_replay_prints_replies_exactly_as_redis_cli_does` holds the formatting to the real
//!   `redis-cli --no-raw`, in RESP2 and RESP3; blank
//!   lines are ignored everywhere).
//!
//! Two-client transcripts: a line indented by 20 spaces or more belongs to client 2 (the column's
//! own indentation is removed), any other line to client 1. A command followed by `(blocks)` is sent
//! and must block in `DLOCK.ACQUIRE … WAIT` (the server's `dlock_waits_started` grows); the
//! column's next reply lines are that command's reply, awaited when the replay reaches them.
//!
//! HTML comments in the markdown steer the replay, each on a line of its own:
//! - `<!-- replay: skip (why) -->`: the next code block is not replayed. Keep them few and honest.
//! - `<!-- replay: sleep 300 -->`: wait 300 ms here (the story says time passes).
//! - `<!-- replay: server --appendonly yes -->`: from here on, a fresh server with these arguments.
//! - `<!-- replay: resp3 -->`: the next block's clients speak RESP3 (`redis-cli -3`).
//! - `<!-- replay: aof -->`: the next code block is the decoded newest AOF increment file (one
//!   command per line, arguments separated by spaces); it must match within 10 s.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::{Duration, Instant};

use dlock_testkit::*;

/// Tolerance for `ttl-ms` and `held-ms`.
const TIME_SLACK_MS: i64 = 1500;
/// How long a command may take to answer (waits in the docs are shorter).
const REPLY_DEADLINE: Duration = Duration::from_secs(30);
/// Digits from which an integer is a fence (or another Unix-microsecond value).
const FENCE_DIGITS: usize = 13;

fn project() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------------------------
// The page, as a list of things to do.

#[derive(Debug)]
enum Item {
    Sleep(u64),
    Server(Vec<String>),
    Transcript { line: usize, resp3: bool, steps: Vec<Step> },
    Aof { line: usize, expected: Vec<String> },
}

#[derive(Debug)]
enum Step {
    /// Send `command` as `client`; without `blocks`, its reply is `expected`.
    Send {
        line: usize,
        client: usize,
        command: String,
        blocks: bool,
        expected: Vec<String>,
        min_elapsed: Option<Duration>,
    },
    /// The reply of `client`'s blocked command.
    Await { line: usize, client: usize, expected: Vec<String>, min_elapsed: Option<Duration> },
}

impl Step {
    fn client(&self) -> usize {
        match self {
            Step::Send { client, .. } | Step::Await { client, .. } => *client,
        }
    }
}

/// A directive's text, if `line` is `<!-- replay: … -->`.
fn directive(line: &str) -> Option<&str> {
    line.trim().strip_prefix("<!-- replay:")?.strip_suffix("-->").map(str::trim)
}

fn is_prompt(text: &str) -> Option<&str> {
    if let Some(rest) = text.strip_prefix("$ redis-cli ") {
        return Some(rest);
    }
    let rest = text.strip_prefix("127.0.0.1:")?;
    rest.split_once("> ").map(|(_, command)| command)
}

fn elapsed_line(text: &str) -> Option<Duration> {
    let seconds = text.strip_prefix('(')?.strip_suffix("s)")?;
    seconds.parse::<f64>().ok().map(Duration::from_secs_f64)
}

fn parse_page(page: &str) -> Vec<Item> {
    let mut items = Vec::new();
    let (mut skip, mut resp3, mut aof) = (false, false, false);
    let mut lines = page.lines().enumerate();
    while let Some((index, line)) = lines.next() {
        if let Some(text) = directive(line) {
            let (word, rest) = text.split_once(' ').unwrap_or((text, ""));
            match word {
                "skip" => skip = true,
                "resp3" => resp3 = true,
                "aof" => aof = true,
                "sleep" => items.push(Item::Sleep(rest.trim().parse().expect("sleep <ms>"))),
                "server" => {
                    items.push(Item::Server(rest.split_whitespace().map(str::to_owned).collect()))
                }
                other => panic!("line {}: unknown replay directive {other:?}", index + 1),
            }
            continue;
        }
        let Some(info) = line.trim_start().strip_prefix("```") else { continue };
        let mut block = Vec::new();
        for (_, inner) in lines.by_ref() {
            if inner.trim_start().starts_with("```") {
                break;
            }
            block.push(inner);
        }
        let start = index + 2;
        if std::mem::take(&mut skip) {
            resp3 = false;
            aof = false;
            continue;
        }
        if std::mem::take(&mut aof) {
            let expected = block.iter().map(|l| l.trim_end().to_owned()).collect();
            items.push(Item::Aof { line: start, expected });
            continue;
        }
        let first = block.first().map(|l| l.trim()).unwrap_or_default();
        let transcript =
            info.trim().is_empty() && (is_prompt(first).is_some() || first.starts_with("# client"));
        if transcript {
            let steps = parse_transcript(&block, start);
            items.push(Item::Transcript { line: start, resp3: std::mem::take(&mut resp3), steps });
        }
    }
    items
}

fn parse_transcript(block: &[&str], first_line: usize) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut column_two: Option<usize> = None;
    for (offset, raw) in block.iter().enumerate() {
        let line = first_line + offset;
        if raw.trim().is_empty() || raw.trim_start().starts_with("# client") {
            continue;
        }
        let indent = raw.len() - raw.trim_start().len();
        let (client, text) = if indent >= 20 {
            let column = *column_two.get_or_insert(indent);
            (1, raw.get(column..).unwrap_or(raw.trim_start()).trim_end())
        } else {
            (0, raw.trim_end())
        };
        if let Some(command) = is_prompt(text.trim_start()) {
            steps.push(Step::Send {
                line,
                client,
                command: command.to_owned(),
                blocks: false,
                expected: Vec::new(),
                min_elapsed: None,
            });
            continue;
        }
        if text.trim() == "(blocks)" {
            match steps.last_mut() {
                Some(Step::Send { client: c, blocks, .. }) if *c == client => *blocks = true,
                _ => panic!("line {line}: (blocks) must follow the client's command"),
            }
            continue;
        }
        if let Some(elapsed) = elapsed_line(text.trim()) {
            let step = steps.iter_mut().rev().find(|s| s.client() == client);
            match step {
                Some(Step::Send { min_elapsed, .. } | Step::Await { min_elapsed, .. }) => {
                    *min_elapsed = Some(elapsed)
                }
                None => panic!("line {line}: elapsed time before any command"),
            }
            continue;
        }
        match steps.last_mut() {
            Some(Step::Send { client: c, blocks: false, expected, .. })
            | Some(Step::Await { client: c, expected, .. })
                if *c == client =>
            {
                expected.push(text.to_owned())
            }
            _ => steps.push(Step::Await {
                line,
                client,
                expected: vec![text.to_owned()],
                min_elapsed: None,
            }),
        }
    }
    steps
}

/// Splits a redis-cli command line into arguments (double quotes group, as redis-cli reads them).
fn split_command(command: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut current = String::new();
    let (mut quoted, mut any) = (false, false);
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            '\\' if quoted => current.extend(chars.next()),
            ' ' if !quoted => {
                if any || !current.is_empty() {
                    args.push(std::mem::take(&mut current));
                }
                any = false;
            }
            c => current.push(c),
        }
    }
    if any || !current.is_empty() {
        args.push(current);
    }
    args
}

// ---------------------------------------------------------------------------------------------
// Replies as redis-cli 7 prints them.

fn repr(bytes: &[u8]) -> String {
    let mut out = String::from("\"");
    for &b in bytes {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'"' => out.push_str("\\\""),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x07 => out.push_str("\\a"),
            0x08 => out.push_str("\\b"),
            0x20..=0x7e => out.push(b as char),
            other => out.push_str(&format!("\\x{other:02x}")),
        }
    }
    out.push('"');
    out
}

fn format_value(value: &redis::Value, prefix: &str) -> String {
    use redis::Value;
    match value {
        Value::Nil => "(nil)\n".into(),
        Value::Int(n) => format!("(integer) {n}\n"),
        Value::BulkString(bytes) => format!("{}\n", repr(bytes)),
        Value::SimpleString(s) => format!("{s}\n"),
        Value::Okay => "OK\n".into(),
        Value::Double(d) => format!("(double) {d}\n"),
        Value::Boolean(b) => format!("({b})\n"),
        Value::ServerError(e) => match e.details() {
            Some(detail) => format!("(error) {} {detail}\n", e.code()),
            None => format!("(error) {}\n", e.code()),
        },
        Value::Array(items) | Value::Set(items) => {
            let sep = if matches!(value, Value::Set(_)) { '~' } else { ')' };
            format_aggregate(items.iter().map(|v| (v, None)).collect(), sep, prefix, false)
        }
        Value::Map(pairs) => {
            format_aggregate(pairs.iter().map(|(k, v)| (k, Some(v))).collect(), '#', prefix, false)
        }
        other => format!("{other:?}\n"),
    }
}

/// An array, set or map; `prefix_first`: the first entry is indented too (a map's value).
fn format_aggregate(
    entries: Vec<(&redis::Value, Option<&redis::Value>)>,
    sep: char,
    prefix: &str,
    prefix_first: bool,
) -> String {
    if entries.is_empty() {
        let what = match sep {
            '#' => "(empty hash)",
            '~' => "(empty set)",
            _ => "(empty array)",
        };
        return format!("{what}\n");
    }
    let width = entries.len().to_string().len();
    let inner = format!("{prefix}{}", " ".repeat(width + 2));
    let mut out = String::new();
    for (i, (entry, value)) in entries.into_iter().enumerate() {
        let lead = if i == 0 && !prefix_first { "" } else { prefix };
        out.push_str(&format!("{lead}{:>width$}{sep} ", i + 1));
        out.push_str(&format_value(entry, &inner));
        if let Some(value) = value {
            out.pop();
            out.push_str(" => ");
            // redis-cli 7 prints a value that takes one line on the key's line, and starts one
            // that takes more (an aggregate of several entries, or of one that is itself
            // several) on a line of its own.
            let inline = format_value(value, &inner);
            out.push_str(&match value {
                redis::Value::Array(items) | redis::Value::Set(items)
                    if inline.trim_end().contains('\n') =>
                {
                    let sep = if matches!(value, redis::Value::Set(_)) { '~' } else { ')' };
                    let entries = items.iter().map(|v| (v, None)).collect();
                    format!("\n{}", format_aggregate(entries, sep, &inner, true))
                }
                redis::Value::Map(pairs) if inline.trim_end().contains('\n') => {
                    let entries = pairs.iter().map(|(k, v)| (k, Some(v))).collect();
                    format!("\n{}", format_aggregate(entries, '#', &inner, true))
                }
                _ => inline,
            });
        }
    }
    out
}

fn format_reply(reply: &redis::RedisResult<redis::Value>) -> Vec<String> {
    let text = match reply {
        Ok(value) => format_value(value, ""),
        Err(error) => match (error.code(), error.detail()) {
            (Some(code), Some(detail)) => format!("(error) {code} {detail}\n"),
            (Some(code), None) => format!("(error) {code}\n"),
            _ => format!("(error) {error}\n"),
        },
    };
    text.lines().map(|l| l.trim_end().to_owned()).collect()
}

// ---------------------------------------------------------------------------------------------
// Matching with the mask rules.

/// Printed fence-like numbers and the values they stand for in this run.
#[derive(Clone, Default)]
struct Bindings(Vec<(u64, u64)>);

impl Bindings {
    fn actual(&self, printed: u64) -> Option<u64> {
        self.0.iter().find(|(p, _)| *p == printed).map(|(_, a)| *a)
    }

    fn bind(&mut self, printed: u64, actual: u64) -> Result<(), String> {
        if let Some(bound) = self.actual(printed) {
            return if bound == actual {
                Ok(())
            } else {
                Err(format!("{printed} stands for {bound} in this replay, got {actual}"))
            };
        }
        for &(p, a) in &self.0 {
            if a == actual {
                return Err(format!("{printed} and {p} are printed apart but are both {actual}"));
            }
            if (printed < p) != (actual < a) {
                return Err(format!(
                    "printed {printed} vs {p} are in the other order than the replay's {actual} vs {a}"
                ));
            }
        }
        self.0.push((printed, actual));
        Ok(())
    }

    /// The command with every bound number replaced by its value in this run.
    fn substitute(&self, args: Vec<String>) -> Vec<String> {
        args.into_iter()
            .map(|arg| match arg.parse::<u64>() {
                Ok(n) if arg.len() >= FENCE_DIGITS => {
                    self.actual(n).map_or(arg, |actual| actual.to_string())
                }
                _ => arg,
            })
            .collect()
    }
}

/// `text` as alternating non-digit and digit runs.
fn pieces(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    for i in 1..=bytes.len() {
        if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
            out.push(&text[start..i]);
            start = i;
        }
    }
    out
}

fn is_time_label(line: &str) -> bool {
    let line = line.trim_end();
    line.ends_with("\"ttl-ms\"") || line.ends_with("\"held-ms\"")
}

/// `3) (integer) …` right after `2) (integer) <fence>`: a shared lease's ttl-ms in `leases`.
fn is_lease_ttl(previous: &str, line: &str) -> bool {
    let fence = previous.trim().strip_prefix("2) (integer) ");
    fence.is_some_and(|f| f.len() >= FENCE_DIGITS && f.bytes().all(|b| b.is_ascii_digit()))
        && line.trim().starts_with("3) (integer) ")
}

fn match_line(
    expected: &str,
    actual: &str,
    time_field: bool,
    bindings: &mut Bindings,
) -> Result<(), String> {
    let (e, a) = (pieces(expected), pieces(actual));
    let mismatch = || format!("expected {expected:?}\n          got {actual:?}");
    if e.len() != a.len() {
        return Err(mismatch());
    }
    let last_number = e.iter().rposition(|p| p.as_bytes()[0].is_ascii_digit());
    for (i, (ep, ap)) in e.iter().zip(&a).enumerate() {
        let digits = ep.as_bytes()[0].is_ascii_digit();
        if !digits || !ap.as_bytes()[0].is_ascii_digit() {
            if ep != ap {
                return Err(mismatch());
            }
        } else if time_field && Some(i) == last_number {
            let (en, an): (i64, i64) = (ep.parse().unwrap_or(0), ap.parse().unwrap_or(-1));
            if (en - an).abs() > TIME_SLACK_MS {
                return Err(format!(
                    "{} (times differ by more than {TIME_SLACK_MS} ms)",
                    mismatch()
                ));
            }
        } else if ep.len() >= FENCE_DIGITS {
            let (Ok(en), Ok(an)) = (ep.parse(), ap.parse()) else { return Err(mismatch()) };
            bindings.bind(en, an).map_err(|why| format!("{}: {why}", mismatch()))?;
        } else if ep != ap {
            return Err(mismatch());
        }
    }
    Ok(())
}

fn match_reply(
    expected: &[String],
    actual: &[String],
    bindings: &mut Bindings,
) -> Result<(), String> {
    if expected.len() != actual.len() {
        return Err(format!(
            "expected {} lines:\n{}\ngot {}:\n{}",
            expected.len(),
            expected.join("\n"),
            actual.len(),
            actual.join("\n")
        ));
    }
    let mut tentative = bindings.clone();
    for (i, (e, a)) in expected.iter().zip(actual).enumerate() {
        let time_field = e.contains("\"ttl-ms\" =>")
            || e.contains("\"held-ms\" =>")
            || (i > 0 && is_time_label(&expected[i - 1]))
            || (i > 0 && is_lease_ttl(&expected[i - 1], e));
        match_line(e, a, time_field, &mut tentative)?;
    }
    *bindings = tentative;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Replaying.

type Reply = (redis::RedisResult<redis::Value>, Duration);

/// One client connection in a thread of its own, so that it can block while others go on.
struct Client {
    requests: Sender<Vec<String>>,
    replies: Receiver<Reply>,
}

impl Client {
    fn new(mut con: redis::Connection) -> Self {
        let (requests, inbox) = mpsc::channel::<Vec<String>>();
        let (outbox, replies) = mpsc::channel();
        thread::spawn(move || {
            for args in inbox {
                let started = Instant::now();
                let mut cmd = redis::Cmd::new();
                for arg in &args {
                    cmd.arg(arg.as_str());
                }
                let reply = cmd.query::<redis::Value>(&mut con);
                if outbox.send((reply, started.elapsed())).is_err() {
                    break;
                }
            }
        });
        Client { requests, replies }
    }

    fn send(&self, args: Vec<String>) {
        self.requests.send(args).expect("client thread alive");
    }

    fn reply(&self) -> Reply {
        self.replies.recv_timeout(REPLY_DEADLINE).expect("a reply within the deadline")
    }
}

struct Replay<'a> {
    page: &'a str,
    server: Server,
    admin: redis::Connection,
    clients: HashMap<(usize, bool), Client>,
    bindings: Bindings,
    failures: Vec<String>,
}

impl Replay<'_> {
    fn client(&mut self, client: usize, resp3: bool) -> &Client {
        let server = &self.server;
        self.clients.entry((client, resp3)).or_insert_with(|| {
            Client::new(if resp3 { server.client_resp3() } else { server.client() })
        })
    }

    fn waits_started(&mut self) -> u64 {
        info_line(&mut self.admin, "dlock", "dlock_waits_started")
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    fn check(
        &mut self,
        line: usize,
        what: &str,
        expected: &[String],
        reply: Reply,
        min_elapsed: Option<Duration>,
    ) {
        let actual = match &reply.0 {
            // redis-cli prints INFO's text as it is, not as a quoted string.
            Ok(redis::Value::BulkString(text))
                if what
                    .split_whitespace()
                    .next()
                    .is_some_and(|c| c.eq_ignore_ascii_case("INFO")) =>
            {
                let text = String::from_utf8_lossy(text);
                text.lines()
                    .map(str::trim_end)
                    .filter(|l| !l.is_empty())
                    .map(String::from)
                    .collect()
            }
            _ => format_reply(&reply.0),
        };
        if let Err(why) = match_reply(expected, &actual, &mut self.bindings) {
            self.failures.push(format!("{}:{line}: {what}\n{why}", self.page));
        }
        if let Some(min) = min_elapsed
            && reply.1 + Duration::from_millis(50) < min
        {
            self.failures.push(format!(
                "{}:{line}: {what} took {:?}, the page says at least {min:?}",
                self.page, reply.1
            ));
        }
    }

    fn run_transcript(&mut self, resp3: bool, steps: &[Step]) {
        for step in steps {
            match step {
                Step::Send { line, client, command, blocks, expected, min_elapsed } => {
                    let args = self.bindings.substitute(split_command(command));
                    if *blocks {
                        let before = self.waits_started();
                        self.client(*client, resp3).send(args);
                        let blocked = eventually(Duration::from_secs(10), || {
                            let now = info_line(&mut self.admin, "dlock", "dlock_waits_started");
                            now.and_then(|n| n.trim().parse::<u64>().ok()).unwrap_or(0) > before
                        });
                        if !blocked {
                            self.failures
                                .push(format!("{}:{line}: {command} did not block", self.page));
                            return;
                        }
                    } else {
                        let client = self.client(*client, resp3);
                        client.send(args);
                        let reply = client.reply();
                        self.check(*line, command, expected, reply, *min_elapsed);
                    }
                }
                Step::Await { line, client, expected, min_elapsed } => {
                    let reply = self.client(*client, resp3).reply();
                    self.check(*line, "the blocked command's reply", expected, reply, *min_elapsed);
                }
            }
        }
    }

    fn check_aof(&mut self, line: usize, expected: &[String]) {
        let dir = self.server.dir().join("appendonlydir");
        let mut why = String::new();
        let bindings = &mut self.bindings;
        let matched = eventually(Duration::from_secs(10), || {
            match match_reply(expected, &aof_increment(&dir), bindings) {
                Ok(()) => true,
                Err(e) => {
                    why = e;
                    false
                }
            }
        });
        if !matched {
            self.failures.push(format!("{}:{line}: the AOF increment file\n{why}", self.page));
        }
    }
}

/// The newest AOF increment file in `dir`, one decoded command per line.
fn aof_increment(dir: &Path) -> Vec<String> {
    let newest = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.to_string_lossy().ends_with(".incr.aof"))
                .max_by_key(|p| increment_number(p))
        })
        .ok()
        .flatten();
    let bytes = newest.and_then(|p| std::fs::read(p).ok()).unwrap_or_default();
    decode_aof(&bytes)
}

fn increment_number(path: &Path) -> u64 {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.split('.').filter_map(|part| part.parse().ok()).next_back().unwrap_or(0)
}

/// RESP arrays of bulk strings, as written to an AOF, one command per line.
fn decode_aof(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.split("\r\n");
    let mut commands = Vec::new();
    while let Some(header) = lines.next() {
        let Some(count) = header.strip_prefix('*').and_then(|n| n.parse::<usize>().ok()) else {
            continue;
        };
        let mut args = Vec::new();
        for _ in 0..count {
            lines.next(); // $len
            args.push(lines.next().unwrap_or_default().to_owned());
        }
        commands.push(args.join(" "));
    }
    commands
}

fn replay(page: &str) {
    let path = project().join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let items = parse_page(&text);
    assert!(
        items.iter().any(|item| matches!(item, Item::Transcript { .. })),
        "{page} has no transcript: take it out of the list"
    );
    let server = Server::start();
    let admin = server.client();
    let mut replay = Replay {
        page,
        server,
        admin,
        clients: HashMap::new(),
        bindings: Bindings::default(),
        failures: Vec::new(),
    };
    for item in &items {
        match item {
            Item::Sleep(ms) => thread::sleep(Duration::from_millis(*ms)),
            Item::Server(args) => {
                replay.clients.clear();
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                replay.server = Server::start_with(&args);
                replay.admin = replay.server.client();
            }
            Item::Transcript { line, resp3, steps } => {
                let before = replay.failures.len();
                replay.run_transcript(*resp3, steps);
                if replay.failures.len() > before {
                    replay.failures.push(format!("({page}:{line}: the transcript above failed)"));
                }
            }
            Item::Aof { line, expected } => replay.check_aof(*line, expected),
        }
    }
    assert!(replay.failures.is_empty(), "{}", replay.failures.join("\n\n"));
}

/// Every page with a transcript, so a new one cannot be left out by accident.
const PAGES: &[&str] = &[
    "README.md",
    "docs/behaviour.md",
    "docs/commands/dlock.acquire.md",
    "docs/commands/dlock.acquireall.md",
    "docs/commands/dlock.fencecheck.md",
    "docs/commands/dlock.fenced.md",
    "docs/commands/dlock.info.md",
    "docs/commands/dlock.release.md",
    "docs/commands/dlock.releaseall.md",
    "docs/commands/dlock.renew.md",
    "docs/commands/dlock.renewall.md",
    "docs/commands/dlock.revoke.md",
    "docs/commands/dlock.setfence.md",
    "docs/commands/dlock.setlease.md",
    "docs/commands/dlock.top.md",
    "docs/operations.md",
    "docs/shared.md",
];

macro_rules! pages {
    ($($name:ident => $page:expr),* $(,)?) => {
        $( #[test] fn $name() { replay($page); } )*
    };
}

pages! {
    readme => "README.md",
    behaviour => "docs/behaviour.md",
    acquire => "docs/commands/dlock.acquire.md",
    acquireall => "docs/commands/dlock.acquireall.md",
    fencecheck => "docs/commands/dlock.fencecheck.md",
    fenced => "docs/commands/dlock.fenced.md",
    info => "docs/commands/dlock.info.md",
    release => "docs/commands/dlock.release.md",
    releaseall => "docs/commands/dlock.releaseall.md",
    renew => "docs/commands/dlock.renew.md",
    renewall => "docs/commands/dlock.renewall.md",
    revoke => "docs/commands/dlock.revoke.md",
    setfence => "docs/commands/dlock.setfence.md",
    setlease => "docs/commands/dlock.setlease.md",
    top => "docs/commands/dlock.top.md",
    operations => "docs/operations.md",
    shared => "docs/shared.md",
}

fn markdown_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("docs dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            markdown_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "md") {
            into.push(path);
        }
    }
}

#[test]
fn every_page_with_a_transcript_is_replayed() {
    let mut files = vec![project().join("README.md")];
    markdown_files(&project().join("docs"), &mut files);
    for path in files {
        let text = std::fs::read_to_string(&path).expect("read page");
        let page = path.strip_prefix(project()).expect("in the project").to_string_lossy();
        let has_transcript =
            parse_page(&text).iter().any(|item| matches!(item, Item::Transcript { .. }));
        assert_eq!(
            has_transcript,
            PAGES.contains(&page.as_ref()),
            "{page}: PAGES and the pages! list must name exactly the pages with transcripts"
        );
    }
}

/// The replay prints a reply as redis-cli prints it in a terminal: for replies of every shape the
/// docs show (nil, integers, strings, errors, nested arrays, RESP3 maps with array values), in
/// RESP2 and RESP3, the replay's formatting equals real `redis-cli --no-raw` output (times masked:
/// they move between the two calls).
#[test]
fn the_replay_prints_replies_exactly_as_redis_cli_does() {
    let server = Server::start();
    let mut con = server.client();
    let fence = dlock_testkit::acquire(&mut con, "job", "worker-a", 600_000).expect("granted");
    for token in ["t-1", "t-2"] {
        let _: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
            .arg("job")
            .arg(token)
            .arg(60_000)
            .arg("QUEUE")
            .arg(60_000)
            .query(&mut con)
            .expect("ticket");
    }
    for reader in ["r1", "r2"] {
        let _: i64 = redis::cmd("DLOCK.ACQUIRE")
            .arg("doc")
            .arg(reader)
            .arg(600_000)
            .arg("SHARED")
            .arg("META")
            .arg("host \"a\"")
            .query(&mut con)
            .expect("reader");
    }
    let fence = fence.to_string();
    let commands: [&[&str]; 11] = [
        &["DLOCK.INFO", "job"],
        &["DLOCK.INFO", "doc"],
        &["DLOCK.INFO", "nothing"],
        &["DLOCK.FENCECHECK", "job", &fence],
        &["DLOCK.LIST", "0", "COUNT", "100"],
        &["DLOCK.ACQUIRE", "job"],
        &["CONFIG", "GET", "dlock.max-*"],
        &["COMMAND", "DOCS", "dlock.revoke"],
        &["COMMAND", "DOCS", "dlock.acquire"],
        &["COMMAND", "INFO", "dlock.fenced"],
        &["DLOCK.LIST", "0", "MATCH", "none*"],
    ];
    // The times (a ttl or a hold time: the field's value, in RESP2 on the line after its name,
    // and a shared lease's ttl) are the only numbers that move between two calls.
    let mask = |lines: Vec<String>| -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut previous = String::new();
        for line in lines.into_iter().filter(|line| !line.trim().is_empty()) {
            let timed = is_time_label(&previous)
                || is_lease_ttl(&previous, &line)
                || line.contains("\"ttl-ms\" =>")
                || line.contains("\"held-ms\" =>");
            let shown = if timed {
                line.trim_end_matches(|c: char| c.is_ascii_digit()).to_owned() + "<time>"
            } else {
                line.clone()
            };
            out.push(shown);
            previous = line;
        }
        out
    };
    let mut failures = Vec::new();
    for resp3 in [false, true] {
        let mut con = if resp3 { server.client_resp3() } else { server.client() };
        for args in commands {
            let mut cmd = redis::Cmd::new();
            for arg in args {
                cmd.arg(*arg);
            }
            let ours = mask(format_reply(&cmd.query::<redis::Value>(&mut con)));
            let mut cli = std::process::Command::new("redis-cli");
            cli.args(["--no-raw", "-p", &server.port.to_string()]);
            if resp3 {
                cli.arg("-3");
            }
            let output = cli.args(args).output().expect("redis-cli runs");
            let printed = String::from_utf8_lossy(&output.stdout);
            let theirs = mask(printed.lines().map(|line| line.trim_end().to_owned()).collect());
            if ours != theirs {
                failures.push(format!(
                    "{} {args:?}:\nredis-cli:\n{}\nreplay:\n{}",
                    if resp3 { "RESP3" } else { "RESP2" },
                    theirs.join("\n"),
                    ours.join("\n")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_mask_rules_do_what_the_header_says() {
    let mut bindings = Bindings::default();
    let e = |s: &str| vec![s.to_owned()];
    // A printed fence binds; the same printed fence must then be the same value.
    assert!(
        match_reply(
            &e("(integer) 1796207624902868"),
            &e("(integer) 1800000000000001"),
            &mut bindings
        )
        .is_ok()
    );
    assert!(
        match_reply(
            &e("(integer) 1796207624902868"),
            &e("(integer) 1800000000000002"),
            &mut bindings
        )
        .is_err()
    );
    // Two printed fences cannot be one value, and keep their order.
    assert!(
        match_reply(
            &e("(integer) 1796207624902999"),
            &e("(integer) 1800000000000001"),
            &mut bindings
        )
        .is_err()
    );
    assert!(
        match_reply(
            &e("(integer) 1796207624902999"),
            &e("(integer) 1700000000000000"),
            &mut bindings
        )
        .is_err()
    );
    assert!(
        match_reply(
            &e("(integer) 1796207624902999"),
            &e("(integer) 1800000000000009"),
            &mut bindings
        )
        .is_ok()
    );
    assert_eq!(
        bindings.substitute(vec!["DLOCK.FENCECHECK".into(), "r".into(), "1796207624902868".into()]),
        vec!["DLOCK.FENCECHECK", "r", "1800000000000001"]
    );
    // Small integers match exactly; times within the slack.
    assert!(match_reply(&e("(integer) 1"), &e("(integer) 0"), &mut bindings).is_err());
    let info = |ttl: &str| vec!["5) \"ttl-ms\"".to_owned(), format!("6) (integer) {ttl}")];
    assert!(match_reply(&info("29987"), &info("29000"), &mut bindings).is_ok());
    assert!(match_reply(&info("29987"), &info("20000"), &mut bindings).is_err());
    // A failed match binds nothing.
    let mut fresh = Bindings::default();
    let two = |a: &str, b: &str| vec![format!("(integer) {a}"), format!("(integer) {b}")];
    assert!(
        match_reply(&two("1796207624902868", "1"), &two("1800000000000001", "2"), &mut fresh)
            .is_err()
    );
    assert!(fresh.0.is_empty());
}

#[test]
fn transcripts_parse_into_clients_and_blocked_replies() {
    let page = "\
```
# client 1                                        # client 2
127.0.0.1:6379> DLOCK.ACQUIRE r a 30000
(integer) 1796207694197581
                                                  127.0.0.1:6379> DLOCK.ACQUIRE r b 30000 WAIT 0
                                                  (blocks)
127.0.0.1:6379> DLOCK.RELEASE r a
(integer) 1
                                                  (integer) 1796207694416948
                                                  (2.22s)
```
";
    let items = parse_page(page);
    let [Item::Transcript { steps, .. }] = items.as_slice() else { panic!("{items:?}") };
    assert_eq!(steps.len(), 4, "{steps:?}");
    assert!(matches!(&steps[1], Step::Send { client: 1, blocks: true, .. }));
    assert!(matches!(&steps[3], Step::Await { client: 1, min_elapsed: Some(_), .. }));
    assert_eq!(split_command(r#"SET k "a b" c"#), vec!["SET", "k", "a b", "c"]);
}

/// `redis.conf.example` runs once its two placeholder paths are replaced, and sets what it says.
#[test]
fn redis_conf_example_runs_once_its_paths_are_filled_in() {
    let example = std::fs::read_to_string(project().join("redis.conf.example")).expect("example");
    let dir = tempfile::tempdir().expect("tempdir");
    let module_line = "loadmodule /absolute/path/to/target/release/libdlock.so";
    let dir_line = "dir /var/lib/redis-dlock";
    assert!(example.lines().any(|l| l == module_line), "the module placeholder moved");
    assert!(example.lines().any(|l| l == dir_line), "the dir placeholder moved");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    let conf = example
        .replace(module_line, &format!("loadmodule {}", module_path().display()))
        .replace(dir_line, &format!("dir {}", dir.path().display()))
        .replace("port 6379", &format!("port {port}"));
    let path = dir.path().join("redis.conf");
    std::fs::write(&path, conf).expect("write conf");
    let mut child = std::process::Command::new(server_binary())
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("redis-server");
    let url = format!("redis://127.0.0.1:{port}/");
    let mut con = None;
    let up = eventually(Duration::from_secs(20), || {
        con = redis::Client::open(url.as_str()).and_then(|c| c.get_connection()).ok();
        con.as_mut().is_some_and(|c| redis::cmd("PING").query::<String>(c).is_ok())
    });
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(up, "redis-server did not start from redis.conf.example");
        let con = con.as_mut().expect("connected");
        assert!(dlock_testkit::acquire(con, "invoice:1", "w", 30_000).is_some());
        let fsync: Vec<String> =
            redis::cmd("CONFIG").arg("GET").arg("appendfsync").query(con).expect("CONFIG");
        assert_eq!(fsync, ["appendfsync", "always"]);
        let policy: Vec<String> =
            redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").query(con).expect("CONFIG");
        assert_eq!(policy, ["maxmemory-policy", "noeviction"]);
        assert!(
            eventually(Duration::from_secs(10), || dir.path().join("appendonlydir").exists()),
            "the AOF goes into `dir`"
        );
    }));
    let _ = child.kill();
    let _ = child.wait();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
