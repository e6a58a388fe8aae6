//! The webhook over HTTP/1.1 (hyper): one connection per attempt, one
//! POST, the response's status. `http://` only: this build carries no TLS
//! client (see `config::WebhookUrl`).

use crate::config::WebhookUrl;
use crate::domain::notice::SIGNATURE_HEADER;
use crate::ports::webhook::{WebhookError, WebhookTransport};
use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST, USER_AGENT};
use hyper_util::rt::TokioIo;

/// POSTs to one `http://` URL.
#[derive(Debug, Clone)]
pub struct HttpWebhook {
    url: WebhookUrl,
}

impl HttpWebhook {
    /// A transport to `url`.
    pub fn new(url: WebhookUrl) -> Self {
        Self { url }
    }
}

fn unreachable(e: impl std::fmt::Display) -> WebhookError {
    WebhookError::Unreachable(e.to_string())
}

#[async_trait]
impl WebhookTransport for HttpWebhook {
    async fn post(&self, body: &[u8], signature: &str) -> Result<(), WebhookError> {
        let stream = tokio::net::TcpStream::connect((self.url.host(), self.url.port()))
            .await
            .map_err(unreachable)?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
                .await
                .map_err(unreachable)?;
        let target = self
            .url
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let host = self
            .url
            .uri()
            .authority()
            .map_or_else(|| self.url.host().to_owned(), |a| a.as_str().to_owned());
        let request = hyper::Request::post(target)
            .header(HOST, host)
            .header(CONTENT_TYPE, "application/json")
            .header(USER_AGENT, concat!("sandboxd/", env!("CARGO_PKG_VERSION")))
            .header(CONNECTION, "close")
            .header(SIGNATURE_HEADER, signature)
            .body(Full::new(Bytes::copy_from_slice(body)))
            .map_err(unreachable)?;
        // The connection is driven here, not by a spawned task, so an
        // abandoned attempt (the caller's timeout) closes it. It may end
        // (`connection: close`) in the same poll that hands the response
        // over: then the response is taken from the request's side.
        let mut connection = std::pin::pin!(connection);
        let mut send = std::pin::pin!(sender.send_request(request));
        let response = tokio::select! {
            biased;
            response = &mut send => response,
            ended = &mut connection => match ended {
                Ok(()) => send.await,
                Err(e) => return Err(unreachable(e)),
            },
        }
        .map_err(unreachable)?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(WebhookError::Status(status.as_u16()))
        }
    }
}
