//! What the controller needs to deliver an event to the deployment's
//! webhook: one signed POST. Retries, backoff and the queue are the
//! controller's (`controller::webhook`); an adapter makes one attempt.

use async_trait::async_trait;

/// Why one delivery attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// No connection, or it broke before the response came.
    #[error("the webhook could not be reached ({0}): is the receiver up and the address right?")]
    Unreachable(String),
    /// The receiver answered with a status other than 2xx.
    #[error("the webhook answered HTTP {0}")]
    Status(u16),
    /// The attempt did not finish within `--webhook-timeout`.
    #[error("the webhook did not answer within --webhook-timeout")]
    TimedOut,
}

impl WebhookError {
    /// Whether trying again may help: after a 5xx, 408 or 429, not after
    /// another status (a redirect or a refusal of this request as it is).
    pub fn is_retryable(&self) -> bool {
        match self {
            WebhookError::Status(code) => *code >= 500 || *code == 408 || *code == 429,
            WebhookError::Unreachable(_) | WebhookError::TimedOut => true,
        }
    }

    /// Label value for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            WebhookError::Unreachable(_) => "unreachable",
            WebhookError::Status(_) => "status",
            WebhookError::TimedOut => "timeout",
        }
    }
}

/// Sends one JSON body with its signature header to the webhook.
#[async_trait]
pub trait WebhookTransport: Send + Sync + 'static {
    /// POSTs `body` (JSON) with `signature` as `X-Sandboxd-Signature`;
    /// `Ok` on a 2xx answer. Not bounded here: the caller bounds it.
    async fn post(&self, body: &[u8], signature: &str) -> Result<(), WebhookError>;
}
