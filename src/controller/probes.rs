//! What `/metrics` and `/readyz` ask of a running controller.

use super::leader::{Elector, Role};
use super::{Context, Readiness};
use crate::domain::id::SandboxId;
use crate::ports::{ControllerView, Probes};
use crate::sched::WorkQueue;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

/// How long a probe may wait for Postgres or Docker.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

pub(crate) struct ControllerProbes {
    pub(crate) ctx: Arc<Context>,
    pub(crate) elector: Arc<Elector>,
    pub(crate) queue: WorkQueue<SandboxId>,
    pub(crate) readiness: Readiness,
}

#[async_trait]
impl Probes for ControllerProbes {
    async fn before_scrape(&self) {
        let m = &self.ctx.env.metrics;
        let (longest, total) = self.queue.running_times();
        m.queue.running_times(longest, total);
        let looping = self.ctx.heals.heal_loops.looping();
        if !looping.is_empty() {
            tracing::warn!(sandboxes = ?looping, "sandboxes in a heal loop");
        }
        m.fleet.sandboxes_in_heal_loop(&looping);
        // The fleet gauges are kept by the relists and status writes
        // (`controller::fleet`): a scrape makes no Docker or Postgres call.
    }

    async fn ready(&self) -> Result<(), String> {
        let role = self.elector.role();
        if let Role::Standby(_) = role {
            return Err(self.leadership(&role));
        }
        if !self.readiness.is_ready() {
            return Err("initial lists not loaded yet".into());
        }
        if let Some(reason) = self.ctx.reaps.breaker.paused() {
            return Err(format!("reaping paused: {reason}"));
        }
        match tokio::time::timeout(PROBE_TIMEOUT, self.ctx.env.store.ping()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("state database unreachable: {e}")),
            Err(_) => return Err("state database did not answer within 2s".into()),
        }
        match tokio::time::timeout(PROBE_TIMEOUT, self.ctx.env.runtime.ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("docker unreachable: {e}")),
            Err(_) => Err("docker did not answer within 2s".into()),
        }
    }

    fn view(&self) -> ControllerView {
        // One read of the role, so the words and the flag agree.
        let role = self.elector.role();
        ControllerView {
            leadership: self.leadership(&role),
            leads: matches!(role, Role::Leader(_)),
            reaping_paused: self.ctx.reaps.breaker.paused(),
            pools: self.ctx.sources.pool.view(&self.ctx.env),
        }
    }
}

impl ControllerProbes {
    /// Who leads, in words: `/readyz`'s answer on a standby, the operator
    /// page's on every process.
    fn leadership(&self, role: &Role) -> String {
        match role {
            Role::Leader(term) => format!(
                "this process ({}) leads in term {term}",
                self.elector.holder()
            ),
            Role::Standby(Some(h)) => format!(
                "standby: {} leads in term {} (lease until {}); this process ({}) takes over if that lease lapses",
                h.holder,
                h.term,
                h.expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                self.elector.holder()
            ),
            Role::Standby(None) => format!(
                "standby: this process ({}) is waiting for the leader lease",
                self.elector.holder()
            ),
        }
    }
}
