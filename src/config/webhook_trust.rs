//! Whom sandboxd trusts when it POSTs to an `https://` webhook, as plain
//! values: the CA certificates of `--webhook-ca-file`, read and checked at
//! start. The platform's CA certificates are added to them, and the TLS
//! client built, by the webhook's adapter (`adapters::webhook_tls`).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;
use std::fmt;
use std::path::Path;

/// A `--webhook-ca-file` that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WebhookTrustError {
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
}

/// The CA certificates an `https://` webhook trusts besides the
/// platform's (none: the platform's only). `Debug` shows how many.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct WebhookTrust {
    /// Extra roots, e.g. a private CA's (DER).
    pub extra: Vec<CertificateDer<'static>>,
}

impl WebhookTrust {
    /// Trust in the CA certificates of the PEM file `ca_file` besides the
    /// platform's (in the platform's only without one).
    pub fn from_ca_file(ca_file: Option<&Path>) -> Result<Self, WebhookTrustError> {
        Ok(Self {
            extra: ca_file.map(read_ca_file).transpose()?.unwrap_or_default(),
        })
    }
}

/// The CA certificates of the PEM file `path`: at least one, and each
/// usable as a root (checked here, so a bad file stops the start rather
/// than every delivery).
fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, WebhookTrustError> {
    let shown = path.display().to_string();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| WebhookTrustError::CaFile {
            path: shown.clone(),
            error: e.to_string(),
        })?;
    let mut check = RootCertStore::empty();
    let (_, unusable) = check.add_parsable_certificates(certs.iter().cloned());
    if certs.is_empty() || unusable > 0 {
        return Err(WebhookTrustError::NoCertificate { path: shown });
    }
    Ok(certs)
}

impl fmt::Debug for WebhookTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookTrust")
            .field("extra", &self.extra.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, content: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("sandboxd-webhook-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused_at_start() {
        let empty = temp("empty.pem", "");
        assert!(matches!(
            read_ca_file(&empty),
            Err(WebhookTrustError::NoCertificate { .. })
        ));
        let garbage = temp(
            "garbage.pem",
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
        );
        assert!(matches!(
            read_ca_file(&garbage),
            Err(WebhookTrustError::NoCertificate { .. })
        ));
        let absent = std::env::temp_dir().join("sandboxd-no-such-ca-file.pem");
        let e = read_ca_file(&absent).unwrap_err();
        assert!(matches!(e, WebhookTrustError::CaFile { .. }), "{e}");
        assert!(e.to_string().contains("--webhook-ca-file"), "{e}");
        std::fs::remove_file(&empty).unwrap();
        std::fs::remove_file(&garbage).unwrap();
    }

    #[test]
    fn a_private_cas_pem_file_is_read_in_full() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&key).unwrap();
        let file = temp("ca.pem", &format!("{}{}", ca.pem(), ca.pem()));
        let trust = WebhookTrust::from_ca_file(Some(&file)).unwrap();
        assert_eq!(trust.extra.len(), 2);
        assert_eq!(trust.extra[0], *ca.der());
        assert_eq!(format!("{trust:?}"), "WebhookTrust { extra: 2 }");
        assert_eq!(
            WebhookTrust::from_ca_file(None).unwrap(),
            WebhookTrust::default()
        );
        std::fs::remove_file(&file).unwrap();
    }
}
