//! Whether anybody may hear a resource's channel: a message nobody can receive is not published
//! (it was a ninth of an uncontended ACQUIRE's instructions).
//!
//! The answer errs only on the side of publishing. It starts from the server's own account of
//! its subscriptions (`PUBSUB CHANNELS dlock:*`, `PUBSUB SHARDCHANNELS dlock:*`, `PUBSUB
//! NUMPAT`), taken before the first message and again at most every [`REFRESH_US`] when
//! messages are published, and adds every channel a `SUBSCRIBE` or `SSUBSCRIBE` names as the
//! command filter sees it go by, before it runs. Any pattern subscription (`PSUBSCRIBE`) at all
//! means every message is published. So a channel is skipped only when no subscription to it
//! existed at the last account and none was asked for since; a channel whose subscribers left
//! is published to until the next account. The set holds what was subscribed since the last
//! account, never more.

use std::collections::HashSet;

use super::Micros;

/// How old the account of subscriptions may be when a message is published.
pub const REFRESH_US: Micros = 1_000_000;

/// A subscribing command, as the command filter sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subscribing {
    /// `SUBSCRIBE` or `SSUBSCRIBE`: channels by name.
    Channels,
    /// `PSUBSCRIBE`: patterns.
    Patterns,
}

/// Which subscribing command `name` is, if any (case-insensitive).
pub fn subscribing(name: &[u8]) -> Option<Subscribing> {
    if name.len() < 9 {
        return None;
    }
    if name.eq_ignore_ascii_case(b"subscribe") || name.eq_ignore_ascii_case(b"ssubscribe") {
        Some(Subscribing::Channels)
    } else if name.eq_ignore_ascii_case(b"psubscribe") {
        Some(Subscribing::Patterns)
    } else {
        None
    }
}

/// The channels that may have a subscriber.
#[derive(Clone, Debug, Default)]
pub struct Listeners {
    /// dlock channels subscribed at the last account, or named by a subscription since.
    channels: HashSet<Box<[u8]>>,
    /// Some pattern subscription exists (or the account failed): publish everything.
    everything: bool,
    /// When the last account was taken (monotonic); `None` before the first.
    accounted_at: Option<Micros>,
}

impl Listeners {
    /// Whether a message on `channel` may reach a subscriber.
    pub fn may_hear(&self, channel: &[u8]) -> bool {
        self.accounted_at.is_none()
            || self.everything
            || (!self.channels.is_empty() && self.channels.contains(channel))
    }

    /// Whether no message on any channel can reach a subscriber (so no channel's name need be
    /// written to ask [`Listeners::may_hear`]).
    pub fn nobody(&self) -> bool {
        self.accounted_at.is_some() && !self.everything && self.channels.is_empty()
    }

    /// Whether the account must be taken again before publishing at `now`.
    pub fn stale(&self, now: Micros) -> bool {
        self.accounted_at.is_none_or(|at| now.saturating_sub(at) >= REFRESH_US)
    }

    /// A subscribing command is about to run with these arguments (channels or patterns).
    pub fn subscribe<'a>(&mut self, what: Subscribing, names: impl Iterator<Item = &'a [u8]>) {
        match what {
            Subscribing::Patterns => self.everything = true,
            Subscribing::Channels => {
                for name in names.filter(|name| name.starts_with(super::channel::PREFIX)) {
                    if !self.channels.contains(name) {
                        self.channels.insert(name.into());
                    }
                }
            }
        }
    }

    /// The server's account at `now`: the dlock channels with a subscriber, and whether any
    /// pattern is subscribed; `None` when it could not be read (then everything is published
    /// until the next account).
    pub fn accounted<'a>(
        &mut self,
        now: Micros,
        account: Option<(bool, impl Iterator<Item = &'a [u8]>)>,
    ) {
        self.accounted_at = Some(now);
        self.channels.clear();
        match account {
            Some((patterns, channels)) => {
                self.everything = patterns;
                self.channels.extend(channels.map(Box::from));
            }
            None => self.everything = true,
        }
        self.channels.shrink_to(64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &[u8] = b"dlock:{a}";
    const B: &[u8] = b"dlock:{b}";

    fn none() -> std::iter::Empty<&'static [u8]> {
        std::iter::empty()
    }

    #[test]
    fn before_the_first_account_every_message_is_published() {
        let listeners = Listeners::default();
        assert!(listeners.may_hear(A));
        assert!(listeners.stale(0));
    }

    #[test]
    fn a_channel_is_skipped_only_when_unsubscribed_at_the_account_and_not_asked_for_since() {
        let mut listeners = Listeners::default();
        listeners.accounted(10, Some((false, [A].into_iter())));
        assert!(listeners.may_hear(A) && !listeners.may_hear(B));
        assert!(!listeners.stale(10 + REFRESH_US - 1) && listeners.stale(10 + REFRESH_US));
        listeners.subscribe(Subscribing::Channels, [&b"other"[..], B].into_iter());
        assert!(listeners.may_hear(B), "a SUBSCRIBE seen going by counts at once");
        assert!(!listeners.may_hear(b"other"), "channels of others are not kept");
        listeners.accounted(20, Some((false, none())));
        assert!(!listeners.may_hear(A) && !listeners.may_hear(B), "they left: the set shrinks");
    }

    #[test]
    fn any_pattern_or_a_failed_account_publishes_everything_until_the_next_account() {
        let mut listeners = Listeners::default();
        listeners.accounted(0, Some((false, none())));
        listeners.subscribe(Subscribing::Patterns, [&b"news.*"[..]].into_iter());
        assert!(listeners.may_hear(A));
        listeners.accounted(1, Some((true, none())));
        assert!(listeners.may_hear(B));
        listeners.accounted(2, None::<(bool, std::iter::Empty<&[u8]>)>);
        assert!(listeners.may_hear(A));
        listeners.accounted(3, Some((false, none())));
        assert!(!listeners.may_hear(A));
    }

    #[test]
    fn nobody_is_said_only_when_no_channel_may_hear() {
        let mut listeners = Listeners::default();
        let agrees = |l: &Listeners| !l.nobody() || [A, B, b"other"].iter().all(|c| !l.may_hear(c));
        assert!(!listeners.nobody(), "before the first account");
        listeners.accounted(0, Some((false, none())));
        assert!(listeners.nobody() && agrees(&listeners));
        listeners.subscribe(Subscribing::Channels, [B].into_iter());
        assert!(!listeners.nobody() && agrees(&listeners), "a SUBSCRIBE going by");
        listeners.accounted(1, Some((false, none())));
        assert!(listeners.nobody());
        listeners.subscribe(Subscribing::Patterns, [&b"x*"[..]].into_iter());
        assert!(!listeners.nobody() && agrees(&listeners), "a pattern");
        listeners.accounted(2, None::<(bool, std::iter::Empty<&[u8]>)>);
        assert!(!listeners.nobody(), "a failed account");
    }

    #[test]
    fn subscribing_commands_are_recognised_whatever_their_case() {
        assert_eq!(subscribing(b"SUBSCRIBE"), Some(Subscribing::Channels));
        assert_eq!(subscribing(b"ssubscribe"), Some(Subscribing::Channels));
        assert_eq!(subscribing(b"PSubscribe"), Some(Subscribing::Patterns));
        for other in [&b"set"[..], b"unsubscribe", b"publish", b"subscribex", b""] {
            assert_eq!(subscribing(other), None, "{:?}", String::from_utf8_lossy(other));
        }
    }
}
