//! The cluster's network: one network namespace per node, each joined to a private bridge in the
//! harness's own namespace by a veth pair. The harness and the workers reach every node through
//! the bridge; the nodes reach each other through it. Cutting a node's link (its veth, bridge
//! side, down) isolates it from the harness, the workers and every other node: a real partition
//! of that node from the majority.
//!
//! Names carry the harness's process id (`dlc<pid>n<i>` namespaces, `dlc<pid>b` bridge,
//! `dlc<pid>v<i>` links), so that runs at once do not meet, and a run killed before it could
//! clean up is found and removed by the next one ([`sweep_stale`]). [`Net`] removes everything
//! it made when dropped (also on a panic), and [`on_interrupt`] does so on SIGINT, SIGTERM and
//! SIGHUP.

use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};

/// The port of node `i` (its own address besides, so that a glance at a log says which node).
pub fn port(i: usize) -> u16 {
    7_000 + i as u16
}

/// What must be undone, in one place for the drop and for the signal thread.
#[derive(Default)]
struct Made {
    namespaces: Vec<String>,
    links: Vec<String>,
    bridge: Option<String>,
    /// Processes to kill before a namespace goes (a namespace lives on while a process is in it).
    pids: Vec<u32>,
}

static MADE: Mutex<Option<Made>> = Mutex::new(None);

fn made<T>(f: impl FnOnce(&mut Made) -> T) -> T {
    let mut guard = MADE.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(Made::default))
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim()))
    }
}

/// The network of one run: `nodes` namespaces on one bridge.
pub struct Net {
    prefix: String,
    /// The first three octets of the run's /24.
    subnet: String,
    nodes: usize,
}

impl Net {
    /// Checks that namespaces can be made here (`ip netns add`; root), removes what a killed
    /// earlier run left, and builds the bridge and one namespace per node.
    pub fn create(nodes: usize) -> Result<Net, String> {
        sweep_stale();
        let pid = std::process::id();
        let prefix = format!("dlc{pid}");
        // A /24 of 10.0.0.0/8 that depends on the pid: runs at once get different ones.
        let subnet = format!("10.{}.{}", 100 + pid % 100, (pid / 100) % 256);
        let net = Net { prefix: prefix.clone(), subnet, nodes };
        let probe = format!("{prefix}probe");
        ip(&["netns", "add", &probe])
            .map_err(|e| format!("network namespaces are needed (run as root): {e}"))?;
        ip(&["netns", "del", &probe])?;
        let bridge = format!("{prefix}b");
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        made(|m| m.bridge = Some(bridge.clone()));
        ip(&["addr", "add", &format!("{}.254/24", net.subnet), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        for i in 0..nodes {
            let ns = net.namespace(i);
            ip(&["netns", "add", &ns])?;
            made(|m| m.namespaces.push(ns.clone()));
            let link = net.link(i);
            let peer = format!("{prefix}p{i}");
            ip(&["link", "add", &link, "type", "veth", "peer", "name", &peer])?;
            made(|m| m.links.push(link.clone()));
            ip(&["link", "set", &peer, "netns", &ns])?;
            ip(&["link", "set", &link, "master", &bridge])?;
            ip(&["link", "set", &link, "up"])?;
            let inside = |args: &[&str]| {
                let mut all = vec!["netns", "exec", &ns, "ip"];
                all.extend_from_slice(args);
                ip(&all)
            };
            inside(&["link", "set", "lo", "up"])?;
            inside(&["addr", "add", &format!("{}/24", net.address(i)), "dev", &peer])?;
            inside(&["link", "set", &peer, "up"])?;
        }
        Ok(net)
    }

    /// Node `i`'s namespace.
    pub fn namespace(&self, i: usize) -> String {
        format!("{}n{i}", self.prefix)
    }

    /// Node `i`'s link, bridge side.
    fn link(&self, i: usize) -> String {
        format!("{}v{i}", self.prefix)
    }

    /// Node `i`'s address (it listens there only).
    pub fn address(&self, i: usize) -> String {
        format!("{}.{}", self.subnet, i + 1)
    }

    /// `host:port` of node `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("{}:{}", self.address(i), port(i))
    }

    /// Node `i`, cut from everyone (`up` false) or joined again.
    pub fn set_link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        if let Err(error) = ip(&["link", "set", &self.link(i), state]) {
            eprintln!("dlock-chaos: {error}");
        }
    }

