//! CrashLoopBackOff for heals: an engine whose container keeps dying on
//! its own is re-created after a growing delay, up to a cap, and keeps
//! being re-created (as Kubernetes restarts a pod's container): a sandbox
//! is never given up on, so its credentials are never dropped. Only the
//! engine's own deaths count (`domain::death`): a container killed,
//! stopped or removed from outside is healed at once, every time. Pure,
//! so every case is a unit test; the controller keeps the heal times.

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
    /// How far back heals count: an engine that ran this long without
    /// dying starts afresh.
    pub window: Duration,
}

impl Default for CrashLoopPolicy {
    /// Heals at 0, 2, 4, 8, 16, 32 s after the deaths that cause them,
    /// then every 60 s, for as long as it keeps dying; 10 minutes without
    /// a death start afresh.
    fn default() -> Self {
        Self {
            base: Duration::from_secs(2),
            cap: Duration::from_secs(60),
            window: Duration::from_secs(600),
        }
    }
}

/// Whether an engine that died may be healed now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HealGate {
    /// Heal it now.
    Now,
    /// Heal it at `at` (back-off after the last heal): it was healed
    /// `heals` times within the window and keeps dying.
    At {
        /// When.
        at: DateTime<Utc>,
        /// Its heals within the window.
        heals: usize,
    },
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
        HealGate::At {
            at: due,
            heals: recent.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + secs, 0).unwrap()
    }

    fn wait(secs: i64, heals: usize) -> HealGate {
        HealGate::At {
            at: at(secs),
            heals,
        }
    }

    #[test]
    fn heals_back_off_doubling_to_the_cap_and_never_stop() {
        let p = CrashLoopPolicy::default();
        let every_minute: Vec<_> = (0..30).map(|i| at(i * 20)).collect();
        let table: [(&str, &[DateTime<Utc>], i64, HealGate); 9] = [
            ("the first heal is at once", &[], 0, HealGate::Now),
            ("the second waits the base", &[at(0)], 1, wait(2, 1)),
            ("and goes once it passed", &[at(0)], 2, HealGate::Now),
            (
                "each later one twice as long",
                &[at(0), at(2)],
                3,
                wait(6, 2),
            ),
            ("", &[at(0), at(2), at(6)], 7, wait(14, 3)),
            (
                "capped, and still trying after thirty heals in ten minutes",
                &every_minute,
                581,
                wait(580 + 60, 30),
            ),
            (
                "heals older than the window do not count",
                &[at(0), at(2), at(6), at(14), at(30)],
                605,
                HealGate::Now,
            ),
            ("", &[at(0), at(500)], 601, HealGate::Now),
            ("", &[at(0), at(600)], 600, wait(604, 2)),
        ];
        for (case, heals, now, want) in table {
            assert_eq!(gate(heals, at(now), &p), want, "{case}");
        }
    }
}
