//! When this controller first saw each sandbox's desired row missing.
//!
//! A missing row means "delete", but it may also mean that the state
//! database was emptied, restored from an old backup or truncated. The
//! grace window of a deleted row therefore counts from the moment this
//! controller first saw the row gone, not only from when its containers
//! were created (`domain::plan::plan`'s `gone_since`). The times live in
//! memory only: a controller restart starts every clock again, which keeps
//! containers longer, never shorter.

use crate::domain::id::SandboxId;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::Mutex;

/// First-seen-missing times, keyed by sandbox.
#[derive(Debug, Default)]
pub(crate) struct GoneSince(Mutex<HashMap<SandboxId, DateTime<Utc>>>);

impl GoneSince {
    /// Records that the row of `id` is missing at `now` and returns when it
    /// was first seen missing (`now`, the first time).
    pub(crate) fn missing(&self, id: &SandboxId, now: DateTime<Utc>) -> DateTime<Utc> {
        *self.lock().entry(id.clone()).or_insert(now)
    }

    /// Forgets `id`: its row exists again, or nothing of it is left.
    pub(crate) fn forget(&self, id: &SandboxId) {
        self.lock().remove(id);
    }

    /// Forgets everything (a new leadership term starts its clocks again).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// How many sandboxes are remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, DateTime<Utc>>> {
        // A panic elsewhere while holding the lock cannot leave the map
        // half-written: every operation is one map call.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
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
    fn the_first_time_a_row_is_seen_missing_is_kept_until_it_is_forgotten() {
        let gone = GoneSince::default();
        let id = SandboxId::parse("a").unwrap();
        assert_eq!(gone.missing(&id, at(10)), at(10));
        assert_eq!(gone.missing(&id, at(50)), at(10));
        gone.forget(&id);
        assert_eq!(gone.len(), 0);
        assert_eq!(gone.missing(&id, at(90)), at(90));
    }
}
