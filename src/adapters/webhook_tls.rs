//! The TLS client of an `https://` webhook: the platform's CA certificates
//! (`rustls-native-certs`: the system store, or `SSL_CERT_FILE` /
//! `SSL_CERT_DIR` when set) plus the extra ones it is handed (those of
//! `--webhook-ca-file`, read by the configuration).
//! Built once, at start; the receiver's certificate is always verified
//! (rustls with the `ring` provider, TLS 1.2 and 1.3), and there is no way
//! to turn verification off.

use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use std::fmt;
use std::sync::Arc;

/// The TLS client of an `https://` webhook cannot be set up.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WebhookTlsError {
    /// Neither the platform nor `--webhook-ca-file` gave a CA certificate.
    #[error("no CA certificate to verify the https:// webhook with: install the platform's CA certificates (e.g. the ca-certificates package) or give --webhook-ca-file")]
    NoRoots,
    /// rustls refused the configuration (not expected with its defaults).
    #[error("cannot set up TLS for the webhook: {0}")]
    Rustls(String),
}

/// The TLS client configuration of an `https://` webhook. `Debug` shows
/// how many roots it holds.
#[derive(Clone)]
pub(crate) struct WebhookTls {
    config: Arc<ClientConfig>,
    roots: usize,
}

impl WebhookTls {
    /// Trusts the platform's CA certificates and `extra`. Platform
    /// certificates that cannot be read or parsed are skipped (logged); no
    /// certificate at all is an error.
    pub(crate) fn new(extra: &[CertificateDer<'static>]) -> Result<Self, WebhookTlsError> {
        let native = rustls_native_certs::load_native_certs();
        for error in &native.errors {
            tracing::warn!(%error, "a platform CA certificate could not be loaded for the webhook");
        }
        Self::with_roots(native.certs, extra)
    }

    /// Trusts `platform` and `extra` (what `new` does, with the platform's
    /// certificates given).
    fn with_roots(
        platform: Vec<CertificateDer<'static>>,
        extra: &[CertificateDer<'static>],
    ) -> Result<Self, WebhookTlsError> {
        let mut store = RootCertStore::empty();
        let (_, skipped) = store.add_parsable_certificates(platform);
        if skipped > 0 {
            tracing::warn!(
                skipped,
                "platform CA certificates rustls cannot use were skipped for the webhook"
            );
        }
        for cert in extra {
            store
                .add(cert.clone())
                .map_err(|e| WebhookTlsError::Rustls(e.to_string()))?;
        }
        if store.is_empty() {
            return Err(WebhookTlsError::NoRoots);
        }
        let roots = store.len();
        let config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| WebhookTlsError::Rustls(e.to_string()))?
                .with_root_certificates(store)
                .with_no_client_auth();
        Ok(Self {
            config: Arc::new(config),
            roots,
        })
    }

    /// The rustls client configuration.
    pub(crate) fn client_config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }
}

impl fmt::Debug for WebhookTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookTls")
            .field("roots", &self.roots)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::webhook::{HttpWebhook, WebhookTarget};

    fn private_ca() -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn a_private_ca_is_trusted_besides_the_platforms() {
        let ca = private_ca();
        let only = WebhookTls::with_roots(Vec::new(), std::slice::from_ref(&ca)).unwrap();
        assert_eq!(only.roots, 1);
        assert_eq!(format!("{only:?}"), "WebhookTls { roots: 1 }");
        // Whatever the platform holds, the extra CA is added to it.
        let platform = rustls_native_certs::load_native_certs().certs;
        let mut store = RootCertStore::empty();
        let (usable, _) = store.add_parsable_certificates(platform.clone());
        let both = WebhookTls::with_roots(platform, &[ca]).unwrap();
        assert_eq!(both.roots, usable + 1);
    }

    #[test]
    fn no_trusted_certificate_at_all_is_an_error_not_an_open_door() {
        assert_eq!(
            WebhookTls::with_roots(Vec::new(), &[]).unwrap_err(),
            WebhookTlsError::NoRoots
        );
    }

    #[test]
    fn an_https_transport_trusts_the_platforms_cas_or_is_refused_at_start() {
        let url = WebhookTarget {
            https: true,
            host: "127.0.0.1".to_owned(),
            port: 8443,
            authority: "127.0.0.1:8443".to_owned(),
            path_and_query: "/h?token=x".to_owned(),
            shown: "https://127.0.0.1:8443/…".to_owned(),
        };
        let platform_only: &[CertificateDer<'static>] = &[];
        // Verified against the platform's CAs (none on a bare machine: an
        // error at start, never an unverified connection).
        match WebhookTls::new(platform_only) {
            Ok(tls) => assert!(tls.roots > 0),
            Err(e) => assert_eq!(e, WebhookTlsError::NoRoots, "{e}"),
        }
        match HttpWebhook::new(url.clone(), Some(platform_only)) {
            Ok(hook) => {
                let shown = format!("{hook:?}");
                assert!(shown.contains("tls: true"), "{shown}");
                assert!(!shown.contains("token"), "{shown}");
            }
            Err(e) => assert_eq!(e, WebhookTlsError::NoRoots, "{e}"),
        }
        assert!(HttpWebhook::new(url, Some(&[private_ca()])).is_ok());
    }
}
