//! What the HTTP endpoints (`/metrics`, `/readyz` and the operator page)
//! ask of a running controller: the HTTP adapter serves them, the
//! controller answers.

use async_trait::async_trait;

/// What the endpoints ask of the controller.
#[async_trait]
pub trait Probes: Send + Sync + 'static {
    /// Refreshes the gauges computed at scrape time.
    async fn before_scrape(&self);
    /// `Ok` once the initial lists are loaded and Postgres and Docker
    /// answer; otherwise why not.
    async fn ready(&self) -> Result<(), String>;
    /// What this process knows of itself, for the operator page: from
    /// memory, no Docker or Postgres call.
    fn view(&self) -> ControllerView;
}

/// A running controller as the operator page shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerView {
    /// Who leads: this process (in which term) or another, as last read.
    pub leadership: String,
    /// Whether this process leads.
    pub leads: bool,
    /// Why reaping is paused, if the circuit breaker paused it.
    pub reaping_paused: Option<String>,
    /// Each warm pool (configured or learned from demand), by key.
    pub pools: Vec<PoolView>,
}

/// One warm pool now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolView {
    /// `engine[:features][@seed]`.
    pub pool: String,
    /// Ready, unclaimed containers.
    pub ready: usize,
    /// Containers being started.
    pub starting: usize,
    /// How many it keeps ready.
    pub target: usize,
}
