//! Ownership transitions made visible: keyspace notifications (module class, `dlock.*` events)
//! and greppable `key=value` log lines, verbose for transitions and rate-limited notices for
//! anomalies.

use std::sync::atomic::Ordering;

use std::ffi::CString;

use redis_module::{Context, NotifyEvent, RedisString, RedisValue, raw};

use crate::core::args::printable;
use crate::core::channel;
use crate::core::listeners::Subscribing;
use crate::core::ratelimit::{RateLimit, Verdict};
use crate::core::{Lease, Micros, Now};
use crate::state::{self, Channels, MODULE};

pub use crate::core::effects::Event;

/// Notice lines for anomalies: at most this many a second.
const NOTICES_PER_SECOND: u32 = 10;

/// Log levels of the server log.
#[derive(Clone, Copy)]
pub enum Level {
    /// `verbose`
    Verbose,
    /// `notice`
    Notice,
    /// `warning`
    Warning,
}

/// Writes one line to the server log. The text is passed as data (`"%s"`), never as a format
/// string, so a `%` in a resource name or token cannot make the server read what is not there.
pub fn log(ctx: &Context, level: Level, line: &str) {
    let level = match level {
        Level::Verbose => c"verbose",
        Level::Notice => c"notice",
        Level::Warning => c"warning",
    };
    let Ok(line) = CString::new(line.replace('\0', "?")) else { return };
    // SAFETY: the level and "%s" are NUL-terminated; `line` fills the one %s and outlives the call.
    unsafe {
        if let Some(write) = raw::RedisModule_Log {
            write(ctx.ctx, level.as_ptr(), c"%s".as_ptr(), line.as_ptr());
        }
    }
}

/// Publishes a transition of `resource` (in the selected database) and logs it at verbose level.
pub fn transition(ctx: &Context, what: Event, resource: &RedisString, lease: &Lease, now: Now) {
    // The raw call with a static name: the crate's wrapper builds a C string per event.
    // SAFETY: ctx is live; the event name is NUL-terminated and static; Redis only reads the key.
    unsafe {
        if let Some(notify) = raw::RedisModule_NotifyKeyspaceEvent {
            notify(ctx.ctx, NotifyEvent::MODULE.bits(), what.event().as_ptr(), resource.inner);
        }
    }
    if MODULE.log.verbose.load(Ordering::Relaxed) {
        log(
            ctx,
            Level::Verbose,
            &format!(
                "lease {} resource={} owner={} fence={} ttl-ms={} held-ms={}{}{}",
                what.verb(),
                printable(resource.as_slice()),
                printable(&lease.token),
                lease.fence,
                lease.remaining_ms(now),
                lease.held_ms(now),
                if lease.shared() { " mode=shared" } else { "" },
                lease
                    .token
                    .meta()
                    .map(|meta| format!(" meta={}", printable(meta)))
                    .unwrap_or_default(),
            ),
        );
    }
}

/// Publishes an ownership change of `lease` of `resource` on its channel (`core::channel`):
/// with `SPUBLISH` semantics in Redis Cluster, where the server lets a module publish to a shard
/// channel, else as `PUBLISH`. A hand-over names its new holder by the tag of its token
/// ([`channel::tag`]), so that only that holder's client needs to ask.
pub fn publish(
    ctx: &Context,
    what: Event,
    resource: &RedisString,
    lease: &Lease,
    detail: &[u8],
    now: Micros,
) {
    // Nobody subscribed to the channel: nothing to send (`core/listeners.rs`).
    let resource_name = |out: &mut Vec<u8>| channel::write_name(resource.as_slice(), out);
    let Some(channel) = channel_heard(ctx, now, resource_name) else {
        MODULE.log.messages_unheard.fetch_add(1, Ordering::Relaxed);
        return;
    };
    MODULE.log.messages_published.fetch_add(1, Ordering::Relaxed);
    // Every grant publishes: no allocation and no formatting on this path (a `format!` and two
    // vectors were a sixth of an uncontended ACQUIRE's instructions).
    let mut message = [0; channel::MAX_MESSAGE];
    let holder = (what == Event::Handoff).then_some(&*lease.token);
    let message = channel::write_message(what.word(), lease.fence, holder, &mut message);
    // Only a revocation adds its reason (a rare command: an allocation is fine there).
    let with_detail;
    let message = if detail.is_empty() {
        message
    } else {
        with_detail = [message, b" ", detail].concat();
        &with_detail[..]
    };
    send(ctx, &channel, message);
}

