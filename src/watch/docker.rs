//! The runtime's event stream as hints: every event of this deployment's
//! containers wakes its sandbox, and events whose effect the container list
//! shows late wake it once more after the list settled.

use super::follow::Subscription;
use super::{KnownContainers, Sink};
use crate::domain::id::Deployment;
use crate::metrics::Metrics;
use crate::ports::runtime::{Runtime, RuntimeError, RuntimeEvent};
use crate::ports::StreamSource;
use async_trait::async_trait;
use futures::stream::BoxStream;
use std::sync::Arc;
use std::time::Duration;

/// Docker reports `die` (and `kill`, `stop`, `oom`) before its container
/// list shows the container as exited, so a reconcile woken by the event
/// alone may still see it running: such actions are looked at again as
/// the list settles, soon (so the status leaves `ready` well within a
/// second) and once more later.
const SETTLE: [Duration; 2] = [Duration::from_millis(200), Duration::from_secs(1)];

/// The event stream of one deployment's containers.
pub(crate) struct DockerEvents {
    runtime: Arc<dyn Runtime>,
    deployment: Deployment,
    known: Arc<KnownContainers>,
    metrics: Arc<Metrics>,
    /// Time of the last event, so a reconnect replays what Docker kept.
    since: Option<i64>,
}

impl DockerEvents {
    /// Events of `deployment`'s containers from `runtime`.
    pub(crate) fn new(
        runtime: Arc<dyn Runtime>,
        deployment: Deployment,
        known: Arc<KnownContainers>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            runtime,
            deployment,
            known,
            metrics,
            since: None,
        }
    }
}

#[async_trait]
impl Subscription for DockerEvents {
    type Item = RuntimeEvent;
    type Error = RuntimeError;
    const SOURCE: StreamSource = StreamSource::Docker;

    async fn connect(
        &mut self,
    ) -> Result<BoxStream<'static, Result<RuntimeEvent, RuntimeError>>, RuntimeError> {
        Ok(self.runtime.events(&self.deployment, self.since))
    }

    fn on_item(&mut self, event: RuntimeEvent, sink: &dyn Sink) {
        if event.time.is_some() {
            self.since = event.time;
        }
        self.metrics.docker_event(event.action);
        self.known.record(&event.container, event.action);
        if let Some(sandbox) = event.sandbox {
            tracing::debug!(sandbox = %sandbox, action = %event.action, "docker event");
            if event.action.settles_late() {
                for after in SETTLE {
                    sink.hint_later(sandbox.clone(), after);
                }
            }
            sink.hint(sandbox);
        }
    }
}
