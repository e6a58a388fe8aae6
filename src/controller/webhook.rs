//! The webhook: every event the controller records is also POSTed to
//! `--webhook-url`, signed, by one background task. A reconcile only
//! offers its events to a bounded queue (`try_send`): when the queue is
//! full the event is dropped and counted, so a slow, failing or hanging
//! receiver never slows reconciliation. The task sends one event at a
//! time, oldest first; each attempt is bounded by `--webhook-timeout`,
//! and a failed one is retried `--webhook-retries` times with exponential
//! backoff, then given up (counted; the event stays in `sandbox_events`).
//! Delivery is at most once per attempt that got a 2xx: a receiver should
//! deduplicate by `seq` and `count`.

use crate::config::WebhookConfig;
use crate::domain::notice::{self, EventNotice};
use crate::domain::secret::Secret;
use crate::metrics::Metrics;
use crate::ports::webhook::{WebhookError, WebhookTransport};
use backon::{ExponentialBuilder, Retryable};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The first retry's delay; each next one doubles, up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(500);
/// The longest delay between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Where reconciles offer their recorded events (a no-op without a
/// webhook).
#[derive(Clone)]
pub(crate) struct Notifier {
    queue: Option<mpsc::Sender<EventNotice>>,
    metrics: Arc<Metrics>,
}

impl Notifier {
    /// A notifier that sends nowhere.
    pub(crate) fn disabled(metrics: Arc<Metrics>) -> Self {
        Self {
            queue: None,
            metrics,
        }
    }

    /// Queues `notices` for the webhook without waiting: what does not fit
    /// is dropped and counted.
    pub(crate) fn offer(&self, notices: Vec<EventNotice>) {
        let Some(queue) = &self.queue else {
            return;
        };
        for n in notices {
            // Counted before it is sent: the task may take it at once.
            self.metrics.webhook.queued(true);
            if let Err(e) = queue.try_send(n) {
                self.metrics.webhook.queued(false);
                let dropped = self.metrics.webhook.dropped();
                let n = match e {
                    mpsc::error::TrySendError::Full(n) | mpsc::error::TrySendError::Closed(n) => n,
                };
                // Once, then every thousandth: a dead receiver must not
                // flood the log.
                if dropped == 1 || dropped % 1000 == 0 {
                    tracing::warn!(
                        sandbox = %n.sandbox_id,
                        seq = n.seq,
                        dropped,
                        "the webhook's queue is full (the receiver is slow or down): events are dropped for it (they stay in sandbox_events); see sandboxd_webhook_dropped_total"
                    );
                }
            }
        }
    }
}

/// The task that sends the queued events.
pub(crate) struct Delivery {
    queue: mpsc::Receiver<EventNotice>,
    transport: Arc<dyn WebhookTransport>,
    secret: Secret,
    timeout: Duration,
    retries: u32,
    /// The URL as logged (no path, no query).
    shown: String,
    metrics: Arc<Metrics>,
}

/// A notifier and the delivery task it feeds, sending through `transport`.
pub(crate) fn channel(
    config: &WebhookConfig,
    transport: Arc<dyn WebhookTransport>,
    metrics: Arc<Metrics>,
) -> (Notifier, Delivery) {
    let (tx, rx) = mpsc::channel(config.queue.max(1));
    (
        Notifier {
            queue: Some(tx),
            metrics: metrics.clone(),
        },
        Delivery {
            queue: rx,
            transport,
            secret: config.secret.clone(),
            timeout: config.timeout,
            retries: config.retries,
            shown: config.url.to_string(),
            metrics,
        },
    )
}

