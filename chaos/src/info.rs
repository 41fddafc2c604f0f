//! `DLOCK.INFO` as the harness reads it: the live holders of a resource and its line, parsed from
//! the reply and written to the history as one compact field (`Sample::encode`), read back by the
//! checkers (`Sample::decode`).

/// What one `DLOCK.INFO` showed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Every live lease: token, fence and milliseconds left (rounded up).
    pub holders: Vec<Holder>,
    /// `mode`: whether the first holder is exclusive (`None` without a live lease).
    pub exclusive: Option<bool>,
    /// `holders`: how many leases live, as the server counts them.
    pub live: u64,
    /// `waiters`: blocked clients still connected.
    pub waiters: u64,
    /// `tickets`: tickets standing, not lapsed.
    pub tickets: u64,
    /// `next-waiters`: the first (up to 5) tokens in line.
    pub next: Vec<String>,
}

/// One live lease in a [`Sample`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub token: String,
    pub fence: u64,
    pub ttl_ms: u64,
}

fn text(value: &redis::Value) -> Option<String> {
    match value {
        redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        redis::Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

fn number(value: &redis::Value) -> Option<u64> {
    match value {
        redis::Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

fn list(value: &redis::Value) -> &[redis::Value] {
    match value {
        redis::Value::Array(items) => items,
        _ => &[],
    }
}

impl Sample {
    /// Parses a RESP2 reply of `DLOCK.INFO` (nil: nothing live and nobody waiting).
    pub fn parse(reply: &redis::Value) -> Option<Self> {
        if matches!(reply, redis::Value::Nil) {
            return Some(Self::default());
        }
        let items = list(reply);
        if items.is_empty() {
            return None;
        }
        let mut sample = Self::default();
        let (mut owner, mut fence, mut ttl_ms, mut leases) = (None, None, 0, None);
        for pair in items.chunks(2) {
            let [name, value] = pair else { return None };
            match text(name)?.as_str() {
                "owner" => owner = text(value),
                "fence" => fence = number(value),
                "ttl-ms" => ttl_ms = number(value).unwrap_or(0),
                "waiters" => sample.waiters = number(value).unwrap_or(0),
                "tickets" => sample.tickets = number(value).unwrap_or(0),
                "next-waiters" => sample.next = list(value).iter().filter_map(text).collect(),
                "mode" => sample.exclusive = text(value).map(|mode| mode == "exclusive"),
                "holders" => sample.live = number(value).unwrap_or(0),
                "leases" => leases = Some(list(value)),
                _ => {}
            }
        }
        sample.holders = match leases {
            Some(leases) => leases
                .iter()
                .filter_map(|lease| {
                    let fields = list(lease);
                    Some(Holder {
                        token: text(fields.first()?)?,
                        fence: number(fields.get(1)?)?,
                        ttl_ms: number(fields.get(2)?)?,
                    })
                })
                .collect(),
            None => match (owner, fence) {
                (Some(token), Some(fence)) => vec![Holder { token, fence, ttl_ms }],
                _ => Vec::new(),
            },
        };
        Some(sample)
    }

    /// One history field: `h=token/fence/ttl,… m=x|s|- n=live w=waiters t=tickets q=token,…`
    /// (tokens of the harness have no spaces, commas or slashes).
    pub fn encode(&self) -> String {
        let holders: Vec<String> =
            self.holders.iter().map(|h| format!("{}/{}/{}", h.token, h.fence, h.ttl_ms)).collect();
        let mode = match self.exclusive {
            Some(true) => "x",
            Some(false) => "s",
            None => "-",
        };
        format!(
            "h={} m={mode} n={} w={} t={} q={}",
            holders.join(","),
            self.live,
            self.waiters,
            self.tickets,
            self.next.join(",")
        )
    }

    /// Reads [`Sample::encode`] back.
    pub fn decode(field: &str) -> Option<Self> {
        let mut sample = Self::default();
        for part in field.split(' ') {
            let (name, value) = part.split_once('=')?;
            let items = || value.split(',').filter(|item| !item.is_empty());
            match name {
                "h" => {
                    for holder in items() {
                        let mut parts = holder.split('/');
                        sample.holders.push(Holder {
                            token: parts.next()?.to_owned(),
                            fence: parts.next()?.parse().ok()?,
                            ttl_ms: parts.next()?.parse().ok()?,
                        });
                    }
                }
                "m" => sample.exclusive = (value != "-").then_some(value == "x"),
                "n" => sample.live = value.parse().ok()?,
                "w" => sample.waiters = value.parse().ok()?,
                "t" => sample.tickets = value.parse().ok()?,
                "q" => sample.next = items().map(str::to_owned).collect(),
                _ => return None,
            }
        }
        Some(sample)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> redis::Value {
        redis::Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn a_shared_lock_with_a_line_parses_and_round_trips() {
        let lease = |token: &str, fence: i64, ttl: i64| {
            redis::Value::Array(vec![
                bulk(token),
                redis::Value::Int(fence),
                redis::Value::Int(ttl),
                redis::Value::Nil,
            ])
        };
        let reply = redis::Value::Array(vec![
            bulk("owner"),
            bulk("r-2"),
            bulk("fence"),
            redis::Value::Int(8),
            bulk("ttl-ms"),
            redis::Value::Int(900),
            bulk("waiters"),
            redis::Value::Int(1),
            bulk("next-waiters"),
            redis::Value::Array(vec![bulk("w-3"), bulk("r-4")]),
            bulk("tickets"),
            redis::Value::Int(1),
            bulk("mode"),
            bulk("shared"),
            bulk("holders"),
            redis::Value::Int(2),
            bulk("leases"),
            redis::Value::Array(vec![lease("r-1", 7, 300), lease("r-2", 8, 900)]),
        ]);
        let sample = Sample::parse(&reply).expect("parses");
        assert_eq!(sample.holders.len(), 2);
        assert_eq!(sample.holders[0], Holder { token: "r-1".into(), fence: 7, ttl_ms: 300 });
        assert_eq!(
            (sample.exclusive, sample.live, sample.waiters, sample.tickets),
            (Some(false), 2, 1, 1)
        );
        assert_eq!(sample.next, ["w-3", "r-4"]);
        assert_eq!(Sample::decode(&sample.encode()), Some(sample));
        let empty = Sample::parse(&redis::Value::Nil).expect("nil parses");
        assert_eq!(Sample::decode(&empty.encode()), Some(empty));
    }
}
