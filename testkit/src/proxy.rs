//! A TCP proxy of our own in front of a server, for link faults without `tc netem`: cut the link
//! (close what is open, refuse what comes) until healed, delay every chunk, close every open
//! connection, swallow one reply, or let open connections go silent; its target can move to
//! another server (after a promotion).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{sleep, spawn};
use std::time::Duration;

/// The proxy's controls; cheap to clone. Its threads outlive it (a test process ends soon).
#[derive(Clone)]
pub struct LinkProxy {
    /// The loopback port clients connect to instead of the server's.
    pub port: u16,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    target: AtomicU16,
    delay_ms: AtomicU64,
    cut: AtomicBool,
    drop_next_reply: AtomicBool,
    /// Connections numbered below this forward nothing more, but stay open (a half-open link).
    silent_below: AtomicU64,
    /// The number of the last accepted connection.
    accepted: AtomicU64,
    /// Both ends of every connection still open, by number: a connection leaves when either
    /// direction ends (or [`LinkProxy::drop_connections`] closes it), so none holds its
    /// descriptors past its end.
    open: Mutex<Vec<(u64, TcpStream)>>,
    /// Byte strings replaced by others of the same length, in requests and in replies.
    rewrites: Mutex<[Vec<Rewrite>; 2]>,
}

/// A byte string and what replaces it (of the same length).
type Rewrite = (Vec<u8>, Vec<u8>);

impl LinkProxy {
    /// Forwards connections on a fresh loopback port to `127.0.0.1:target_port`.
    pub fn start(target_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared { target: AtomicU16::new(target_port), ..Shared::default() });
        let accepting = shared.clone();
        spawn(move || {
            for (number, client) in (1u64..).zip(listener.incoming()) {
                accepting.accepted.store(number, Ordering::SeqCst);
                let Ok(client) = client else { continue };
                if accepting.cut.load(Ordering::SeqCst) {
                    continue; // refused: the link is cut
                }
                let target = accepting.target.load(Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else { continue };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let mut open = accepting.open.lock().expect("proxy streams");
                for (from, to, replies) in [(&client, &server, false), (&server, &client, true)] {
                    let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else { continue };
                    let shared = accepting.clone();
                    spawn(move || forward(from, to, replies, number, &shared));
                }
                open.push((number, client));
                open.push((number, server));
            }
        });
        Self { port, shared }
    }

