//! `NOTIFY sandbox_desired` as requests: the payload names the sandbox, and
//! the database notifies only when a row is inserted, deleted or its
//! generation changes, so each one is something new asked of the sandbox
//! (it cuts a retry backoff short).

use super::follow::Subscription;
use super::Sink;
use crate::domain::id::SandboxId;
use crate::metrics::Metrics;
use crate::ports::store::{Store, StoreError};
use crate::ports::StreamSource;
use async_trait::async_trait;
use futures::stream::BoxStream;
use std::sync::Arc;

/// Changes of desired rows.
pub(crate) struct DesiredRows {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl DesiredRows {
    /// Changes of `store`'s desired rows.
    pub(crate) fn new(store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        Self { store, metrics }
    }
}

#[async_trait]
impl Subscription for DesiredRows {
    type Item = String;
    type Error = StoreError;
    const SOURCE: StreamSource = StreamSource::Postgres;

    async fn connect(
        &mut self,
    ) -> Result<BoxStream<'static, Result<String, StoreError>>, StoreError> {
        self.store.watch_desired().await
    }

    fn on_item(&mut self, payload: String, sink: &dyn Sink) {
        self.metrics.notify_wakeup();
        match SandboxId::parse(&payload) {
            Ok(id) => sink.request(id),
            Err(e) => tracing::warn!(error = %e, "ignoring NOTIFY with an invalid id"),
        }
    }
}
