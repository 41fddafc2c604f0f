//! The history: every operation a worker invokes and how it ended, with a monotonic timestamp
//! shared by all processes on the machine (CLOCK_MONOTONIC), one tab-separated line each.

use std::io::Write;

/// Nanoseconds on CLOCK_MONOTONIC: comparable across the processes of one machine.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What an operation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// DLOCK.ACQUIRE (with WAIT), through the client; for the mixed workers also a plain
    /// ACQUIRE and the re-sent ACQUIRE that claims a hand-over (its fence is the grant's).
    Acquire,
    /// A DLOCK.FENCED RPUSH to the resource's Redis register.
    RedisWrite,
    /// A fenced read-modify-write of the resource's PostgreSQL row.
    SqlWrite,
    /// The owner-checked RELEASE at the end of `run` (fence 0: a token released after an
    /// acquire whose outcome stayed unknown).
    Release,
    /// `run` reported the lease lost (no invoke; `Ok` only).
    Lost,
    /// `DLOCK.RENEW … FENCE` of a mixed worker: `Ok` renewed, `Fail` refused (the lease is over).
    Renew,
    /// A mixed worker's use of its lease that is not a register write: `DLOCK.FENCED` around a
    /// read (a reader) or an `INCR` (a permit); `Fail` is `STALE`.
    Use,
    /// `DLOCK.ACQUIRE … QUEUE`: a ticket taken or refreshed (`Fail`: nil, still in line) or
    /// granted (`Ok` with the fence).
    Queue,
    /// A waiter abandoned on purpose: `ACQUIRE … WAIT … CLAIM` sent on a connection that is never
    /// read (`Ok` once it is seen in line, `Fail` when it is not), or a ticket no longer
    /// refreshed (`Ok` only, no invoke).
    Abandon,
    /// The observer's `DLOCK.INFO` of one resource, read on the primary itself.
    Observe,
}

/// How an operation ended; `Invoke` opens it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Invoke,
    Ok,
    /// Definitely did not happen.
    Fail,
    /// May or may not have happened.
    Unknown,
}

/// One line of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub at: u64,
    pub worker: u32,
    pub op: Op,
    pub kind: Kind,
    pub resource: String,
    /// The lease's fence (0 when none yet).
    pub fence: u64,
    /// The lease's token, or the written entry, or the failure's reason.
    pub detail: String,
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Acquire => "acquire",
        Op::RedisWrite => "redis-write",
        Op::SqlWrite => "sql-write",
        Op::Release => "release",
        Op::Lost => "lost",
        Op::Renew => "renew",
        Op::Use => "use",
        Op::Queue => "queue",
        Op::Abandon => "abandon",
        Op::Observe => "observe",
    }
}

const OPS: [Op; 10] = [
    Op::Acquire,
    Op::RedisWrite,
    Op::SqlWrite,
    Op::Release,
    Op::Lost,
    Op::Renew,
    Op::Use,
    Op::Queue,
    Op::Abandon,
    Op::Observe,
];

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Invoke => "invoke",
        Kind::Ok => "ok",
        Kind::Fail => "fail",
        Kind::Unknown => "unknown",
    }
}

impl Event {
    /// The event as one history line (no tabs or newlines in `detail`).
    pub fn line(&self) -> String {
        let detail: String =
            self.detail.chars().map(|c| if c == '\t' || c == '\n' { ' ' } else { c }).collect();
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            self.at,
            self.worker,
            op_name(self.op),
            kind_name(self.kind),
            self.resource,
            self.fence,
            detail
        )
    }

    /// Parses [`Event::line`]; `None` for a torn last line of a killed worker.
    pub fn parse(line: &str) -> Option<Self> {
        let mut fields = line.splitn(7, '\t');
        let at = fields.next()?.parse().ok()?;
        let worker = fields.next()?.parse().ok()?;
        let name = fields.next()?;
        let op = OPS.into_iter().find(|&op| op_name(op) == name)?;
        let kind = match fields.next()? {
            "invoke" => Kind::Invoke,
            "ok" => Kind::Ok,
            "fail" => Kind::Fail,
            "unknown" => Kind::Unknown,
            _ => return None,
        };
        let resource = fields.next()?.to_owned();
        let fence = fields.next()?.parse().ok()?;
        let detail = fields.next()?.to_owned();
        Some(Self { at, worker, op, kind, resource, fence, detail })
    }
}

/// Appends events to a worker's history file, one flushed line each (a SIGKILL loses at most
/// the line being written).
pub struct Log {
    file: std::fs::File,
    worker: u32,
}

impl Log {
    pub fn create(path: &std::path::Path, worker: u32) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self { file, worker })
    }

    pub fn record(&mut self, op: Op, kind: Kind, resource: &str, fence: u64, detail: &str) {
        let event = Event {
            at: now_ns(),
            worker: self.worker,
            op,
            kind,
            resource: resource.to_owned(),
            fence,
            detail: detail.to_owned(),
        };
        // A failed history write would hide operations: stop the worker rather than lie.
        if let Err(error) = writeln!(self.file, "{}", event.line()) {
            eprintln!("worker {}: cannot write history: {error}", self.worker);
            std::process::exit(3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_parses_back_to_its_event() {
        let event = Event {
            at: 12,
            worker: 3,
            op: Op::SqlWrite,
            kind: Kind::Unknown,
            resource: "res:{1}".into(),
            fence: 99,
            detail: "timed\tout".into(),
        };
        let parsed = Event::parse(&event.line()).expect("parses");
        assert_eq!(parsed, Event { detail: "timed out".into(), ..event });
        assert_eq!(Event::parse("12\t3\tacq"), None, "a torn line is skipped");
    }

    #[test]
    fn every_op_parses_back() {
        for op in OPS {
            let event = Event {
                at: 1,
                worker: 2,
                op,
                kind: Kind::Ok,
                resource: "rw:{0}".into(),
                fence: 3,
                detail: "w-2-ab-1 claim=300".into(),
            };
            assert_eq!(Event::parse(&event.line()), Some(event));
        }
    }
}
