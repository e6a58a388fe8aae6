//! `NOTIFY sandbox_desired` as requests: the store names the sandbox (the
//! payload names its row by incarnation, and the store finds the id), and
//! the database notifies only when a row is inserted, deleted or its
//! generation changes, so each one is something new asked of the sandbox
//! (it cuts a retry backoff short). A `TRUNCATE` comes as
//! [`NOTIFY_EVERY_ROW`] instead of an id: every row may be gone, so both
//! sides are relisted.

use super::follow::Subscription;
use super::Sink;
use crate::domain::id::SandboxId;
use crate::metrics::Metrics;
use crate::ports::store::{Store, StoreError, NOTIFY_EVERY_ROW};
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
        self.metrics.watch.notify_wakeup();
        if payload == NOTIFY_EVERY_ROW {
            tracing::info!("the desired rows were truncated; relisting");
            sink.relist();
            return;
        }
        match SandboxId::parse(&payload) {
            Ok(id) => sink.request(id),
            Err(e) => tracing::warn!(error = %e, "ignoring NOTIFY with an invalid id"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeStore;
    use std::sync::Mutex;
    use std::time::Duration;

    /// What the watcher asked for, in order.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl Sink for Recorder {
        fn hint(&self, id: SandboxId) {
            self.0.lock().unwrap().push(format!("hint {id}"));
        }
        fn request(&self, id: SandboxId) {
            self.0.lock().unwrap().push(format!("request {id}"));
        }
        fn hint_later(&self, id: SandboxId, _delay: Duration) {
            self.0.lock().unwrap().push(format!("hint_later {id}"));
        }
        fn relist(&self) {
            self.0.lock().unwrap().push("relist".into());
        }
    }

    #[test]
    fn an_id_is_a_request_a_truncate_a_relist_and_anything_else_is_ignored() {
        assert!(SandboxId::parse(NOTIFY_EVERY_ROW).is_err());
        let mut rows = DesiredRows::new(Arc::new(FakeStore::default()), Arc::new(Metrics::new()));
        let sink = Recorder::default();
        for payload in ["agent-7", NOTIFY_EVERY_ROW, "Not An Id", ""] {
            rows.on_item(payload.to_owned(), &sink);
        }
        assert_eq!(*sink.0.lock().unwrap(), ["request agent-7", "relist"]);
    }
}
