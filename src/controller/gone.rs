//! When this controller first saw each sandbox's desired row missing.
//!
//! A missing row means "delete", but it may also mean that the state
//! database was emptied, restored from an old backup or truncated. The
//! grace window of a deleted row therefore counts from the moment this
//! controller first saw the row gone, not only from when its containers
//! were created (`domain::plan::plan`'s `gone_since`). The times live in
//! memory only: a controller restart starts every clock again, which keeps
//! containers longer, never shorter.
//!
//! Each entry also says whether the sandbox still had containers when a
//! reconcile last looked (its own list of that one sandbox): the reaping
//! breaker counts those as lost rows even when a relist's list of the
//! whole fleet, answered from an older view, does not show them.

use crate::domain::id::SandboxId;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::Mutex;

/// A sandbox whose row was seen missing.
#[derive(Debug, Clone, Copy)]
struct Gone {
    /// When it was first seen missing.
    since: DateTime<Utc>,
    /// It had containers when last seen missing.
    containers: bool,
}

/// First-seen-missing times, keyed by sandbox.
#[derive(Debug, Default)]
pub(crate) struct GoneSince(Mutex<HashMap<SandboxId, Gone>>);

impl GoneSince {
    /// Records that the row of `id` is missing at `now`, and whether the
    /// sandbox has `containers`; returns when the row was first seen
    /// missing (`now`, the first time).
    pub(crate) fn missing(
        &self,
        id: &SandboxId,
        now: DateTime<Utc>,
        containers: bool,
    ) -> DateTime<Utc> {
        let mut map = self.lock();
        let gone = map.entry(id.clone()).or_insert(Gone {
            since: now,
            containers,
        });
        gone.containers = containers;
        gone.since
    }

    /// The sandboxes whose row was missing, with containers, when a
    /// reconcile last looked.
    pub(crate) fn with_containers(&self) -> Vec<SandboxId> {
        self.lock()
            .iter()
            .filter(|(_, gone)| gone.containers)
            .map(|(id, _)| id.clone())
            .collect()
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Gone>> {
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
        assert_eq!(gone.missing(&id, at(10), true), at(10));
        assert_eq!(gone.missing(&id, at(50), true), at(10));
        gone.forget(&id);
        assert_eq!(gone.len(), 0);
        assert_eq!(gone.missing(&id, at(90), true), at(90));
    }

    #[test]
    fn with_containers_lists_what_the_last_look_at_each_sandbox_found() {
        let gone = GoneSince::default();
        let (a, b) = (
            SandboxId::parse("a").unwrap(),
            SandboxId::parse("b").unwrap(),
        );
        gone.missing(&a, at(10), true);
        gone.missing(&b, at(10), true);
        gone.missing(&b, at(20), false);
        assert_eq!(gone.with_containers(), vec![a]);
    }
}