    /// The number of node namespaces.
    pub fn nodes(&self) -> usize {
        self.nodes
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        remove_all();
    }
}

/// A process to kill before the namespaces are removed (a node server).
pub fn track(pid: u32) {
    made(|m| m.pids.push(pid));
}

/// A tracked process that ended.
pub fn untrack(pid: u32) {
    made(|m| m.pids.retain(|p| *p != pid));
}

/// Kills the tracked processes and removes the namespaces, links and bridge this run made.
fn remove_all() {
    let made = MADE.lock().unwrap_or_else(PoisonError::into_inner).take().unwrap_or_default();
    for pid in &made.pids {
        // SAFETY: kill(2) with a pid and a signal number has no memory-safety preconditions.
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
    }
    for ns in &made.namespaces {
        kill_inside(ns);
        let _ = ip(&["netns", "del", ns]);
    }
    for link in &made.links {
        let _ = ip(&["link", "del", link]);
    }
    if let Some(bridge) = &made.bridge {
        let _ = ip(&["link", "del", bridge]);
    }
}

/// SIGKILLs whatever still runs in namespace `ns`.
fn kill_inside(ns: &str) {
    let Ok(output) = Command::new("ip").args(["netns", "pids", ns]).output() else { return };
    for pid in String::from_utf8_lossy(&output.stdout).split_whitespace() {
        if let Ok(pid) = pid.parse::<libc::pid_t>() {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Removes the namespaces, links and bridges of runs whose process is gone (killed before their
/// clean-up could run).
pub fn sweep_stale() {
    let alive = |pid: &str| std::path::Path::new(&format!("/proc/{pid}")).exists();
    let pid_of = |name: &str, marker: char| -> Option<String> {
        let rest = name.strip_prefix("dlc")?;
        let end = rest.find(marker)?;
        let pid = &rest[..end];
        (!pid.is_empty() && pid.chars().all(|c| c.is_ascii_digit())).then(|| pid.to_owned())
    };
    if let Ok(output) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            if pid_of(name, 'n').is_some_and(|pid| !alive(&pid)) {
                kill_inside(name);
                let _ = ip(&["netns", "del", name]);
            }
        }
    }
    if let Ok(output) = Command::new("ip").args(["-o", "link", "show"]).output() {
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            // `7: dlc123v0@if6: <…>`
            let Some(name) = line.split(": ").nth(1) else { continue };
            let name = name.split('@').next().unwrap_or_default();
            let pid = pid_of(name, 'v').or_else(|| pid_of(name, 'b'));
            if pid.is_some_and(|pid| !alive(&pid)) {
                let _ = ip(&["link", "del", name]);
            }
        }
    }
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread (and the threads it starts later), and
/// starts a thread that waits for them: on one, it kills the node servers and the workers,
/// removes the network, runs `also` (the rest of the run's clean-up) and exits with 130. Call
/// first thing in `main`, before any other thread exists; children get the signals back
/// ([`unblock_in_child`]).
pub fn on_interrupt(also: fn()) {
    // SAFETY: the set is initialised by sigemptyset before use; pthread_sigmask and sigwait take
    // valid pointers to it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let set = set;
        std::thread::spawn(move || {
            let mut signal = 0;
            libc::sigwait(&set, &mut signal);
            eprintln!("dlock-chaos: signal {signal}: removing the cluster's network and nodes");
            remove_all();
            also();
            std::process::exit(130);
        });
    }
}

/// Gives a child the signals [`on_interrupt`] blocked in the harness.
pub fn unblock_in_child(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls (sigemptyset, sigaddset, pthread_sigmask) between fork
    // and exec.
    unsafe {
        command.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, signal);
            }
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        })
    }
}
