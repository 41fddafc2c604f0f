//! The conformance harness's command line.
//!
//! ```text
//! dlock-conformance --driver rust=target/debug/dlock-conformance-rust \
//!     --driver "python=.deps/venv/bin/python -m dlock._conformance_driver" \
//!     [--scenarios protocol/conformance] [--only name,name] [--markdown out.md] [--jobs N]
//!     [--self-check]
//! ```
//!
//! `--jobs N` runs up to N (scenario, client) pairs at once, each with its own servers (default
//! 1); the table is the same.
//!
//! Servers are `$DLOCK_SERVER` (default `redis-server`) with `$DLOCK_MODULE` (default the
//! `libdlock.so` beside this binary), started per scenario. Exits 1 when a scenario failed (with
//! `--self-check`: when a deliberately wrong driver was not caught).

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

use dlock_conformance::driver::Mutation;
use dlock_conformance::report::{Outcome, Table};
use dlock_conformance::scenario::{self, Scenario};

/// Scenarios a deliberately wrong driver must fail, and how it is wrong: each names a check
/// that would be worthless if it passed.
const SELF_CHECK: [(&str, Mutation); 6] = [
    ("grant-fence", Mutation::Fence),
    ("held-no-wait", Mutation::ErrorsOk),
    ("operator-del-lost", Mutation::Silent),
    ("fenced-stale-after-del", Mutation::ErrorsOk),
    ("wait-handed-over", Mutation::Token),
    ("campaign-observe", Mutation::NoLeader),
];

struct Args {
    drivers: Vec<(String, String)>,
    scenarios: PathBuf,
    only: Option<Vec<String>>,
    markdown: Option<PathBuf>,
    jobs: usize,
    self_check: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        drivers: Vec::new(),
        scenarios: PathBuf::from("protocol/conformance"),
        only: None,
        markdown: None,
        jobs: 1,
        self_check: false,
    };
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        let mut value = || given.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--driver" => {
                let spec = value()?;
                let (name, command) =
                    spec.split_once('=').ok_or(format!("--driver NAME=COMMAND, not {spec:?}"))?;
                args.drivers.push((name.to_owned(), command.to_owned()));
            }
            "--scenarios" => args.scenarios = PathBuf::from(value()?),
            "--only" => args.only = Some(value()?.split(',').map(str::to_owned).collect()),
            "--markdown" => args.markdown = Some(PathBuf::from(value()?)),
            "--jobs" => {
                let text = value()?;
                args.jobs = text
                    .parse()
                    .ok()
                    .filter(|n| (1..=16).contains(n))
                    .ok_or(format!("--jobs must be 1 to 16, not {text:?}"))?;
            }
            "--self-check" => args.self_check = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.drivers.is_empty() {
        return Err("give at least one --driver NAME=COMMAND".to_owned());
    }
    Ok(args)
}

/// `$DLOCK_SERVER --version`, shortened to its name and version.
fn server_version() -> String {
    let binary = dlock_testkit::server_binary();
    let output = Command::new(&binary).arg("--version").output();
    let text = output.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    // "Redis server v=7.0.15 sha=…" / "Valkey server v=9.0.0 …"
    let mut words = text.split_whitespace();
    match (words.next(), words.find(|w| w.starts_with("v="))) {
        (Some(name), Some(version)) => format!("{name} {}", &version[2..]),
        _ => binary,
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(why) => {
            eprintln!("dlock-conformance: {why}");
            return ExitCode::from(2);
        }
    };
    let mut scenarios = match scenario::load(&args.scenarios) {
        Ok(scenarios) => scenarios,
        Err(why) => {
            eprintln!("dlock-conformance: {why}");
            return ExitCode::from(2);
        }
    };
    if let Some(only) = &args.only {
        scenarios.retain(|s| only.contains(&s.name));
    }
    let workdir = std::env::temp_dir().join(format!("dlock-conformance-{}", std::process::id()));
    if let Err(why) = std::fs::create_dir_all(&workdir) {
        eprintln!("dlock-conformance: {}: {why}", workdir.display());
        return ExitCode::from(2);
    }
    let server = server_version();
    let code = if args.self_check {
        self_check(&scenarios, &args.drivers[0].1, &workdir)
    } else {
        run_all(&scenarios, &args, &server, &workdir)
    };
    if code == ExitCode::SUCCESS {
        let _ = std::fs::remove_dir_all(&workdir);
    }
    code
}

