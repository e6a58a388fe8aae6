//! The webhook over HTTP/1.1 (hyper): one connection per attempt, one
//! POST, the response's status. An `https://` URL goes over TLS (rustls,
//! `webhook_tls`): the receiver's certificate is verified against
//! the trusted CAs and must name the URL's host. Redirects are not
//! followed. A failed connection or handshake is `Unreachable`, its message
//! never the URL's path or query.

use super::webhook_tls::{WebhookTls, WebhookTlsError};
use crate::domain::notice::SIGNATURE_HEADER;
use crate::ports::webhook::{WebhookError, WebhookTransport};
use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST, USER_AGENT};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsConnector;

/// Where an [`HttpWebhook`] POSTs, as plain values: the composition root
/// takes them from the validated `--webhook-url`. `Debug` shows only
/// `shown`: the URL's path and query may hold a token.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookTarget {
    /// `https://` (TLS, the receiver's certificate verified) rather than
    /// `http://`.
    pub https: bool,
    /// The host to connect to, and the name the receiver's certificate
    /// must hold (an IPv6 address without its brackets).
    pub host: String,
    /// The port to connect to.
    pub port: u16,
    /// The request's `Host` header: the URL's authority.
    pub authority: String,
    /// The request's target: the URL's path and query (`/` without).
    pub path_and_query: String,
    /// What may be logged of the URL: `scheme://host:port/…`.
    pub shown: String,
}

impl std::fmt::Debug for WebhookTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WebhookTarget({})", self.shown)
    }
}

/// POSTs to one `https://` or `http://` URL.
#[derive(Clone)]
pub struct HttpWebhook {
    url: WebhookTarget,
    tls: Option<TlsConnector>,
}

impl std::fmt::Debug for HttpWebhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpWebhook")
            .field("url", &self.url)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl HttpWebhook {
    /// A transport to `url`; an `https://` one is verified against the
    /// platform's CA certificates plus `extra_roots`, its TLS client built
    /// here (without `extra_roots`, even empty, every attempt fails: see
    /// `WebhookConfig::check`).
    pub fn new(
        url: WebhookTarget,
        extra_roots: Option<&[CertificateDer<'static>]>,
    ) -> Result<Self, WebhookTlsError> {
        let tls = match extra_roots.filter(|_| url.https) {
            Some(extra) => Some(TlsConnector::from(WebhookTls::new(extra)?.client_config())),
            None => None,
        };
        Ok(Self { url, tls })
    }

    /// Sends `request` on `io` and waits for the response's head.
    async fn exchange<I>(
        io: I,
        request: hyper::Request<Full<Bytes>>,
    ) -> Result<hyper::StatusCode, WebhookError>
    where
        I: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(io))
                .await
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
        Ok(response.status())
    }
}

fn unreachable(e: impl std::fmt::Display) -> WebhookError {
    WebhookError::Unreachable(e.to_string())
}

/// A failed TLS handshake, with what to do about an untrusted certificate.
fn handshake_failed(e: std::io::Error) -> WebhookError {
    WebhookError::Unreachable(format!(
        "TLS handshake: {e}; the receiver's certificate must chain to a trusted CA (the platform's, or --webhook-ca-file) and name the URL's host"
    ))
}

#[async_trait]
impl WebhookTransport for HttpWebhook {
    async fn post(&self, body: &[u8], signature: &str) -> Result<(), WebhookError> {
        if self.url.https && self.tls.is_none() {
            return Err(WebhookError::Unreachable(
                "an https:// URL without a TLS configuration".to_owned(),
            ));
        }
        let stream = tokio::net::TcpStream::connect((self.url.host.as_str(), self.url.port))
            .await
            .map_err(unreachable)?;
        let request = hyper::Request::post(self.url.path_and_query.as_str())
            .header(HOST, self.url.authority.as_str())
            .header(CONTENT_TYPE, "application/json")
            .header(USER_AGENT, concat!("sandboxd/", env!("CARGO_PKG_VERSION")))
            .header(CONNECTION, "close")
            .header(SIGNATURE_HEADER, signature)
            .body(Full::new(Bytes::copy_from_slice(body)))
            .map_err(unreachable)?;
        let status = match &self.tls {
            Some(tls) => {
                let name = ServerName::try_from(self.url.host.clone()).map_err(|_| {
                    WebhookError::Unreachable(
                        "the URL's host is not a valid TLS server name".to_owned(),
                    )
                })?;
                let stream = tls.connect(name, stream).await.map_err(handshake_failed)?;
                Self::exchange(stream, request).await?
            }
            None => Self::exchange(stream, request).await?,
        };
        if status.is_success() {
            Ok(())
        } else {
            Err(WebhookError::Status(status.as_u16()))
        }
    }
}
