//! The one reconnect loop every watch stream runs in: read until the stream
//! drops, wait out a backoff that resets once a stream stayed up, connect
//! again, and ask for a relist, since anything may have been missed.

use super::Sink;
use crate::metrics::Metrics;
use crate::ports::StreamSource;
use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBuilder};
use futures::stream::BoxStream;
use futures::StreamExt;
use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A stream that stayed up this long resets the reconnect backoff.
pub(crate) const HEALTHY_AFTER: Duration = Duration::from_secs(30);

/// The longest wait between reconnects.
const MAX_DELAY: Duration = Duration::from_secs(30);

/// One kind of watch stream: how to open it and what to do with an item.
#[async_trait]
pub(crate) trait Subscription: Send + 'static {
    /// What the stream yields.
    type Item: Send;
    /// Why it failed.
    type Error: Display + Send;
    /// Where it comes from (metrics and logs).
    const SOURCE: StreamSource;
    /// Opens the stream; it is subscribed once this returns.
    async fn connect(
        &mut self,
    ) -> Result<BoxStream<'static, Result<Self::Item, Self::Error>>, Self::Error>;
    /// Handles one item.
    fn on_item(&mut self, item: Self::Item, sink: &dyn Sink);
}

fn backoff() -> impl Iterator<Item = Duration> + Send {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(MAX_DELAY)
        .with_jitter()
        .with_jitter_seed(crate::domain::entropy::u64())
        .without_max_times()
        .build()
}

/// Follows `sub` until the task is aborted. `first` is a stream already
/// subscribed (so nothing falls between it and the initial relist); without
/// one, the first connection is made here, without a relist.
pub(crate) async fn follow<S: Subscription>(
    mut sub: S,
    first: Option<BoxStream<'static, Result<S::Item, S::Error>>>,
    metrics: Arc<Metrics>,
    sink: Arc<dyn Sink>,
) {
    let source = S::SOURCE.as_str();
    let mut delays = backoff();
    let mut next = first;
    let mut reconnecting = false;
    loop {
        let mut stream = match next.take() {
            Some(stream) => stream,
            None => loop {
                match sub.connect().await {
                    Ok(stream) => {
                        if reconnecting {
                            sink.relist();
                        }
                        break stream;
                    }
                    Err(e) => {
                        let delay = delays.next().unwrap_or(MAX_DELAY);
                        tracing::warn!(source, error = %e, retry_in_ms = delay.as_millis() as u64, "watch stream cannot connect; retrying");
                        tokio::time::sleep(delay).await;
                    }
                }
            },
        };
        reconnecting = true;
        let started = Instant::now();
        let error = loop {
            match stream.next().await {
                Some(Ok(item)) => sub.on_item(item, &*sink),
                Some(Err(e)) => break e.to_string(),
                None => break "stream ended".to_owned(),
            }
        };
        metrics.watch.stream_restarted(S::SOURCE);
        if started.elapsed() > HEALTHY_AFTER {
            delays = backoff();
        }
        let delay = delays.next().unwrap_or(MAX_DELAY);
        tracing::warn!(
            source,
            error,
            retry_in_ms = delay.as_millis() as u64,
            "watch stream dropped; reconnecting"
        );
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::id::SandboxId;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// Records what the watcher asked for.
    #[derive(Default)]
    struct Recorder {
        hints: Mutex<Vec<String>>,
        relists: Mutex<u32>,
    }

    impl Sink for Recorder {
        fn hint(&self, id: SandboxId) {
            self.hints.lock().unwrap().push(id.to_string());
        }
        fn request(&self, id: SandboxId) {
            self.hint(id);
        }
        fn hint_later(&self, _id: SandboxId, _delay: Duration) {}
        fn relist(&self) {
            *self.relists.lock().unwrap() += 1;
        }
    }

    /// Each connect takes the next script: `Err` refuses, `Ok(items)`
    /// yields them and then ends (a dropped connection).
    struct Scripted {
        scripts: VecDeque<Result<Vec<&'static str>, &'static str>>,
        connects: Arc<Mutex<Vec<Instant>>>,
    }

    #[async_trait]
    impl Subscription for Scripted {
        type Item = &'static str;
        type Error = String;
        const SOURCE: StreamSource = StreamSource::Postgres;
        async fn connect(
            &mut self,
        ) -> Result<BoxStream<'static, Result<&'static str, String>>, String> {
            self.connects.lock().unwrap().push(Instant::now());
            match self.scripts.pop_front() {
                Some(Ok(items)) => Ok(futures::stream::iter(items.into_iter().map(Ok)).boxed()),
                Some(Err(e)) => Err(e.to_owned()),
                None => Ok(futures::stream::pending().boxed()),
            }
        }
        fn on_item(&mut self, item: &'static str, sink: &dyn Sink) {
            sink.hint(SandboxId::parse(item).unwrap());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_stream_is_reconnected_with_backoff_and_each_reconnect_asks_for_a_relist() {
        let connects = Arc::new(Mutex::new(Vec::new()));
        let sub = Scripted {
            scripts: VecDeque::from([Ok(vec!["a"]), Err("refused"), Err("refused"), Ok(vec!["b"])]),
            connects: connects.clone(),
        };
        let metrics = Arc::new(Metrics::new());
        let sink = Arc::new(Recorder::default());
        let task = tokio::spawn(follow(sub, None, metrics.clone(), sink.clone()));
        tokio::time::sleep(Duration::from_secs(60)).await;
        task.abort();

        assert_eq!(*sink.hints.lock().unwrap(), ["a", "b"]);
        // Five connects: the first, two refused, the one that yields "b",
        // and the one after "b"'s stream ended (pending forever).
        let times = connects.lock().unwrap().clone();
        assert_eq!(times.len(), 5);
        let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.iter().all(|g| *g >= Duration::from_millis(200)),
            "{gaps:?}"
        );
        // The first connection is no reconnect; the two that succeeded
        // after a drop each asked for a relist.
        assert_eq!(*sink.relists.lock().unwrap(), 2);
        let restarts = metrics.render();
        assert!(
            restarts.contains("sandboxd_watch_stream_restarts_total{source=\"postgres\"} 2"),
            "{restarts}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_given_at_start_is_read_before_any_connect() {
        let connects = Arc::new(Mutex::new(Vec::new()));
        let sub = Scripted {
            scripts: VecDeque::new(),
            connects: connects.clone(),
        };
        let first = futures::stream::iter([Ok("x")])
            .chain(futures::stream::pending())
            .boxed();
        let sink = Arc::new(Recorder::default());
        let task = tokio::spawn(follow(
            sub,
            Some(first),
            Arc::new(Metrics::new()),
            sink.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        task.abort();
        assert_eq!(*sink.hints.lock().unwrap(), ["x"]);
        assert!(connects.lock().unwrap().is_empty());
        assert_eq!(*sink.relists.lock().unwrap(), 0);
    }
}
