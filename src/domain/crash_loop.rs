//! CrashLoopBackOff for heals: an engine whose container keeps dying is
//! re-created after a growing delay, and past a limit within a window it
//! is not re-created at all until its row changes. Pure, so every case is
//! a unit test; the controller keeps the heal times.

use chrono::{DateTime, Utc};
use std::time::Duration;

/// How heals of one engine back off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashLoopPolicy {
    /// The delay before the second heal within the window; it doubles for
    /// each heal after that.
    pub base: Duration,
    /// The longest delay between two heals.
    pub cap: Duration,
    /// How far back heals count.
    pub window: Duration,
    /// After this many heals within the window (at one generation of the
    /// row) the engine is not healed again: the sandbox is `failed` with
    /// reason `crash loop` until its row changes.
    pub limit: usize,
}

impl Default for CrashLoopPolicy {
    /// Heals at 0, 2, 4, 8 and 16 s after the deaths that cause them; a
    /// sixth death within 10 minutes is a crash loop.
    fn default() -> Self {
        Self {
            base: Duration::from_secs(2),
            cap: Duration::from_secs(60),
            window: Duration::from_secs(600),
            limit: 5,
        }
    }
}

/// Whether an engine that died may be healed now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HealGate {
    /// Heal it now.
    Now,
    /// Heal it at this time (back-off after the last heal).
    At(DateTime<Utc>),
    /// It was healed this many times within the window: give up.
    GiveUp(usize),
}

/// Decides from the times of this engine's recent heals (at the row's
/// current generation, in any order).
pub(crate) fn gate(
    heals: &[DateTime<Utc>],
    now: DateTime<Utc>,
    policy: &CrashLoopPolicy,
) -> HealGate {
    let window = chrono::Duration::from_std(policy.window).unwrap_or(chrono::Duration::MAX);
    let recent: Vec<DateTime<Utc>> = heals
        .iter()
        .copied()
        .filter(|t| now.signed_duration_since(*t) <= window)
        .collect();
    let Some(last) = recent.iter().max().copied() else {
        return HealGate::Now;
    };
    if recent.len() >= policy.limit.max(1) {
        return HealGate::GiveUp(recent.len());
    }
    let factor = 1u32 << (recent.len() - 1).min(31);
    let delay = policy
        .base
        .checked_mul(factor)
        .unwrap_or(policy.cap)
        .min(policy.cap);
    let due = chrono::Duration::from_std(delay)
        .ok()
        .and_then(|d| last.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    if now >= due {
        HealGate::Now
    } else {
        HealGate::At(due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn the_first_heal_is_at_once_and_each_later_one_waits_twice_as_long() {
        let p = CrashLoopPolicy::default();
        assert_eq!(gate(&[], at(0), &p), HealGate::Now);
        assert_eq!(gate(&[at(0)], at(1), &p), HealGate::At(at(2)));
        assert_eq!(gate(&[at(0)], at(2), &p), HealGate::Now);
        assert_eq!(gate(&[at(0), at(2)], at(3), &p), HealGate::At(at(6)));
        assert_eq!(
            gate(&[at(0), at(2), at(6)], at(7), &p),
            HealGate::At(at(14))
        );
    }

    #[test]
    fn the_delay_is_capped() {
        let p = CrashLoopPolicy {
            limit: 100,
            ..Default::default()
        };
        let heals: Vec<_> = (0..10).map(|i| at(i * 60)).collect();
        assert_eq!(gate(&heals, at(541), &p), HealGate::At(at(540 + 60)));
    }

    #[test]
    fn past_the_limit_within_the_window_it_gives_up() {
        let p = CrashLoopPolicy::default();
        let heals = [at(0), at(2), at(6), at(14), at(30)];
        assert_eq!(gate(&heals, at(40), &p), HealGate::GiveUp(5));
    }

    #[test]
    fn heals_older_than_the_window_do_not_count() {
        let p = CrashLoopPolicy::default();
        let heals = [at(0), at(2), at(6), at(14), at(30)];
        // At 605 s only the heals at 6, 14 and 30 s count: not a loop.
        assert_eq!(gate(&heals, at(605), &p), HealGate::Now);
        assert_eq!(gate(&[at(0), at(500)], at(601), &p), HealGate::Now);
        assert_eq!(gate(&[at(0), at(600)], at(600), &p), HealGate::At(at(604)));
    }
}
