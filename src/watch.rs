//! Watches as hints: Postgres NOTIFY and the Docker event stream only say
//! which sandbox to look at. Both reconnect with backoff, and every
//! reconnect asks for a relist, because what happened while disconnected
//! is lost (NOTIFY) or only partly replayed (Docker).

use crate::id::SandboxId;
use crate::labels;
use crate::metrics::Metrics;
use crate::runtime::ContainerState;
use crate::store;
use backon::{BackoffBuilder, ExponentialBuilder};
use bollard::query_parameters::EventsOptionsBuilder;
use bollard::Docker;
use futures::StreamExt;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Container events that may mean a sandbox needs attention.
pub const DOCKER_ACTIONS: &[&str] = &[
    "create",
    "start",
    "die",
    "oom",
    "kill",
    "stop",
    "destroy",
    "health_status",
];

/// What a watcher does with what it sees.
pub trait Sink: Send + Sync + 'static {
    /// A sandbox may need reconciling.
    fn hint(&self, id: SandboxId);
    /// Look at the sandbox again after `delay` (in addition to any hint).
    fn hint_later(&self, id: SandboxId, delay: Duration);
    /// The stream reconnected: anything may have been missed.
    fn relist(&self);
}

/// Docker reports `die` (and `kill`, `stop`, `oom`) before its container
/// list shows the container as exited, so a reconcile woken by the event
/// alone may still see it running. These actions are looked at again once
/// the list has settled.
const SETTLE: Duration = Duration::from_secs(1);

/// Actions whose effect the container list may show late.
fn settles_late(action: &str) -> bool {
    matches!(action, "die" | "kill" | "stop" | "oom" | "destroy")
}

/// Container states as the event stream reported them, so a relist can
/// tell what the events missed (drift).
#[derive(Debug, Default)]
pub struct KnownContainers(Mutex<HashMap<String, ContainerState>>);

impl KnownContainers {
    fn record(&self, id: &str, action: &str) {
        let state = match action {
            "create" => Some(ContainerState::Created),
            "start" => Some(ContainerState::Running),
            "die" | "stop" | "oom" => Some(ContainerState::Exited),
            "destroy" => None,
            _ => return,
        };
        let mut known = self.0.lock().expect("known containers lock");
        match state {
            Some(s) => {
                known.insert(id.to_owned(), s);
            }
            None => {
                known.remove(id);
            }
        }
    }

    /// Replaces what is known with a full listing and returns how many
    /// containers differ from what the events said (appeared, vanished or
    /// changed state without an event).
    pub fn reconcile_with(&self, listed: &[(String, ContainerState)]) -> usize {
        let mut known = self.0.lock().expect("known containers lock");
        let mut drift = 0;
        let mut fresh = HashMap::with_capacity(listed.len());
        for (id, state) in listed {
            if *state == ContainerState::Removing {
                continue;
            }
            if known.remove(id) != Some(*state) {
                drift += 1;
            }
            fresh.insert(id.clone(), *state);
        }
        drift += known.len();
        *known = fresh;
        drift
    }
}

fn backoff() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times()
        .build()
}

/// A stream that stayed up this long resets the reconnect backoff.
const HEALTHY_AFTER: Duration = Duration::from_secs(30);

