//! What every step of a reconcile reads and none owns: the ports (already
//! bounded by their deadlines), the engines, the operator's settings, the
//! clock, the metrics and the fence. The ledgers the steps keep in memory
//! live with their owners (`Sources`, `Heals`, `Reaps`, …), so a step's
//! signature says which of them it touches.

use super::fence::{Fence, Fenced};
use crate::config::ControllerConfig;
use crate::domain::clock::Clock;
use crate::domain::death::Orders;
use crate::domain::identity::StateId;
use crate::domain::lease::Term;
use crate::domain::plan::Policy;
use crate::engine::Registry;
use crate::metrics::Metrics;
use crate::ports::runtime::Runtime;
use crate::ports::store::{Store, StoreError};
use chrono::{DateTime, Utc};
use std::sync::Arc;

/// The ports, settings and fence every step shares.
pub(crate) struct Env {
    /// The container runtime, every call bounded.
    pub(crate) runtime: Arc<dyn Runtime>,
    /// The state store, every call bounded.
    pub(crate) store: Arc<dyn Store>,
    /// The engines this controller runs.
    pub(crate) engines: Registry,
    /// Configuration.
    pub(crate) config: ControllerConfig,
    /// The injected clock.
    pub(crate) clock: Arc<dyn Clock>,
    /// Metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// Whether this process may act, and in which term.
    pub(crate) fence: Fence,
    /// This state database's identity, read once (at start, before the
    /// initial lists) and kept: it never changes.
    pub(crate) state: tokio::sync::OnceCell<StateId>,
    /// The orders (`docker kill`, `stop`, `rm -f`) the event stream
    /// reported: a heal of what one ended does not back off, and a start
    /// one interrupted says nothing of its source.
    pub(crate) orders: Arc<Orders>,
}

impl Env {
    /// The term to write statuses in; [`Fenced`] unless this process
    /// leads and trusts its lease.
    pub(crate) fn term(&self) -> Result<Term, Fenced> {
        self.fence
            .check()
            .inspect_err(|_| self.metrics.leader.fenced("status"))
    }

    /// This state database's identity (read from the store the first time).
    pub(crate) async fn state_id(&self) -> Result<&StateId, StoreError> {
        self.state.get_or_try_init(|| self.store.state_id()).await
    }

    /// What the plan weighs besides rows and containers: the operator's
    /// settings, and a rotation in place where the runtime cannot rename
    /// what it runs (the new container cannot be built beside the old one
    /// and take its name afterwards).
    pub(crate) fn policy(&self) -> Policy {
        Policy {
            grace: self.config.grace,
            idle_timeout: self.config.idle_timeout,
            rotate_in_place: !self.runtime.capabilities().renames,
            isolation: self.config.isolation,
        }
    }

    /// Seconds on the injected clock since `t`, never negative.
    pub(crate) fn seconds_since(&self, t: DateTime<Utc>) -> f64 {
        (self.clock.now() - t)
            .to_std()
            .unwrap_or_default()
            .as_secs_f64()
    }
}
