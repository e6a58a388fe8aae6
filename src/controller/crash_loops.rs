//! The times each engine of each sandbox was healed at the row's current
//! generation, for the crash loop back-off (`domain::crash_loop`). Memory
//! only: a controller restart starts counting again.

use crate::domain::id::{EngineName, SandboxId};
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

type Key = (SandboxId, EngineName);
/// The generation the heal times count for, and the times.
type Heals = (i64, Vec<DateTime<Utc>>);

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
            Some((g, times)) if *g == generation => times.clone(),
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
        let entry = map
            .entry((id.clone(), engine))
            .or_insert((generation, Vec::new()));
        if entry.0 != generation {
            *entry = (generation, Vec::new());
        }
        entry.1.retain(|t| at.signed_duration_since(*t) <= window);
        entry.1.push(at);
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
}
