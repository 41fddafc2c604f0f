//! The argument vector of every command form a client sends, built in one place: the command
//! name first, then the fixed arguments, then the options in the order the command pages list
//! them (the server takes options in any order; one order makes the vectors exact).

/// `DLOCK.ACQUIRE`.
pub const ACQUIRE: &str = "DLOCK.ACQUIRE";
/// `DLOCK.RENEW`.
pub const RENEW: &str = "DLOCK.RENEW";
/// `DLOCK.RELEASE`.
pub const RELEASE: &str = "DLOCK.RELEASE";
/// `DLOCK.FENCECHECK`.
pub const FENCECHECK: &str = "DLOCK.FENCECHECK";
/// `DLOCK.FENCED`.
pub const FENCED: &str = "DLOCK.FENCED";
/// `DLOCK.INFO`.
pub const INFO: &str = "DLOCK.INFO";

/// The option keywords of the version 2 commands, as a client sends them (upper case).
pub const OPTIONS: [&str; 8] =
    ["CLAIM", "FENCE", "LIMIT", "META", "NOTIFY", "QUEUE", "SHARED", "WAIT"];

/// One argument vector: the command's name, then its arguments, as bytes.
pub type Args = Vec<Vec<u8>>;

/// The kind of lease an ACQUIRE asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// The only lease on the resource (no option).
    #[default]
    Exclusive,
    /// A reader of a read-write lock: `SHARED`.
    Shared,
    /// One of `n` permits of a semaphore: `SHARED LIMIT n`.
    Permits(u32),
}

/// How an ACQUIRE waits when the lease cannot be granted at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Wait {
    /// Not at all: nil at once.
    #[default]
    No,
    /// `WAIT timeout-ms`: the server blocks the request (0: without limit).
    Block(u64),
    /// `QUEUE ticket-ms`: a place in line that stands this long after each such ACQUIRE.
    Queue(u64),
}

/// A `DLOCK.ACQUIRE` as a client builds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquire<'a> {
    /// The lock's key.
    pub resource: &'a str,
    /// The attempt's token, made before the first send.
    pub token: &'a str,
    /// The lease's length.
    pub ttl_ms: u64,
    /// Exclusive, shared or a permit.
    pub mode: Mode,
    /// No wait, a blocking wait or a ticket.
    pub wait: Wait,
    /// `CLAIM claim-ms`, sent only with a wait or a ticket (a grant answered at once is claimed
    /// by its answer) and never longer than the ttl (a longer window changes nothing).
    pub claim_ms: Option<u64>,
    /// `META value`: what the lease says of its holder.
    pub meta: Option<&'a [u8]>,
    /// `NOTIFY request`, sent only with a ticket: the server tells the ticket's own channel of
    /// its grant, naming the number of the last of these requests it read before.
    pub notify: Option<u64>,
}

impl<'a> Acquire<'a> {
    /// A plain, exclusive ACQUIRE without options.
    pub fn new(resource: &'a str, token: &'a str, ttl_ms: u64) -> Self {
        Self {
            resource,
            token,
            ttl_ms,
            mode: Mode::Exclusive,
            wait: Wait::No,
            claim_ms: None,
            meta: None,
            notify: None,
        }
    }

    /// The argument vector: `DLOCK.ACQUIRE resource token ttl-ms [SHARED [LIMIT n]]
    /// [WAIT timeout-ms | QUEUE ticket-ms [NOTIFY request]] [CLAIM claim-ms] [META value]`.
    pub fn args(&self) -> Args {
        let mut args =
            vec![word(ACQUIRE), word(self.resource), word(self.token), number(self.ttl_ms)];
        match self.mode {
            Mode::Exclusive => {}
            Mode::Shared => args.push(word("SHARED")),
            Mode::Permits(n) => args.extend([word("SHARED"), word("LIMIT"), number(n.into())]),
        }
        let waits = match self.wait {
            Wait::No => false,
            Wait::Block(ms) => {
                args.extend([word("WAIT"), number(ms)]);
                true
            }
            Wait::Queue(ms) => {
                args.extend([word("QUEUE"), number(ms)]);
                if let Some(request) = self.notify {
                    args.extend([word("NOTIFY"), number(request)]);
                }
                true
            }
        };
        if let (true, Some(claim_ms)) = (waits, self.claim_ms) {
            args.extend([word("CLAIM"), number(claim_ms.min(self.ttl_ms))]);
        }
        if let Some(meta) = self.meta {
            args.extend([word("META"), meta.to_vec()]);
        }
        args
    }
}

/// `DLOCK.RENEW resource token ttl-ms [FENCE fence]`: with the grant's fence whenever the
/// server takes it, so that a late or retried RENEW never extends a later grant of the token.
pub fn renew(resource: &str, token: &str, ttl_ms: u64, fence: Option<u64>) -> Args {
    let mut args = vec![word(RENEW), word(resource), word(token), number(ttl_ms)];
    if let Some(fence) = fence {
        args.extend([word("FENCE"), number(fence)]);
    }
    args
}

/// `DLOCK.RELEASE resource token [FENCE fence]`: with the grant's fence when it is known;
/// without it (an attempt whose outcome is unknown) it also takes the token's ticket out of line.
pub fn release(resource: &str, token: &str, fence: Option<u64>) -> Args {
    let mut args = vec![word(RELEASE), word(resource), word(token)];
    if let Some(fence) = fence {
        args.extend([word("FENCE"), number(fence)]);
    }
    args
}

/// `DLOCK.FENCECHECK resource fence`.
pub fn fencecheck(resource: &str, fence: u64) -> Args {
    vec![word(FENCECHECK), word(resource), number(fence)]
}

/// `DLOCK.INFO resource`.
pub fn info(resource: &str) -> Args {
    vec![word(INFO), word(resource)]
}

/// `DLOCK.FENCED resource fence command [arg …]`: `inner` runs only under the live fence.
pub fn fenced<'i>(resource: &str, fence: u64, inner: impl IntoIterator<Item = &'i [u8]>) -> Args {
    let mut args = vec![word(FENCED), word(resource), number(fence)];
    args.extend(inner.into_iter().map(<[u8]>::to_vec));
    args
}

fn word(text: &str) -> Vec<u8> {
    text.as_bytes().to_vec()
}

fn number(n: u64) -> Vec<u8> {
    n.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(args: &Args) -> Vec<String> {
        args.iter().map(|arg| String::from_utf8_lossy(arg).into_owned()).collect()
    }

    #[test]
    fn a_claim_goes_only_with_a_wait_and_never_past_the_ttl() {
        let plain = Acquire { claim_ms: Some(2_000), ..Acquire::new("r", "t", 30_000) };
        assert_eq!(text(&plain.args()), ["DLOCK.ACQUIRE", "r", "t", "30000"]);
        let short = Acquire {
            wait: Wait::Block(5_000),
            claim_ms: Some(2_000),
            ..Acquire::new("r", "t", 500)
        };
        assert_eq!(
            text(&short.args()),
            ["DLOCK.ACQUIRE", "r", "t", "500", "WAIT", "5000", "CLAIM", "500"]
        );
    }
}
