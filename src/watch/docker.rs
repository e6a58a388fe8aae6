//! The runtime's event streams as hints: every event of this deployment's
//! containers wakes its sandbox, and events whose effect the container list
//! shows late wake it once more after the list settled; a sandbox network
//! removed out of band wakes its sandbox (the shared one: every sandbox),
//! which creates it again.

use super::follow::Subscription;
use super::{KnownContainers, Sink};
use crate::domain::death::Orders;
use crate::domain::id::Deployment;
use crate::domain::network::sandbox_of_network;
use crate::domain::pool::ClaimIndex;
use crate::metrics::Metrics;
use crate::ports::runtime::{Runtime, RuntimeError, RuntimeEvent};
use crate::ports::StreamSource;
use async_trait::async_trait;
use futures::stream::BoxStream;
use std::sync::Arc;
use std::time::Duration;

/// Docker reports `die` (and `kill`, `stop`, `oom`) before its container
/// list shows the container as exited (the daemon logs the event, then
/// releases the container's mounts and network, then updates the list:
/// 100–200 ms here), so a reconcile woken by the event alone may still see
/// it running: such actions are looked at again as the list settles, at
/// short intervals first (a heal starts within 50–100 ms of the list
/// showing the exit), and once more later.
const SETTLE: [Duration; 5] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_secs(1),
];

/// Whether this Docker updates its list before it reports the event: only
/// the simulated world's does (`crate::testing::dst`), where the looks
/// again would find nothing new and cost two reconciles in five.
fn settles_at_once() -> bool {
    #[cfg(any(test, feature = "simulation"))]
    return crate::domain::mutation::in_world();
    #[cfg(not(any(test, feature = "simulation")))]
    false
}

/// The event stream of one deployment's containers.
pub(crate) struct DockerEvents {
    runtime: Arc<dyn Runtime>,
    deployment: Deployment,
    known: Arc<KnownContainers>,
    metrics: Arc<Metrics>,
    /// Time of the last event, so a reconnect replays what Docker kept.
    since: Option<i64>,
    /// Claimed warm-pool containers: their labels name no sandbox.
    claims: Option<Arc<ClaimIndex>>,
    /// Where `kill`, `stop` and `destroy` are recorded: orders from
    /// outside, which heals do not back off from.
    orders: Option<Arc<Orders>>,
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
            claims: None,
            orders: None,
        }
    }

    /// Also records the orders sent to containers (`domain::death`).
    pub(crate) fn with_orders(mut self, orders: Arc<Orders>) -> Self {
        self.orders = Some(orders);
        self
    }

    /// Also wakes the sandbox a claimed warm-pool container serves.
    pub(crate) fn with_claims(mut self, claims: Arc<ClaimIndex>) -> Self {
        self.claims = Some(claims);
        self
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
        self.metrics.watch.docker_event(event.action);
        self.known.record(&event.container, event.action);
        if let (Some(order), Some(orders)) = (event.action.order(), &self.orders) {
            orders.record(&event.container, order);
        }
        let sandbox = event.sandbox.or_else(|| {
            self.claims
                .as_ref()
                .and_then(|c| c.sandbox_of(&event.container))
        });
        if let Some(sandbox) = sandbox {
            tracing::debug!(sandbox = %sandbox, action = %event.action, "docker event");
            if event.action.settles_late() && !settles_at_once() {
                for after in SETTLE {
                    sink.hint_later(sandbox.clone(), after);
                }
            }
            sink.hint(sandbox);
        }
    }
}

/// The names of networks as Docker removes them: this deployment's wake
/// their sandbox, the shared network's removal asks for a relist.
pub(crate) struct RemovedNetworks {
    runtime: Arc<dyn Runtime>,
    deployment: Deployment,
    /// The shared network's name, in that layout.
    shared: Option<String>,
}

impl RemovedNetworks {
    /// Removals of `deployment`'s networks (and of `shared`) from `runtime`.
    pub(crate) fn new(
        runtime: Arc<dyn Runtime>,
        deployment: Deployment,
        shared: Option<String>,
    ) -> Self {
        Self {
            runtime,
            deployment,
            shared,
        }
    }
}

#[async_trait]
impl Subscription for RemovedNetworks {
    type Item = String;
    type Error = RuntimeError;
    const SOURCE: StreamSource = StreamSource::Docker;

    async fn connect(
        &mut self,
    ) -> Result<BoxStream<'static, Result<String, RuntimeError>>, RuntimeError> {
        Ok(self.runtime.removed_networks())
    }

    fn on_item(&mut self, network: String, sink: &dyn Sink) {
        if let Some(sandbox) = sandbox_of_network(&self.deployment, &network) {
            tracing::info!(sandbox = %sandbox, network, "sandbox network removed");
            sink.hint(sandbox);
        } else if self.shared.as_deref() == Some(network.as_str()) {
            tracing::warn!(network, "shared network removed; looking at every sandbox");
            sink.relist();
        }
    }
}