/// Tells the ticket of `lease`'s token on `resource` that it was handed the lease, on the
/// ticket's own channel (`channel::ticket_name`): `granted <fence> <request> <window-ms>`, where
/// `request` is the number of the ticket's last refresh before the hand-over and the window is
/// how long the lease runs unless claimed. A grantee may start on this message alone.
pub fn publish_granted(
    ctx: &Context,
    resource: &RedisString,
    lease: &Lease,
    request: u64,
    now: Micros,
) {
    let own_name = |out: &mut Vec<u8>| {
        channel::write_ticket_name(resource.as_slice(), &lease.token, out);
    };
    let Some(channel) = channel_heard(ctx, now, own_name) else {
        MODULE.log.messages_unheard.fetch_add(1, Ordering::Relaxed);
        return;
    };
    MODULE.log.messages_published.fetch_add(1, Ordering::Relaxed);
    // Floored: the window a client counts from its request's send time is never too long.
    let window_ms = lease.deadline_mono().saturating_sub(lease.granted_mono()) / 1_000;
    let mut message = [0; channel::MAX_GRANTED];
    let message = channel::write_granted(lease.fence, request, window_ms, &mut message);
    send(ctx, &channel, message);
}

/// Publishes `message` on `channel`: as a shard message in Redis Cluster where the server lets
/// a module send one, else as `PUBLISH`.
fn send(ctx: &Context, channel: &RedisString, message: &[u8]) {
    let message = RedisString::create_from_slice(ctx.ctx, message);
    // SAFETY: ctx is live; both strings live until the end of this call.
    unsafe {
        let publish = if in_cluster(ctx) {
            raw::RedisModule_PublishMessageShard.or(raw::RedisModule_PublishMessage)
        } else {
            raw::RedisModule_PublishMessage
        };
        if let Some(publish) = publish {
            publish(ctx.ctx, channel.inner, message.inner);
        }
    }
}

/// The channel of `resource`, if a subscriber may hear it; the server's account of its
/// subscriptions is taken first when the last one is too old.
fn channel_heard(
    ctx: &Context,
    now: Micros,
    write_name: impl FnOnce(&mut Vec<u8>),
) -> Option<RedisString> {
    let mut channels = state::lock(&MODULE.log.channel);
    if channels.as_ref().is_none_or(|channels| channels.listeners.stale(now)) {
        // Read with no lock held: a call into the server may come back into the module.
        drop(channels);
        let account = subscriptions(ctx);
        channels = state::lock(&MODULE.log.channel);
        let listeners = &mut channels.get_or_insert_with(Channels::default).listeners;
        match &account {
            Some((patterns, names)) => {
                listeners.accounted(now, Some((*patterns, names.iter().map(Vec::as_slice))));
            }
            None => listeners.accounted(now, None::<(bool, std::iter::Empty<&[u8]>)>),
        }
    }
    let channels = channels.get_or_insert_with(Channels::default);
    if channels.listeners.nobody() {
        return None;
    }
    // The name's buffer is reused from message to message.
    channels.name.clear();
    write_name(&mut channels.name);
    channels
        .listeners
        .may_hear(&channels.name)
        .then(|| RedisString::create_from_slice(ctx.ctx, &channels.name))
}

/// Most channels and shard channels (dlock's or not) the server may hold for the account to list
/// the dlock ones: `PUBSUB CHANNELS dlock:*` walks every channel of the server, and stalls it
/// while it does (Redis 7.0 on this project's machine: 3 ms for 10,000 channels, 16 ms for
/// 50,000; 1,000 take about 0.3 ms). Beyond this every message is published until the server
/// holds fewer.
pub const ACCOUNT_MAX_CHANNELS: u64 = 1_000;

