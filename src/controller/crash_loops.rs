//! The times each engine of each sandbox was healed of its own deaths at
//! the row's current generation, for the crash loop back-off
//! (`domain::crash_loop`), and whether its last heal failed to come up.
//! Memory only: a controller restart starts counting again.

use crate::domain::id::{EngineName, SandboxId};
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

type Key = (SandboxId, EngineName);

/// One engine's record.
#[derive(Debug, Default)]
struct Heals {
    /// The generation the heal times count for.
    generation: i64,
    /// The times.
    times: Vec<DateTime<Utc>>,
    /// Why its last heal failed, if it did (its new container was
    /// removed, so the next heal finds it gone: that is the engine's
    /// doing, not an order). Kept until a heal comes up, so that every
    /// status written while the back-off holds the next heal says why.
    failure: Option<String>,
}

/// Heal times by sandbox and engine, with the generation they count for.
#[derive(Debug, Default)]
pub(crate) struct CrashLoops(Mutex<HashMap<Key, Heals>>);

impl CrashLoops {
    /// The heals of `engine` of `id` at `generation` (none once the row
    /// changed: a new generation starts afresh).
    pub(crate) fn heals(
        &self,
        id: &SandboxId,
        engine: EngineName,
        generation: i64,
    ) -> Vec<DateTime<Utc>> {
        match self.lock().get(&(id.clone(), engine)) {
            Some(h) if h.generation == generation => h.times.clone(),
            _ => Vec::new(),
        }
    }

    /// Records a heal at `at`, forgetting heals older than `window`.
    pub(crate) fn record(
        &self,
        id: &SandboxId,
        engine: EngineName,
        generation: i64,
        at: DateTime<Utc>,
        window: Duration,
    ) {
        let window = chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX);
        let mut map = self.lock();
        let entry = map.entry((id.clone(), engine)).or_insert(Heals {
            generation,
            ..Heals::default()
        });
        if entry.generation != generation {
            *entry = Heals {
                generation,
                ..Heals::default()
            };
        }
        entry
            .times
            .retain(|t| at.signed_duration_since(*t) <= window);
        entry.times.push(at);
    }

    /// Records how a heal of `engine` of `id` went: `failure` says why it
    /// did not come up (`None`: it came up).
    pub(crate) fn heal_done(&self, id: &SandboxId, engine: EngineName, failure: Option<&str>) {
        let mut map = self.lock();
        match (map.get_mut(&(id.clone(), engine)), failure) {
            (Some(h), failure) => h.failure = failure.map(str::to_owned),
            (None, Some(failure)) => {
                map.insert(
                    (id.clone(), engine),
                    Heals {
                        failure: Some(failure.to_owned()),
                        ..Heals::default()
                    },
                );
            }
            (None, None) => {}
        }
    }

    /// Why the last heal of `engine` of `id` failed to come up, if it did.
    pub(crate) fn last_heal_failure(&self, id: &SandboxId, engine: EngineName) -> Option<String> {
        self.lock()
            .get(&(id.clone(), engine))
            .and_then(|h| h.failure.clone())
    }

    /// Forgets every engine of `id` (nothing of it is left).
    pub(crate) fn forget(&self, id: &SandboxId) {
        self.lock().retain(|(sandbox, _), _| sandbox != id);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Heals>> {
        // Every operation is one map call: a panic elsewhere cannot leave
        // the map half-written.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn heals_count_for_one_generation_and_age_out_of_the_window() {
        let loops = CrashLoops::default();
        let id = SandboxId::parse("a").unwrap();
        let e = EngineName::of_engine("redis");
        let at = |s: i64| Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap();
        let window = Duration::from_secs(600);
        loops.record(&id, e, 1, at(0), window);
        loops.record(&id, e, 1, at(10), window);
        assert_eq!(loops.heals(&id, e, 1), [at(0), at(10)]);
        assert!(
            loops.heals(&id, e, 2).is_empty(),
            "a new generation starts afresh"
        );
        loops.record(&id, e, 1, at(605), window);
        assert_eq!(loops.heals(&id, e, 1), [at(10), at(605)]);
        loops.record(&id, e, 2, at(606), window);
        assert_eq!(loops.heals(&id, e, 2), [at(606)]);
        loops.forget(&id);
        assert!(loops.heals(&id, e, 2).is_empty());
    }

    #[test]
    fn a_failed_heal_is_remembered_until_one_comes_up() {
        let loops = CrashLoops::default();
        let id = SandboxId::parse("a").unwrap();
        let e = EngineName::of_engine("redis");
        assert_eq!(loops.last_heal_failure(&id, e), None);
        loops.heal_done(&id, e, Some("not ready"));
        assert_eq!(
            loops.last_heal_failure(&id, e).as_deref(),
            Some("not ready")
        );
        loops.heal_done(&id, e, Some("not ready again"));
        assert_eq!(
            loops.last_heal_failure(&id, e).as_deref(),
            Some("not ready again")
        );
        loops.heal_done(&id, e, None);
        assert_eq!(loops.last_heal_failure(&id, e), None);
    }
}
