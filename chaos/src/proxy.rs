//! A TCP proxy of our own in front of a server, for link faults without `tc netem`: delay every
//! chunk, drop (close) every open connection, or partition (refuse and close) until healed. Its
//! target can be moved to another server (after a promotion).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The proxy's controls; cheap to clone.
#[derive(Clone)]
pub struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    target: AtomicU16,
    delay_ms: AtomicU64,
    partitioned: AtomicBool,
    /// Cancelled to close every connection open now.
    generation: Mutex<CancellationToken>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target` on `runtime`.
    pub fn start(runtime: &tokio::runtime::Handle, target: u16) -> Self {
        let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            target: AtomicU16::new(target),
            delay_ms: AtomicU64::new(0),
            partitioned: AtomicBool::new(false),
            generation: Mutex::new(CancellationToken::new()),
        });
        let accepting = shared.clone();
        runtime.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if accepting.partitioned.load(Ordering::SeqCst) {
                    drop(client); // refused: the link is cut
                    continue;
                }
                let closed = accepting.generation.lock().expect("generation").clone();
                tokio::spawn(forward(client, accepting.clone(), closed));
            }
        });
        Self { port, shared }
    }

    /// Delays every chunk in both directions by `delay` (zero heals).
    pub fn set_delay(&self, delay: Duration) {
        self.shared.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Closes every connection open now; new ones are accepted.
    pub fn drop_connections(&self) {
        let mut generation = self.shared.generation.lock().expect("generation");
        generation.cancel();
        *generation = CancellationToken::new();
    }

    /// Cuts the link: open connections close, new ones are refused until [`Proxy::heal`].
    pub fn partition(&self) {
        self.shared.partitioned.store(true, Ordering::SeqCst);
        self.drop_connections();
    }

    /// Ends a partition and a delay.
    pub fn heal(&self) {
        self.shared.partitioned.store(false, Ordering::SeqCst);
        self.set_delay(Duration::ZERO);
    }

    /// Forwards new connections to another port (open ones are closed).
    pub fn retarget(&self, target: u16) {
        self.shared.target.store(target, Ordering::SeqCst);
        self.drop_connections();
    }
}

async fn forward(client: TcpStream, shared: Arc<Shared>, closed: CancellationToken) {
    let target = shared.target.load(Ordering::SeqCst);
    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        _ = pump(client_read, server_write, &shared) => {}
        _ = pump(server_read, client_write, &shared) => {}
        _ = closed.cancelled() => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        let delay = shared.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if shared.partitioned.load(Ordering::SeqCst) || to.write_all(&buffer[..read]).await.is_err()
        {
            return;
        }
    }
}