/// The server's subscriptions that matter: whether any pattern is subscribed, and the dlock
/// channels (and shard channels) with a subscriber; `None` if the server would not say, or holds
/// more than [`ACCOUNT_MAX_CHANNELS`] channels (its counts in `INFO stats` are read first).
fn subscriptions(ctx: &Context) -> Option<(bool, Vec<Vec<u8>>)> {
    let info = ctx.server_info("stats");
    let count = |field: &str| -> u64 {
        info.field(field)
            .and_then(|value| std::str::from_utf8(value.as_slice()).ok()?.parse().ok())
            .unwrap_or(0)
    };
    if count("pubsub_channels") + count("pubsubshard_channels") > ACCOUNT_MAX_CHANNELS {
        return None;
    }
    drop(info);
    let pattern = [channel::PREFIX, b"*"].concat();
    let patterns = match ctx.call("PUBSUB", &[&b"NUMPAT"[..]]).ok()? {
        RedisValue::Integer(n) => n > 0,
        _ => return None,
    };
    let mut names = Vec::new();
    for kind in [&b"CHANNELS"[..], b"SHARDCHANNELS"] {
        let RedisValue::Array(list) = ctx.call("PUBSUB", &[kind, &pattern[..]]).ok()? else {
            return None;
        };
        for name in list {
            match name {
                RedisValue::StringBuffer(bytes) => names.push(bytes),
                RedisValue::SimpleString(text) | RedisValue::BulkString(text) => {
                    names.push(text.into_bytes());
                }
                RedisValue::BulkRedisString(name) => names.push(name.as_slice().to_vec()),
                _ => return None,
            }
        }
    }
    Some((patterns, names))
}

/// A subscribing command is about to run (the command filter saw it): its channels may be
/// heard from now on.
pub fn subscribing(what: Subscribing, names: &[&[u8]]) {
    state::lock(&MODULE.log.channel)
        .get_or_insert_with(Channels::default)
        .listeners
        .subscribe(what, names.iter().copied());
}

/// Whether the server runs in Cluster mode: read once, as `cluster-enabled` cannot change while
/// the server runs.
pub fn in_cluster(ctx: &Context) -> bool {
    *MODULE
        .log
        .in_cluster
        .get_or_init(|| ctx.get_flags().contains(redis_module::ContextFlags::CLUSTER))
}

/// Logs a line at verbose level, built only when the server logs verbose lines.
pub fn verbose(ctx: &Context, line: impl FnOnce() -> String) {
    if MODULE.log.verbose.load(Ordering::Relaxed) {
        log(ctx, Level::Verbose, &line());
    }
}

/// Logs an anomaly at notice level, unless too many were logged this second.
pub fn anomaly(ctx: &Context, now: Now, line: impl FnOnce() -> String) {
    let verdict = state::lock(&MODULE.log.notices)
        .get_or_insert_with(RateLimit::default)
        .check(now.mono, NOTICES_PER_SECOND);
    match verdict {
        Verdict::Suppress => {}
        Verdict::Log => log(ctx, Level::Notice, &line()),
        Verdict::LogAfterSuppressed(n) => {
            log(ctx, Level::Notice, &format!("{n} anomaly lines suppressed in the last second"));
            log(ctx, Level::Notice, &line());
        }
    }
}

/// The value of one server config, as `CONFIG GET` reports it.
fn server_config(ctx: &Context, name: &str) -> Option<String> {
    match ctx.call("CONFIG", &["GET", name]) {
        Ok(RedisValue::Array(values)) => values.into_iter().nth(1).and_then(|value| match value {
            RedisValue::SimpleString(s) | RedisValue::BulkString(s) => Some(s),
            _ => None,
        }),
        _ => None,
    }
}

/// Re-reads the settings that change what the module logs (at load and after CONFIG SET):
/// the log level, and an eviction policy that can drop live leases.
pub fn refresh_log_level(ctx: &Context) {
    let level = server_config(ctx, "loglevel");
    MODULE
        .log
        .verbose
        .store(matches!(level.as_deref(), Some("verbose" | "debug")), Ordering::Relaxed);
    let policy = server_config(ctx, "maxmemory-policy").unwrap_or_default();
    let mut warned = state::lock(&MODULE.log.warned_policy);
    if warned.as_deref() != Some(policy.as_str()) {
        if policy.starts_with("allkeys-") {
            log(
                ctx,
                Level::Warning,
                &format!(
                    "maxmemory-policy is {policy}: eviction can delete a live lease and let another \
                     client acquire it while its holder still works (fences still never repeat); \
                     use noeviction for lock data"
                ),
            );
        }
        *warned = Some(policy);
    }
}
