//! Reading replies: `DLOCK.INFO` in both of its shapes (RESP2: an array of alternating names and
//! values; RESP3: a map), read by field name so that later fields change nothing, and the
//! leader an election's `DLOCK.INFO` shows. A client turns its library's reply value into a
//! [`Reply`] and reads it here.

/// A reply as RESP carries it, the parts dlock's replies use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Nil (RESP2) or Null (RESP3).
    Nil,
    /// An integer.
    Int(i64),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// A simple string.
    Simple(String),
    /// An array.
    Array(Vec<Reply>),
    /// A map (RESP3), in the server's order.
    Map(Vec<(Reply, Reply)>),
    /// An error reply, code first.
    Error(String),
}

impl Reply {
    /// A bulk or simple string as text (bytes that are not UTF-8 replaced); `None` otherwise.
    pub fn text(&self) -> Option<String> {
        match self {
            Self::Bulk(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            Self::Simple(text) => Some(text.clone()),
            _ => None,
        }
    }

    /// An integer, or a string of one (some proxies turn integers into strings).
    pub fn int(&self) -> Option<i64> {
        match self {
            Self::Int(n) => Some(*n),
            other => other.text()?.parse().ok(),
        }
    }

    /// The name/value pairs of an array or a map; `None` for anything else.
    pub fn pairs(&self) -> Option<Vec<(&Reply, &Reply)>> {
        match self {
            Self::Array(items) => {
                Some(items.chunks_exact(2).map(|pair| (&pair[0], &pair[1])).collect())
            }
            Self::Map(pairs) => Some(pairs.iter().map(|(name, value)| (name, value)).collect()),
            _ => None,
        }
    }
}

/// A reply that does not have the shape its command promises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeError(pub String);

impl std::fmt::Display for ShapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unexpected reply shape: {}", self.0)
    }
}

impl std::error::Error for ShapeError {}

/// One live shared lease, as `DLOCK.INFO`'s `leases` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Its token.
    pub token: String,
    /// Its fence.
    pub fence: u64,
    /// Milliseconds left.
    pub ttl_ms: u64,
    /// Its `META`.
    pub meta: Option<String>,
}

/// What `DLOCK.INFO` shows of a resource with a live lease or a line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Info {
    /// The token of the lease the first fields show (for shared leases, the newest).
    pub owner: Option<String>,
    /// Its fence.
    pub fence: Option<u64>,
    /// Milliseconds left (0 without a lease).
    pub ttl_ms: u64,
    /// Blocked `WAIT` waiters.
    pub waiters: u64,
    /// Up to 5 tokens at the head of the line.
    pub next_waiters: Vec<String>,
    /// Standing `QUEUE` tickets.
    pub tickets: u64,
    /// `exclusive`, `shared`, or `None` without a lease (and from a version 1 server).
    pub mode: Option<String>,
    /// How many leases live.
    pub holders: u64,
    /// The `META` of the lease the first fields show.
    pub meta: Option<String>,
    /// Every shared lease, oldest grant first (empty for an exclusive lease).
    pub leases: Vec<Holder>,
}

/// Who leads an election: the holder of its live exclusive lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's token: one per campaign, so one per term.
    pub token: String,
    /// The term's fence: every later term has a larger one, so it serves as an epoch.
    pub fence: u64,
    /// The address the leader campaigned with (the lease's `META`), if any.
    pub address: Option<String>,
}

/// Reads a `DLOCK.INFO` reply: `None` for nil (no lease, nobody waiting).
pub fn info(reply: &Reply) -> Result<Option<Info>, ShapeError> {
    if *reply == Reply::Nil {
        return Ok(None);
    }
    let pairs =
        reply.pairs().ok_or_else(|| ShapeError(format!("DLOCK.INFO answered {reply:?}")))?;
    let field = |wanted: &str| {
        pairs.iter().find(|(name, _)| name.text().as_deref() == Some(wanted)).map(|(_, v)| *v)
    };
    let count = |wanted: &str| {
        field(wanted).and_then(Reply::int).and_then(|n| u64::try_from(n).ok()).unwrap_or(0)
    };
    let list = |wanted: &str| match field(wanted) {
        Some(Reply::Array(items)) => items.as_slice(),
        _ => &[],
    };
    let leases = list("leases")
        .iter()
        .filter_map(|lease| match lease {
            Reply::Array(parts) if parts.len() >= 4 => Some(Holder {
                token: parts[0].text()?,
                fence: u64::try_from(parts[1].int()?).ok()?,
                ttl_ms: u64::try_from(parts[2].int()?).ok()?,
                meta: parts[3].text(),
            }),
            _ => None,
        })
        .collect();
    Ok(Some(Info {
        owner: field("owner").and_then(Reply::text),
        fence: field("fence").and_then(Reply::int).and_then(|n| u64::try_from(n).ok()),
        ttl_ms: count("ttl-ms"),
        waiters: count("waiters"),
        next_waiters: list("next-waiters").iter().filter_map(Reply::text).collect(),
        tickets: count("tickets"),
        mode: field("mode").and_then(Reply::text),
        holders: count("holders"),
        meta: field("meta").and_then(Reply::text),
        leases,
    }))
}

impl Info {
    /// The leader this shows: the holder of a live exclusive lease. Shared leases lead nothing
    /// (a misuse of an election's name); a version 1 server shows no mode, and its live lease
    /// is exclusive.
    pub fn leader(&self) -> Option<Leader> {
        if self.mode.as_deref().is_some_and(|mode| mode != "exclusive") {
            return None;
        }
        Some(Leader { token: self.owner.clone()?, fence: self.fence?, address: self.meta.clone() })
    }
}

/// The leader a `DLOCK.INFO` reply shows, if any (a reply of another shape shows none).
pub fn leader(reply: &Reply) -> Option<Leader> {
    info(reply).ok().flatten()?.leader()
}