/// Follows Docker events for `deployment`'s containers until aborted.
pub async fn watch_docker(
    docker: Docker,
    deployment_label: String,
    known: Arc<KnownContainers>,
    metrics: Arc<Metrics>,
    sink: Arc<dyn Sink>,
) {
    let mut delays = backoff();
    let mut since: Option<i64> = None;
    loop {
        let filters = HashMap::from([
            ("type", vec!["container".to_owned()]),
            ("label", vec![deployment_label.clone()]),
            (
                "event",
                DOCKER_ACTIONS.iter().map(|s| s.to_string()).collect(),
            ),
        ]);
        let mut options = EventsOptionsBuilder::default().filters(&filters);
        if let Some(t) = since {
            // Ask Docker to replay what its buffer still has since the last event.
            options = options.since(&t.to_string());
        }
        let started = tokio::time::Instant::now();
        let mut stream = docker.events(Some(options.build()));
        let error = loop {
            match stream.next().await {
                Some(Ok(event)) => {
                    if let Some(t) = event.time {
                        since = Some(t);
                    }
                    let action = event.action.unwrap_or_default();
                    // "health_status: healthy" carries the status after a colon.
                    let action = action.split(':').next().unwrap_or_default().to_owned();
                    metrics.docker_events.with_label_values(&[&action]).inc();
                    let Some(actor) = event.actor else { continue };
                    if let Some(id) = &actor.id {
                        known.record(id, &action);
                    }
                    let sandbox = actor
                        .attributes
                        .as_ref()
                        .and_then(|a| a.get(labels::SANDBOX))
                        .and_then(|s| SandboxId::parse(s).ok());
                    if let Some(sandbox) = sandbox {
                        tracing::debug!(sandbox = %sandbox, action = action.as_str(), "docker event");
                        if settles_late(&action) {
                            sink.hint_later(sandbox.clone(), SETTLE);
                        }
                        sink.hint(sandbox);
                    }
                }
                Some(Err(e)) => break e.to_string(),
                None => break "stream ended".to_owned(),
            }
        };
        metrics.stream_restarts.with_label_values(&["docker"]).inc();
        if started.elapsed() > HEALTHY_AFTER {
            delays = backoff();
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(30));
        tracing::warn!(
            error = error.as_str(),
            retry_in_ms = delay.as_millis() as u64,
            "docker event stream dropped; reconnecting"
        );
        tokio::time::sleep(delay).await;
        sink.relist();
    }
}

/// Follows NOTIFY on `sandbox_desired` until aborted. `listener` must
/// already be listening (subscribe before the initial list).
pub async fn watch_desired(
    mut listener: PgListener,
    pool: PgPool,
    metrics: Arc<Metrics>,
    sink: Arc<dyn Sink>,
) {
    let mut delays = backoff();
    let mut started = tokio::time::Instant::now();
    loop {
        match listener.try_recv().await {
            Ok(Some(n)) => {
                metrics.notify_wakeups.inc();
                match SandboxId::parse(n.payload()) {
                    Ok(id) => sink.hint(id),
                    Err(e) => tracing::warn!(error = %e, "ignoring NOTIFY with an invalid id"),
                }
            }
            other => {
                // Ok(None): the connection dropped. Err: it failed. Either
                // way notifications may have been lost.
                let error = match other {
                    Err(e) => e.to_string(),
                    _ => "connection closed".to_owned(),
                };
                metrics
                    .stream_restarts
                    .with_label_values(&["postgres"])
                    .inc();
                if started.elapsed() > HEALTHY_AFTER {
                    delays = backoff();
                }
                loop {
                    let delay = delays.next().unwrap_or(Duration::from_secs(30));
                    tracing::warn!(
                        error = error.as_str(),
                        retry_in_ms = delay.as_millis() as u64,
                        "NOTIFY stream dropped; reconnecting"
                    );
                    tokio::time::sleep(delay).await;
                    match listen(&pool).await {
                        Ok(l) => {
                            listener = l;
                            break;
                        }
                        Err(e) => tracing::warn!(error = %e, "NOTIFY reconnect failed"),
                    }
                }
                started = tokio::time::Instant::now();
                sink.relist();
            }
        }
    }
}

/// A listener subscribed to `sandbox_desired`.
pub async fn listen(pool: &PgPool) -> Result<PgListener, store::StoreError> {
    let mut listener = PgListener::connect_with(pool)
        .await
        .map_err(store::StoreError::Connect)?;
    listener
        .listen(store::DESIRED_CHANNEL)
        .await
        .map_err(store::StoreError::Connect)?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relist_that_matches_the_events_finds_no_drift() {
        let known = KnownContainers::default();
        known.record("a", "create");
        known.record("a", "start");
        known.record("b", "start");
        known.record("b", "die");
        let listed = vec![
            ("a".to_owned(), ContainerState::Running),
            ("b".to_owned(), ContainerState::Exited),
        ];
        assert_eq!(known.reconcile_with(&listed), 0);
    }

    #[test]
    fn containers_that_changed_appeared_or_vanished_without_events_count_as_drift() {
        let known = KnownContainers::default();
        known.record("running-then-silently-dead", "start");
        known.record("vanished", "start");
        known.record("destroyed", "start");
        known.record("destroyed", "destroy");
        let listed = vec![
            (
                "running-then-silently-dead".to_owned(),
                ContainerState::Exited,
            ),
            ("appeared".to_owned(), ContainerState::Running),
        ];
        assert_eq!(known.reconcile_with(&listed), 3);
        // The listing is now the baseline.
        assert_eq!(known.reconcile_with(&listed), 0);
    }
}
