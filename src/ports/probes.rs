//! What the `/metrics` and `/readyz` endpoints ask of a running
//! controller: the HTTP adapter serves them, the controller answers.

use async_trait::async_trait;

/// What the endpoints ask of the controller.
#[async_trait]
pub trait Probes: Send + Sync + 'static {
    /// Refreshes the gauges computed at scrape time.
    async fn before_scrape(&self);
    /// `Ok` once the initial lists are loaded and Postgres and Docker
    /// answer; otherwise why not.
    async fn ready(&self) -> Result<(), String>;
}