fn run_all(
    scenarios: &[Scenario],
    args: &Args,
    server: &str,
    workdir: &std::path::Path,
) -> ExitCode {
    let started = Instant::now();
    eprintln!("dlock-conformance: {} scenarios on {server}", scenarios.len());
    let mut versions: Vec<Option<String>> = vec![None; args.drivers.len()];
    let mut table = Table {
        clients: args.drivers.iter().map(|(name, _)| name.clone()).collect(),
        rows: Vec::new(),
    };
    // Every (scenario, client) pair, taken in order by up to `jobs` threads; each runs in a
    // directory of its own (a driver's stderr is kept there).
    let pairs: Vec<(usize, usize)> =
        (0..scenarios.len()).flat_map(|s| (0..args.drivers.len()).map(move |d| (s, d))).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(vec![None; pairs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..args.jobs.min(pairs.len()).max(1) {
            scope.spawn(|| {
                loop {
                    let at = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(s, d)) = pairs.get(at) else { return };
                    let (scenario, (client, command)) = (&scenarios[s], &args.drivers[d]);
                    let (outcome, version) = match scenario.not_for.get(client) {
                        Some(why) => (Outcome::NotApplicable(why.clone()), None),
                        None => {
                            let dir = workdir.join(client);
                            let _ = std::fs::create_dir_all(&dir);
                            let began = Instant::now();
                            match scenario::run(scenario, command, &dir, None) {
                                Ok(version) => (Outcome::Pass(began.elapsed()), version),
                                Err(why) => (Outcome::Fail(why), None),
                            }
                        }
                    };
                    let mut line = format!(
                        "  {:32} {:8} {}",
                        scenario.name,
                        client,
                        outcome.cell_with_reason()
                    );
                    if let Outcome::Fail(why) = &outcome {
                        line.push_str(&format!("\n    {}", why.replace('\n', "\n    ")));
                    }
                    eprintln!("{line}");
                    let mut results = results.lock().unwrap_or_else(|p| p.into_inner());
                    results[at] = Some((outcome, version));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner()).into_iter();
    for scenario in scenarios {
        let mut cells = Vec::new();
        for version_seen in versions.iter_mut() {
            let (outcome, version) = results
                .next()
                .flatten()
                .unwrap_or_else(|| (Outcome::Fail("not run".to_owned()), None));
            *version_seen = version_seen.take().or(version);
            cells.push(outcome);
        }
        table.rows.push((scenario.name.clone(), scenario.title.clone(), cells));
    }
    println!("{}", table.text());
    println!("{server}: {} s", started.elapsed().as_secs());
    if let Some(path) = &args.markdown {
        let clients: Vec<String> = args
            .drivers
            .iter()
            .zip(&versions)
            .map(|((name, _), version)| format!("{name}: {}", version.as_deref().unwrap_or("?")))
            .collect();
        let text = format!(
            "### {server}\n\nClients: {}.\n\n{}\n{} scenarios in {} s.\n",
            clients.join(", "),
            table.markdown(),
            scenarios.len(),
            started.elapsed().as_secs()
        );
        if let Err(why) = std::fs::write(path, text) {
            eprintln!("dlock-conformance: {}: {why}", path.display());
            return ExitCode::from(2);
        }
    }
    if table.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Runs [`SELF_CHECK`]'s scenarios with a deliberately wrong driver each: every one must fail.
fn self_check(scenarios: &[Scenario], command: &str, workdir: &std::path::Path) -> ExitCode {
    let mut caught = true;
    for (name, mutation) in SELF_CHECK {
        let Some(scenario) = scenarios.iter().find(|s| s.name == name) else {
            eprintln!("self-check: no scenario {name}");
            caught = false;
            continue;
        };
        match scenario::run(scenario, command, workdir, Some(mutation)) {
            Ok(_) => {
                eprintln!("self-check: {name} PASSED with a driver that is wrong ({mutation:?})");
                caught = false;
            }
            Err(why) => {
                let first = why.lines().next().unwrap_or_default();
                eprintln!("self-check: {name} with {mutation:?} fails as it must: {first}");
            }
        }
    }
    if caught { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