    /// Cuts the link: every open connection closes, new ones are refused until [`LinkProxy::heal`].
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        self.drop_connections();
    }

    /// Ends a cut and a delay.
    pub fn heal(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
        self.set_delay(Duration::ZERO);
    }

    /// Delays every chunk in both directions by `delay` (zero heals).
    pub fn set_delay(&self, delay: Duration) {
        self.shared.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Closes every connection open now; new ones are accepted.
    pub fn drop_connections(&self) {
        for (_, stream) in self.shared.open.lock().expect("proxy streams").drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Forwards new connections to another port (open ones are closed).
    pub fn retarget(&self, target_port: u16) {
        self.shared.target.store(target_port, Ordering::SeqCst);
        self.drop_connections();
    }

    /// The next reply from the server is swallowed and its connection closed: the request was
    /// carried out, the client never learns how. Pub/sub frames (a subscription's confirmation, a
    /// message) are not replies: they pass.
    pub fn drop_next_reply(&self) {
        self.shared.drop_next_reply.store(true, Ordering::SeqCst);
    }

    /// From now on, every `from` in what clients send becomes `to` (of the same length), and
    /// with `replies` in what the server answers instead. With both directions a test plays an
    /// older server: a new option renamed on the way in, the server's complaint about the new
    /// name renamed back on the way out. A string split between two reads is not seen (small
    /// requests on loopback are read whole).
    pub fn rewrite(&self, replies: bool, from: &[u8], to: &[u8]) {
        assert_eq!(from.len(), to.len(), "a rewrite keeps the length");
        let mut rewrites = self.shared.rewrites.lock().expect("proxy rewrites");
        rewrites[usize::from(replies)].push((from.to_vec(), to.to_vec()));
    }

    /// Every connection open now goes silent: what is sent is swallowed, nothing is closed (the
    /// peer vanished without a FIN). New connections work.
    pub fn silence_open_connections(&self) {
        let last = self.shared.accepted.load(Ordering::SeqCst);
        self.shared.silent_below.store(last + 1, Ordering::SeqCst);
    }
}

/// Whether `data` starts with a pub/sub frame (a subscription's confirmation or a message, RESP2
/// or a RESP3 push): what a subscriber connection receives, never the reply `drop_next_reply`
/// means to take (a client's holders and ticket waiters subscribe and unsubscribe around the
/// request whose reply a test drops).
fn is_pubsub(data: &[u8]) -> bool {
    const KINDS: [&[u8]; 9] = [
        b"subscribe",
        b"unsubscribe",
        b"ssubscribe",
        b"sunsubscribe",
        b"psubscribe",
        b"punsubscribe",
        b"message",
        b"smessage",
        b"pmessage",
    ];
    let Some(rest) = [&b"*3\r\n$"[..], b">3\r\n$", b"*4\r\n$", b">4\r\n$"]
        .iter()
        .find_map(|header| data.strip_prefix(*header))
    else {
        return false;
    };
    let Some(length_end) = rest.windows(2).position(|pair| pair == b"\r\n") else {
        return false;
    };
    let word = &rest[length_end + 2..];
    KINDS
        .iter()
        .any(|kind| word.strip_prefix(*kind).is_some_and(|after| after.starts_with(b"\r\n")))
}

/// Replaces every `old` in `data` by `new` (of the same length).
fn replace_all(data: &mut [u8], old: &[u8], new: &[u8]) {
    let mut at = 0;
    while let Some(found) = data[at..].windows(old.len()).position(|window| window == old) {
        data[at + found..at + found + old.len()].copy_from_slice(new);
        at += found + old.len();
    }
}

/// Copies one direction of connection `number`; the reply direction obeys `drop_next_reply`
/// (pub/sub frames aside).
fn forward(mut from: TcpStream, mut to: TcpStream, replies: bool, number: u64, shared: &Shared) {
    let mut buffer = [0u8; 16 * 1024];
    while let Ok(read) = from.read(&mut buffer) {
        if read == 0 {
            break;
        }
        if number < shared.silent_below.load(Ordering::SeqCst) {
            continue; // swallowed
        }
        let delay = shared.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            sleep(Duration::from_millis(delay));
        }
        if shared.cut.load(Ordering::SeqCst) {
            break;
        }
        if replies
            && !is_pubsub(&buffer[..read])
            && shared.drop_next_reply.swap(false, Ordering::SeqCst)
        {
            let _ = from.shutdown(Shutdown::Both);
            break;
        }
        for (old, new) in &shared.rewrites.lock().expect("proxy rewrites")[usize::from(replies)] {
            replace_all(&mut buffer[..read], old, new);
        }
        if to.write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
    shared.open.lock().expect("proxy streams").retain(|(n, _)| *n != number);
}

#[cfg(test)]
mod tests {
    use super::is_pubsub;

    #[test]
    fn pubsub_frames_are_told_from_replies() {
        assert!(is_pubsub(b"*3\r\n$11\r\nunsubscribe\r\n$13\r\ndlock:{report}\r\n:0\r\n"));
        assert!(is_pubsub(b">3\r\n$10\r\nssubscribe\r\n$8\r\ndlock:{x}\r\n:1\r\n"));
        assert!(is_pubsub(b"*3\r\n$7\r\nmessage\r\n$8\r\ndlock:{x}\r\n$9\r\nrevoked 8\r\n"));
        assert!(!is_pubsub(b":1796207757444120\r\n"), "an ACQUIRE's fence");
        assert!(!is_pubsub(b"*3\r\n$5\r\nowner\r\n"), "an array that is no pub/sub frame");
        assert!(!is_pubsub(b"*3\r\n$9\r\nsubscriber\r\n"));
        assert!(!is_pubsub(b"$-1\r\n"));
    }
}
