//! Module configuration, set with `CONFIG SET dlock.<name>` or as load arguments
//! (`--loadmodule libdlock.so max-ttl-ms 60000`).

use std::sync::atomic::{AtomicI64, Ordering};

use redis_module::{Context, RedisString};

use crate::core::args::DEFAULT_MAX_TTL_MS;
use crate::core::{Micros, Rules};

/// The name of `dlock.max-ttl-ms` (without the module's prefix).
pub const MAX_TTL_MS_NAME: &str = "max-ttl-ms";
/// The name of `dlock.restart-grant-delay-ms`.
pub const RESTART_GRANT_DELAY_MS_NAME: &str = "restart-grant-delay-ms";
/// The name of `dlock.max-hold-ms`.
pub const MAX_HOLD_MS_NAME: &str = "max-hold-ms";
/// The name of `dlock.fence-lead-ms`.
pub const FENCE_LEAD_MS_NAME: &str = "fence-lead-ms";
/// Every setting, as registered and as a load argument may name it.
pub const NAMES: [&str; 4] =
    [MAX_TTL_MS_NAME, RESTART_GRANT_DELAY_MS_NAME, MAX_HOLD_MS_NAME, FENCE_LEAD_MS_NAME];

/// `dlock.max-ttl-ms`: the largest `ttl-ms` and `timeout-ms` a command accepts.
pub static MAX_TTL_MS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_TTL_MS as i64);
/// Upper bound of `dlock.max-ttl-ms`: one year.
pub const MAX_TTL_MS_LIMIT: i64 = 365 * 86_400_000;

/// `dlock.restart-grant-delay-ms`: after start-up or promotion, how long no new lease is granted
/// on a resource this server has no lease record for.
pub static RESTART_GRANT_DELAY_MS: AtomicI64 = AtomicI64::new(0);

/// `dlock.max-hold-ms`: no lease lasts longer than this after its grant, however often it is
/// renewed, so a stuck worker's renewal loop cannot keep a lock forever (0: no limit).
pub static MAX_HOLD_MS: AtomicI64 = AtomicI64::new(0);

/// `dlock.fence-lead-ms`: how far ahead of its wall clock a server puts its fence counter when it
/// starts or is promoted, so that a deposed primary that goes on granting for up to this long
/// (minus the clock difference between the two hosts) mints below its successor.
pub static FENCE_LEAD_MS: AtomicI64 = AtomicI64::new(DEFAULT_FENCE_LEAD_MS);
/// Default of `dlock.fence-lead-ms`: 30 seconds.
pub const DEFAULT_FENCE_LEAD_MS: i64 = 30_000;
/// Upper bound of `dlock.fence-lead-ms`: one day.
pub const FENCE_LEAD_MS_LIMIT: i64 = 86_400_000;

/// The rules grants and renewals follow at `now_mono`.
pub fn rules(now_mono: Micros) -> Rules {
    Rules {
        new_grants_held: new_grants_held(now_mono),
        max_hold_ms: MAX_HOLD_MS.load(Ordering::Acquire).max(0) as u64,
    }
}

/// The current `dlock.max-ttl-ms`.
pub fn max_ttl_ms() -> u64 {
    MAX_TTL_MS.load(Ordering::Acquire).max(1) as u64
}

/// Starts the grant delay at `now_mono` (start-up, end of loading, promotion).
pub fn hold_new_grants(now_mono: Micros) {
    let delay_ms = RESTART_GRANT_DELAY_MS.load(Ordering::Acquire).max(0) as u64;
    let until = now_mono.saturating_add(delay_ms.saturating_mul(1_000));
    crate::state::MODULE.grants_held_until.store(until, Ordering::Release);
}

/// Puts the fence counter `dlock.fence-lead-ms` ahead of the wall clock `now_wall` (start-up,
/// end of loading, promotion).
pub fn lead_fences(now_wall: Micros) {
    let lead_ms = FENCE_LEAD_MS.load(Ordering::Acquire).clamp(0, FENCE_LEAD_MS_LIMIT) as u64;
    let mut counter = crate::state::fence_counter();
    counter.lead(now_wall, lead_ms * 1_000);
    crate::state::keep_fences(&counter);
}

/// Whether new grants are still held back at `now_mono`.
pub fn new_grants_held(now_mono: Micros) -> bool {
    now_mono < crate::state::MODULE.grants_held_until.load(Ordering::Acquire)
}

/// The monotonic instant new grants are held back until (in the past when none are).
pub fn grants_held_until() -> Micros {
    crate::state::MODULE.grants_held_until.load(Ordering::Acquire)
}

/// Applies the module's load arguments (`--loadmodule libdlock.so max-ttl-ms 60000 …`): pairs of
/// a setting's name (any case, as `CONFIG SET` takes it) and its value, each set through
/// `CONFIG SET`, so a load argument is checked by the very rules a `CONFIG SET` is (its range, its
/// digits). An unknown name, a name without a value, or a name given twice is refused; the
/// reason names the argument, and the module does not load.
pub fn apply_load_arguments(ctx: &Context, args: &[RedisString]) -> Result<(), String> {
    let args: Vec<String> = args.iter().map(|arg| arg.to_string_lossy()).collect();
    let pairs = load_argument_pairs(&args)?;
    for (name, value) in pairs {
        let setting = format!("dlock.{name}");
        ctx.call("CONFIG", &["SET", setting.as_str(), value]).map_err(|error| {
            format!(
                "load argument {name} {value}: {}",
                error.to_string().trim_start_matches("ERR ")
            )
        })?;
    }
    Ok(())
}

/// The load arguments as (setting name, value) pairs, names in lower case, or why not.
fn load_argument_pairs(args: &[String]) -> Result<Vec<(&'static str, &str)>, String> {
    let mut pairs: Vec<(&'static str, &str)> = Vec::new();
    let mut rest = args.iter();
    while let Some(given) = rest.next() {
        let Some(name) = NAMES.iter().copied().find(|name| name.eq_ignore_ascii_case(given)) else {
            return Err(format!(
                "unknown load argument '{given}' (the settings: {})",
                NAMES.join(", ")
            ));
        };
        let Some(value) = rest.next() else {
            return Err(format!("load argument {name} has no value"));
        };
        if pairs.iter().any(|(seen, _)| *seen == name) {
            return Err(format!("load argument {name} is given twice"));
        }
        pairs.push((name, value));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::load_argument_pairs;

    fn pairs(args: &[&str]) -> Result<Vec<(&'static str, String)>, String> {
        let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
        load_argument_pairs(&args)
            .map(|pairs| pairs.into_iter().map(|(name, value)| (name, value.to_owned())).collect())
    }

    #[test]
    fn load_arguments_are_pairs_of_a_known_name_in_any_case_and_a_value() {
        assert_eq!(pairs(&[]), Ok(vec![]));
        assert_eq!(
            pairs(&["MAX-TTL-MS", "5000", "fence-lead-ms", "0"]),
            Ok(vec![("max-ttl-ms", "5000".to_owned()), ("fence-lead-ms", "0".to_owned())])
        );
        let unknown = pairs(&["bogus", "5"]).unwrap_err();
        assert!(unknown.starts_with("unknown load argument 'bogus' (the settings: max-ttl-ms"));
        assert_eq!(pairs(&["max-ttl-ms"]), Err("load argument max-ttl-ms has no value".into()));
        assert_eq!(
            pairs(&["max-ttl-ms", "5000", "Max-Ttl-Ms", "6000"]),
            Err("load argument max-ttl-ms is given twice".into())
        );
    }
}
