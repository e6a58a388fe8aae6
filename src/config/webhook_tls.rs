//! Whom sandboxd trusts when it POSTs to an `https://` webhook: the
//! platform's CA certificates (`rustls-native-certs`: the system store, or
//! `SSL_CERT_FILE` / `SSL_CERT_DIR` when set) plus those of
//! `--webhook-ca-file`. Built once, at start; the receiver's certificate is
//! always verified (rustls with the `ring` provider, TLS 1.2 and 1.3), and
//! there is no way to turn verification off.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// Trust for an `https://` webhook that cannot be set up.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WebhookTlsError {
    /// The CA file cannot be read or holds something that is not a PEM
    /// certificate.
    #[error("cannot read --webhook-ca-file {path}: {error}: give a PEM file of CA certificates (-----BEGIN CERTIFICATE-----)")]
    CaFile {
        /// The file.
        path: String,
        /// Why.
        error: String,
    },
    /// The CA file holds no certificate sandboxd can use as a root.
    #[error("--webhook-ca-file {path} holds no usable CA certificate: give a PEM file of CA certificates (-----BEGIN CERTIFICATE-----)")]
    NoCertificate {
        /// The file.
        path: String,
    },
    /// Neither the platform nor `--webhook-ca-file` gave a CA certificate.
    #[error("no CA certificate to verify the https:// webhook with: install the platform's CA certificates (e.g. the ca-certificates package) or give --webhook-ca-file")]
    NoRoots,
    /// rustls refused the configuration (not expected with its defaults).
    #[error("cannot set up TLS for the webhook: {0}")]
    Rustls(String),
}

/// The TLS client configuration of an `https://` webhook: the platform's
/// CA certificates plus any extra ones, verified by rustls (ring). `Debug`
/// shows how many roots it holds; two are equal when they are the same
/// configuration.
#[derive(Clone)]
pub struct WebhookTls {
    config: Arc<ClientConfig>,
    roots: usize,
}

impl WebhookTls {
    /// Trusts the platform's CA certificates and `extra` (e.g. a private
    /// CA). Platform certificates that cannot be read or parsed are skipped
    /// (logged); an empty trust is an error.
    pub fn new(extra: &[CertificateDer<'static>]) -> Result<Self, WebhookTlsError> {
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

    /// The CA certificates of the PEM file `path` (at least one, each
    /// usable as a root).
    pub fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, WebhookTlsError> {
        let shown = path.display().to_string();
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| WebhookTlsError::CaFile {
                path: shown.clone(),
                error: e.to_string(),
            })?;
        let mut check = RootCertStore::empty();
        let (_, unusable) = check.add_parsable_certificates(certs.iter().cloned());
        if certs.is_empty() || unusable > 0 {
            return Err(WebhookTlsError::NoCertificate { path: shown });
        }
        Ok(certs)
    }

    /// The rustls client configuration.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }

    /// How many CA certificates are trusted.
    pub fn roots(&self) -> usize {
        self.roots
    }
}

impl PartialEq for WebhookTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config)
    }
}

impl Eq for WebhookTls {}

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

    fn temp(name: &str, content: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sandboxd-webhook-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused_at_start() {
        let empty = temp("empty.pem", "");
        assert!(matches!(
            WebhookTls::read_ca_file(&empty),
            Err(WebhookTlsError::NoCertificate { .. })
        ));
        let garbage = temp(
            "garbage.pem",
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
        );
        assert!(matches!(
            WebhookTls::read_ca_file(&garbage),
            Err(WebhookTlsError::NoCertificate { .. })
        ));
        let absent = std::env::temp_dir().join("sandboxd-no-such-ca-file.pem");
        let e = WebhookTls::read_ca_file(&absent).unwrap_err();
        assert!(matches!(e, WebhookTlsError::CaFile { .. }), "{e}");
        assert!(e.to_string().contains("--webhook-ca-file"), "{e}");
        std::fs::remove_file(&empty).unwrap();
        std::fs::remove_file(&garbage).unwrap();
    }

    #[test]
    fn a_private_cas_pem_file_is_trusted_besides_the_platforms() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&key).unwrap();
        let file = temp("ca.pem", &format!("{}{}", ca.pem(), ca.pem()));
        let certs = WebhookTls::read_ca_file(&file).unwrap();
        assert_eq!(certs.len(), 2);
        let only = WebhookTls::with_roots(Vec::new(), &certs[..1]).unwrap();
        assert_eq!(only.roots(), 1);
        assert_eq!(format!("{only:?}"), "WebhookTls { roots: 1 }");
        assert_eq!(only, only.clone());
        // Whatever the platform holds, the extra CA is added to it.
        let platform = rustls_native_certs::load_native_certs().certs;
        let mut store = RootCertStore::empty();
        let (usable, _) = store.add_parsable_certificates(platform.clone());
        let both = WebhookTls::with_roots(platform, &certs[..1]).unwrap();
        assert_eq!(both.roots(), usable + 1);
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn no_trusted_certificate_at_all_is_an_error_not_an_open_door() {
        assert_eq!(
            WebhookTls::with_roots(Vec::new(), &[]).unwrap_err(),
            WebhookTlsError::NoRoots
        );
    }
}
