//! The webhook over HTTP/1.1 (hyper): one connection per attempt, one
//! POST, the response's status. An `https://` URL goes over TLS (rustls,
//! `webhook_tls`): the receiver's certificate is verified against
//! the trusted CAs and must name the URL's host. Redirects are not
//! followed. A failed connection or handshake is `Unreachable`, its message
//! never the URL's path or query.

use super::webhook_tls::{WebhookTls, WebhookTlsError};
use crate::config::{WebhookTrust, WebhookUrl};
use crate::domain::notice::SIGNATURE_HEADER;
use crate::ports::webhook::{WebhookError, WebhookTransport};
use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST, USER_AGENT};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsConnector;

/// POSTs to one `https://` or `http://` URL.
#[derive(Clone)]
pub struct HttpWebhook {
    url: WebhookUrl,
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
    /// A transport to `url`; an `https://` one is verified against
    /// `trust` and the platform's CA certificates, its TLS client built
    /// here (without a trust every attempt fails: see
    /// `WebhookConfig::check`).
    pub fn new(url: WebhookUrl, trust: Option<&WebhookTrust>) -> Result<Self, WebhookTlsError> {
        let tls = match trust.filter(|_| url.is_https()) {
            Some(trust) => Some(TlsConnector::from(WebhookTls::new(trust)?.client_config())),
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
        if self.url.is_https() && self.tls.is_none() {
            return Err(WebhookError::Unreachable(
                "an https:// URL without a TLS configuration".to_owned(),
            ));
        }
        let stream = tokio::net::TcpStream::connect((self.url.host(), self.url.port()))
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
        let status = match &self.tls {
            Some(tls) => {
                let name = ServerName::try_from(self.url.host().to_owned()).map_err(|_| {
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
