//! Detects heal loops: a sandbox whose containers keep dying is healed
//! again and again, which the SRE wants to be paged about.

use crate::domain::id::SandboxId;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Remembers recent heals per sandbox (memory only: a restart forgets).
#[derive(Debug)]
pub(crate) struct HealLoops {
    window: Duration,
    threshold: usize,
    seen: Mutex<HashMap<SandboxId, VecDeque<Instant>>>,
}

impl Default for HealLoops {
    /// Three heals within ten minutes make a loop.
    fn default() -> Self {
        Self::new(Duration::from_secs(600), 3)
    }
}

impl HealLoops {
    /// A detector that calls `threshold` heals within `window` a loop.
    pub(crate) fn new(window: Duration, threshold: usize) -> Self {
        Self {
            window,
            threshold: threshold.max(1),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Records one heal of `id`.
    pub(crate) fn record(&self, id: &SandboxId) {
        let mut seen = self.seen.lock().expect("heal loop lock");
        seen.entry(id.clone())
            .or_default()
            .push_back(Instant::now());
    }

    /// Sandboxes healed at least `threshold` times within the window,
    /// sorted; forgets heals older than the window.
    pub(crate) fn looping(&self) -> Vec<SandboxId> {
        let now = Instant::now();
        let mut seen = self.seen.lock().expect("heal loop lock");
        seen.retain(|_, times| {
            while times
                .front()
                .is_some_and(|t| now.duration_since(*t) > self.window)
            {
                times.pop_front();
            }
            !times.is_empty()
        });
        let mut ids: Vec<SandboxId> = seen
            .iter()
            .filter(|(_, times)| times.len() >= self.threshold)
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> SandboxId {
        SandboxId::parse(s).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn three_heals_within_the_window_are_a_loop_and_age_out_after_it() {
        let loops = HealLoops::new(Duration::from_secs(600), 3);
        for _ in 0..3 {
            loops.record(&id("flaky"));
            tokio::time::advance(Duration::from_secs(60)).await;
        }
        loops.record(&id("once"));
        assert_eq!(loops.looping(), vec![id("flaky")]);
        tokio::time::advance(Duration::from_secs(500)).await;
        assert!(loops.looping().is_empty(), "the first heal left the window");
    }

    #[tokio::test(start_paused = true)]
    async fn heals_spread_wider_than_the_window_are_not_a_loop() {
        let loops = HealLoops::new(Duration::from_secs(600), 3);
        for _ in 0..5 {
            loops.record(&id("slow"));
            tokio::time::advance(Duration::from_secs(301)).await;
        }
        assert!(loops.looping().is_empty());
    }
}
