//! Many waiters timing out on one resource: the worst PING while 19,000 `ACQUIRE … WAIT` calls on
//! one held resource time out, against as many `BLPOP` calls on one empty list timing out, in
//! the same run. Joining, leaving and timing out must cost O(log n) per waiter, not a scan of
//! the queue, or the server stalls for every client while the line drains.

use std::io::Write as _;
use std::net::TcpStream;
use std::thread::sleep;
use std::time::{Duration, Instant};

use dlock_testkit::{Server, info_value, resp_command};

use crate::harness::{Result, flush};
use crate::report::{Report, ratio};

/// Waiters per case: below the bench server's `maxclients` (19,900) and the open-file limit of
/// these machines (20,000 per process, which the server and this client each need one of per
/// connection).
const WAITERS: usize = 19_000;
/// How long each waits, in ms; they all join within about this long.
const WAIT_MS: u64 = 2_000;

/// The waiters table.
pub fn run(server: &Server, report: &mut Report) -> Result<()> {
    report.section(&format!(
        "{WAITERS} waiters timing out on one resource (worst PING while they join and time out)"
    ));
    report.header(&[
        "BLPOP on one empty list",
        "DLOCK.ACQUIRE … WAIT on one held lock",
        "dlock / BLPOP",
    ]);
    let blpop_timeout = (WAIT_MS / 1_000).to_string();
    let blpop =
        worst_ping(server, |_| resp_command(&[b"BLPOP", b"empty", blpop_timeout.as_bytes()]))?;
    let dlock = {
        let mut con = server.try_client()?;
        let _: Option<i64> =
            redis::cmd("DLOCK.ACQUIRE").arg("one").arg("holder").arg(600_000).query(&mut con)?;
        let wait_ms = WAIT_MS.to_string();
        worst_ping(server, |i| {
            let token = format!("waiter-{i}");
            resp_command(&[
                b"DLOCK.ACQUIRE",
                b"one",
                token.as_bytes(),
                b"60000",
                b"WAIT",
                wait_ms.as_bytes(),
            ])
        })?
    };
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1_000.0);
    report.row(&[ms(blpop), ms(dlock), ratio(dlock.as_secs_f64(), blpop.as_secs_f64())]);
    report.note(
        "Each waiter is a connection of its own that sends its command and reads nothing; the \
         worst PING is taken over the joins and the time-outs.",
    );
    flush(server)
}

/// Opens [`WAITERS`] connections sending `request(i)`, and returns the worst PING round trip
/// seen from the first join until every waiter has timed out.
fn worst_ping(server: &Server, request: impl Fn(usize) -> Vec<u8>) -> Result<Duration> {
    let mut probe = server.try_client()?;
    let mut worst = Duration::ZERO;
    let mut ping = |worst: &mut Duration| -> Result<()> {
        let started = Instant::now();
        let _: String = redis::cmd("PING").query(&mut probe)?;
        *worst = (*worst).max(started.elapsed());
        Ok(())
    };
    let mut waiters = Vec::with_capacity(WAITERS);
    for i in 0..WAITERS {
        let mut socket = TcpStream::connect(("127.0.0.1", server.port))?;
        socket.write_all(&request(i))?;
        waiters.push(socket);
        if i % 500 == 0 {
            ping(&mut worst)?;
        }
    }
    let until = Instant::now() + Duration::from_millis(WAIT_MS + 1_500);
    while Instant::now() < until {
        ping(&mut worst)?;
        sleep(Duration::from_millis(1));
    }
    drop(waiters);
    // Let the server see the disconnections before the next case.
    let mut con = server.try_client()?;
    for _ in 0..200 {
        let info: String = redis::cmd("INFO").arg("clients").query(&mut con)?;
        if info_value(&info, "connected_clients").and_then(|n| n.parse::<usize>().ok()) < Some(10) {
            break;
        }
        sleep(Duration::from_millis(10));
    }
    Ok(worst)
}