impl Delivery {
    /// Sends every queued event, one at a time, until every notifier is
    /// gone (or the task is aborted).
    pub(crate) async fn run(mut self) {
        tracing::info!(webhook = %self.shown, "sending events to the webhook");
        while let Some(n) = self.queue.recv().await {
            self.metrics.webhook.queued(false);
            match self.deliver(&n).await {
                Ok(()) => self.metrics.webhook.delivery(true),
                Err(e) => {
                    self.metrics.webhook.delivery(false);
                    tracing::warn!(
                        webhook = %self.shown,
                        sandbox = %n.sandbox_id,
                        seq = n.seq,
                        error = %e,
                        "gave up sending an event to the webhook (it stays in sandbox_events)"
                    );
                }
            }
        }
    }

    /// One event: attempts, each bounded and freshly signed, retried with
    /// backoff while the failure may pass.
    async fn deliver(&self, n: &EventNotice) -> Result<(), WebhookError> {
        let body = match serde_json::to_vec(n) {
            Ok(body) => body,
            // Plain strings, numbers and times: cannot fail.
            Err(e) => return Err(WebhookError::Unreachable(e.to_string())),
        };
        let attempt = || async {
            let signature = notice::sign(
                self.secret.expose().as_bytes(),
                chrono::Utc::now().timestamp(),
                &body,
            );
            let result =
                match tokio::time::timeout(self.timeout, self.transport.post(&body, &signature))
                    .await
                {
                    Ok(result) => result,
                    Err(_) => Err(WebhookError::TimedOut),
                };
            if let Err(e) = &result {
                self.metrics.webhook.attempt_failed(e.kind());
            }
            result
        };
        attempt
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(MIN_BACKOFF)
                    .with_max_delay(MAX_BACKOFF)
                    .with_max_times(self.retries as usize)
                    .with_jitter()
                    .with_jitter_seed(crate::domain::entropy::u64()),
            )
            .sleep(tokio::time::sleep)
            .when(WebhookError::is_retryable)
            .notify(|e, after| {
                self.metrics.webhook.retry();
                tracing::debug!(webhook = %self.shown, seq = n.seq, error = %e,
                    retry_in_ms = after.as_millis() as u64, "webhook attempt failed; retrying");
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WebhookUrl;
    use async_trait::async_trait;
    use std::sync::Mutex;

    /// A receiver that answers each attempt with the next scripted result
    /// (`None`: never answers), recording what it got.
    #[derive(Default)]
    struct Scripted {
        script: Mutex<Vec<Option<Result<(), u16>>>>,
        got: Mutex<Vec<(Vec<u8>, String, tokio::time::Instant)>>,
    }

    #[async_trait]
    impl WebhookTransport for Scripted {
        async fn post(&self, body: &[u8], signature: &str) -> Result<(), WebhookError> {
            self.got.lock().unwrap().push((
                body.to_vec(),
                signature.to_owned(),
                tokio::time::Instant::now(),
            ));
            let next = {
                let mut s = self.script.lock().unwrap();
                if s.is_empty() {
                    Some(Ok(()))
                } else {
                    s.remove(0)
                }
            };
            match next {
                Some(Ok(())) => Ok(()),
                Some(Err(code)) => Err(WebhookError::Status(code)),
                None => std::future::pending().await,
            }
        }
    }

    fn config(retries: u32, queue: usize) -> WebhookConfig {
        WebhookConfig {
            retries,
            queue,
            timeout: Duration::from_secs(5),
            ..WebhookConfig::new(
                WebhookUrl::parse("http://127.0.0.1:9/hook").unwrap(),
                Secret::new("a-test-secret-of-some-length"),
            )
        }
    }

    fn notice(seq: i64) -> EventNotice {
        EventNotice {
            seq,
            sandbox_id: "agent-7".into(),
            reason: "healed".into(),
            engine: Some("redis".into()),
            detail: Some("exited".into()),
            count: 1,
            first_at: chrono::Utc::now(),
            last_at: chrono::Utc::now(),
            owner: "orch".into(),
            incarnation: None,
            message: "re-created".into(),
        }
    }

    fn metric(m: &Metrics, name: &str) -> f64 {
        let text = m.render();
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_attempt_is_retried_with_growing_backoff_and_each_is_signed_afresh() {
        let metrics = Arc::new(Metrics::new());
        let receiver = Arc::new(Scripted::default());
        *receiver.script.lock().unwrap() = vec![Some(Err(503)), None, Some(Ok(()))];
        let (notifier, delivery) = channel(&config(3, 10), receiver.clone(), metrics.clone());
        let task = tokio::spawn(delivery.run());
        notifier.offer(vec![notice(1)]);
        drop(notifier);
        task.await.unwrap();

        let got = receiver.got.lock().unwrap();
        assert_eq!(got.len(), 3, "a 503, a hang (timed out), then a 2xx");
        for (body, signature, _) in got.iter() {
            let n: EventNotice = serde_json::from_slice(body).unwrap();
            assert_eq!(n.seq, 1);
            assert!(notice::verify(b"a-test-secret-of-some-length", signature, body).is_some());
        }
        // Backoff after the 503, then the hung attempt's 5 s timeout plus
        // a longer backoff.
        let first_gap = got[1].2 - got[0].2;
        let second_gap = got[2].2 - got[1].2;
        assert!(first_gap >= MIN_BACKOFF, "{first_gap:?}");
        assert!(
            second_gap >= Duration::from_secs(5) + MIN_BACKOFF,
            "{second_gap:?}"
        );
        assert_eq!(metric(&metrics, "sandboxd_webhook_retries_total"), 2.0);
        assert_eq!(
            metric(
                &metrics,
                "sandboxd_webhook_deliveries_total{result=\"delivered\"}"
            ),
            1.0
        );
        assert_eq!(
            metric(
                &metrics,
                "sandboxd_webhook_attempt_errors_total{error=\"timeout\"}"
            ),
            1.0
        );
        assert_eq!(metric(&metrics, "sandboxd_webhook_queue_depth"), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_is_given_up_after_its_retries_and_a_refusal_is_not_retried() {
        let metrics = Arc::new(Metrics::new());
        let receiver = Arc::new(Scripted::default());
        *receiver.script.lock().unwrap() = vec![None, None, None, Some(Err(400))];
        let (notifier, delivery) = channel(&config(2, 10), receiver.clone(), metrics.clone());
        let task = tokio::spawn(delivery.run());
        notifier.offer(vec![notice(1), notice(2)]);
        drop(notifier);
        task.await.unwrap();
        // Event 1: three hung attempts (1 + 2 retries); event 2: one 400.
        let seqs: Vec<i64> = receiver
            .got
            .lock()
            .unwrap()
            .iter()
            .map(|(b, _, _)| serde_json::from_slice::<EventNotice>(b).unwrap().seq)
            .collect();
        assert_eq!(seqs, [1, 1, 1, 2]);
        assert_eq!(
            metric(
                &metrics,
                "sandboxd_webhook_deliveries_total{result=\"failed\"}"
            ),
            2.0
        );
        assert_eq!(metric(&metrics, "sandboxd_webhook_retries_total"), 2.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let metrics = Arc::new(Metrics::new());
        let receiver = Arc::new(Scripted::default());
        *receiver.script.lock().unwrap() = vec![None; 100];
        let (notifier, delivery) = channel(&config(0, 2), receiver.clone(), metrics.clone());
        // The task is not running: nothing leaves the queue.
        let before = tokio::time::Instant::now();
        notifier.offer((1..=5).map(notice).collect());
        assert_eq!(tokio::time::Instant::now(), before, "offer never waits");
        assert_eq!(metric(&metrics, "sandboxd_webhook_dropped_total"), 3.0);
        assert_eq!(metric(&metrics, "sandboxd_webhook_queue_depth"), 2.0);
        drop(delivery);
        notifier.offer(vec![notice(6)]);
        assert_eq!(metric(&metrics, "sandboxd_webhook_dropped_total"), 4.0);
        Notifier::disabled(metrics.clone()).offer(vec![notice(7)]);
        assert_eq!(metric(&metrics, "sandboxd_webhook_dropped_total"), 4.0);
    }
}
