//! The webhook's configuration: where each recorded event is POSTed, the
//! secret it is signed with, whom it trusts over https (`WebhookTrust`), and
//! how hard sandboxd tries. Validated once, at start; the URL is never shown
//! in full (its path or query may hold a token) and the secret never at all.

use super::webhook_trust::{WebhookTrust, WebhookTrustError};
use crate::domain::secret::Secret;
use std::fmt;
use std::path::Path;
use std::time::Duration;

/// The shortest signing secret accepted.
pub const MIN_SECRET_LEN: usize = 16;

/// A webhook configuration that cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WebhookConfigError {
    /// The URL does not parse, or names no host.
    #[error("invalid --webhook-url ({shown}): use https://HOST[:PORT]/PATH (or http:// to a receiver on the same host or a trusted network)")]
    Url {
        /// The URL with its path and query hidden.
        shown: String,
    },
    /// The URL's scheme is neither https nor http.
    #[error("--webhook-url {shown}: only https:// and http:// are supported")]
    Scheme {
        /// The URL with its path and query hidden.
        shown: String,
    },
    /// The URL holds a user name or password.
    #[error("--webhook-url must not hold a user or password (user:password@host): the receiver authenticates sandboxd by the X-Sandboxd-Signature header")]
    Userinfo,
    /// A URL without a secret, or a secret without a URL.
    #[error("--webhook-url and --webhook-secret-file go together: every delivery is signed")]
    Incomplete,
    /// The secret file cannot be read.
    #[error("cannot read --webhook-secret-file {path}: {error}")]
    SecretFile {
        /// The file.
        path: String,
        /// Why.
        error: String,
    },
    /// The secret is too short.
    #[error("the secret in --webhook-secret-file {path} is shorter than {MIN_SECRET_LEN} characters: write a long random one (e.g. openssl rand -hex 32)")]
    ShortSecret {
        /// The file.
        path: String,
    },
    /// A limit is zero.
    #[error("--webhook-timeout and --webhook-queue must be above zero")]
    Zero,
    /// `--webhook-ca-file` with an `http://` URL (nothing would verify it).
    #[error("--webhook-ca-file is for an https:// --webhook-url; {shown} is http:// and sent in the clear")]
    CaWithoutTls {
        /// The URL with its path and query hidden.
        shown: String,
    },
    /// An `https://` URL without a TLS configuration (a configuration
    /// built in code rather than from the flags).
    #[error("the https:// webhook {shown} has no TLS configuration (WebhookConfig::tls)")]
    NoTls {
        /// The URL with its path and query hidden.
        shown: String,
    },
    /// The `--webhook-ca-file` of an `https://` URL cannot be used.
    #[error(transparent)]
    Tls(#[from] WebhookTrustError),
}

/// A validated `https://` or `http://` webhook URL. `Display` and `Debug`
/// show only `scheme://host:port/…` (no path, no query).
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookUrl {
    uri: hyper::Uri,
    host: String,
    port: u16,
    https: bool,
}

impl WebhookUrl {
    /// Parses and checks `url`.
    pub fn parse(url: &str) -> Result<Self, WebhookConfigError> {
        let shown = || Self::redact(url);
        let uri: hyper::Uri = url
            .trim()
            .parse()
            .map_err(|_| WebhookConfigError::Url { shown: shown() })?;
        let authority = uri
            .authority()
            .ok_or_else(|| WebhookConfigError::Url { shown: shown() })?;
        if authority.as_str().contains('@') {
            return Err(WebhookConfigError::Userinfo);
        }
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            Some(_) => return Err(WebhookConfigError::Scheme { shown: shown() }),
            None => return Err(WebhookConfigError::Url { shown: shown() }),
        };
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(WebhookConfigError::Url { shown: shown() });
        }
        Ok(Self {
            host: host.to_owned(),
            port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
            https,
            uri,
        })
    }

    /// Best-effort `scheme://authority/…` of an unparsed URL, without any
    /// user, password, path or query.
    fn redact(url: &str) -> String {
        let Some((scheme, rest)) = url.trim().split_once("://") else {
            return "not a URL".to_owned();
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let host = authority.rsplit('@').next().unwrap_or_default();
        let scheme: String = scheme
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(10)
            .collect();
        let host: String = host.chars().filter(|c| !c.is_control()).take(100).collect();
        format!("{scheme}://{host}/…")
    }

    /// The host to connect to.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the URL is `https://` (TLS, the receiver's certificate
    /// verified) rather than `http://`.
    pub fn is_https(&self) -> bool {
        self.https
    }

    /// The whole URL (to send the request; never to log).
    pub fn uri(&self) -> &hyper::Uri {
        &self.uri
    }
}

impl fmt::Display for WebhookUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        // An IPv6 address is bracketed, as in the URL.
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}/…", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}/…", self.host, self.port)
        }
    }
}

impl fmt::Debug for WebhookUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WebhookUrl({self})")
    }
}

/// Where each recorded event is POSTed, signed, and how hard sandboxd
/// tries (see `controller::webhook`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// The receiver.
    pub url: WebhookUrl,
    /// The signing secret (`Debug` hides it).
    pub secret: Secret,
    /// Bound on one attempt (connect, send, response head).
    pub timeout: Duration,
    /// Attempts after the first for one event, with exponential backoff.
    pub retries: u32,
    /// Events waiting to be sent; past it new ones are dropped (counted).
    pub queue: usize,
    /// Whom an `https://` URL is verified against (`None` for `http://`).
    pub tls: Option<WebhookTrust>,
}

impl WebhookConfig {
    /// A configuration with the default limits (5 s per attempt, 3
    /// retries, 1000 queued).
    pub fn new(url: WebhookUrl, secret: Secret) -> Self {
        Self {
            url,
            secret,
            timeout: Duration::from_secs(5),
            retries: 3,
            queue: 1000,
            tls: None,
        }
    }

    /// The configuration of `--webhook-url`, `--webhook-secret-file` and
    /// `--webhook-ca-file`: none if neither of the first two is given. The
    /// secret is the file's content without surrounding whitespace. An
    /// `https://` URL trusts the platform's CA certificates and those of
    /// the CA file (read here; the TLS client is the adapter's).
    pub fn from_flags(
        url: Option<&str>,
        secret_file: Option<&Path>,
        ca_file: Option<&Path>,
    ) -> Result<Option<Self>, WebhookConfigError> {
        match (url, secret_file) {
            (None, None) if ca_file.is_some() => Err(WebhookConfigError::Incomplete),
            (None, None) => Ok(None),
            (Some(url), Some(path)) => {
                let url = WebhookUrl::parse(url)?;
                let tls = match (url.is_https(), ca_file) {
                    (true, ca) => Some(WebhookTrust::from_ca_file(ca)?),
                    (false, Some(_)) => {
                        return Err(WebhookConfigError::CaWithoutTls {
                            shown: url.to_string(),
                        })
                    }
                    (false, None) => None,
                };
                let shown = path.display().to_string();
                let text =
                    std::fs::read_to_string(path).map_err(|e| WebhookConfigError::SecretFile {
                        path: shown.clone(),
                        error: e.to_string(),
                    })?;
                let secret = text.trim();
                if secret.chars().count() < MIN_SECRET_LEN {
                    return Err(WebhookConfigError::ShortSecret { path: shown });
                }
                Ok(Some(Self {
                    tls,
                    ..Self::new(url, Secret::new(secret))
                }))
            }
            _ => Err(WebhookConfigError::Incomplete),
        }
    }

    /// Checks the limits, and that an `https://` URL has its TLS
    /// configuration.
    pub fn check(&self) -> Result<(), WebhookConfigError> {
        if self.timeout.is_zero() || self.queue == 0 {
            return Err(WebhookConfigError::Zero);
        }
        if self.url.is_https() && self.tls.is_none() {
            return Err(WebhookConfigError::NoTls {
                shown: self.url.to_string(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http_url_keeps_its_host_port_and_shows_neither_path_nor_query() {
        let u = WebhookUrl::parse("http://127.0.0.1:8080/hooks/T0K3N?key=abc").unwrap();
        assert_eq!((u.host(), u.port()), ("127.0.0.1", 8080));
        assert_eq!(u.to_string(), "http://127.0.0.1:8080/…");
        assert!(!format!("{u:?}").contains("T0K3N"));
        assert_eq!(
            u.uri().path_and_query().unwrap().as_str(),
            "/hooks/T0K3N?key=abc"
        );
        assert_eq!(
            WebhookUrl::parse("http://hooks.internal/").unwrap().port(),
            80
        );
    }

    #[test]
    fn an_https_url_defaults_to_port_443_and_shows_neither_path_nor_query() {
        let u = WebhookUrl::parse("https://hooks.example/T0K3N?key=abc").unwrap();
        assert!(u.is_https());
        assert_eq!((u.host(), u.port()), ("hooks.example", 443));
        assert_eq!(u.to_string(), "https://hooks.example:443/…");
        assert!(!format!("{u:?}").contains("T0K3N"));
        assert!(!WebhookUrl::parse("http://h/").unwrap().is_https());
        let v6 = WebhookUrl::parse("https://[::1]:8443/T0K3N").unwrap();
        assert_eq!(
            (v6.host(), v6.to_string().as_str()),
            ("::1", "https://[::1]:8443/…")
        );
    }

    #[test]
    fn a_ca_file_goes_with_an_https_url_only_and_an_https_url_needs_its_tls() {
        let dir = std::env::temp_dir().join(format!("sandboxd-webhook-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, "0123456789abcdef0123\n").unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, "").unwrap();
        let e =
            WebhookConfig::from_flags(Some("http://127.0.0.1:9/T0K3N"), Some(&secret), Some(&ca))
                .unwrap_err();
        assert!(matches!(e, WebhookConfigError::CaWithoutTls { .. }), "{e}");
        assert!(!e.to_string().contains("T0K3N"), "{e}");
        assert_eq!(
            WebhookConfig::from_flags(None, None, Some(&ca)),
            Err(WebhookConfigError::Incomplete)
        );
        // A CA file without a certificate is refused before anything runs.
        assert!(matches!(
            WebhookConfig::from_flags(Some("https://127.0.0.1:9/x"), Some(&secret), Some(&ca)),
            Err(WebhookConfigError::Tls(
                WebhookTrustError::NoCertificate { .. }
            ))
        ));
        // Built in code without its trust: refused by the start's check.
        let bare = WebhookConfig::new(
            WebhookUrl::parse("https://127.0.0.1:9/T0K3N").unwrap(),
            Secret::new("0123456789abcdef0123"),
        );
        let e = bare.check().unwrap_err();
        assert!(matches!(e, WebhookConfigError::NoTls { .. }), "{e}");
        assert!(!e.to_string().contains("T0K3N"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn other_schemes_userinfo_and_garbage_are_refused_without_echoing_the_url() {
        let e = WebhookUrl::parse("ftp://hooks.example/T0K3N").unwrap_err();
        assert!(matches!(e, WebhookConfigError::Scheme { .. }));
        assert!(!e.to_string().contains("T0K3N"), "{e}");
        let e = WebhookUrl::parse("http://user:pa55word@hooks.internal/x").unwrap_err();
        assert_eq!(e, WebhookConfigError::Userinfo);
        assert!(!e.to_string().contains("pa55word"));
        let e = WebhookUrl::parse("not a url T0K3N").unwrap_err();
        assert!(!e.to_string().contains("T0K3N"), "{e}");
        assert!(WebhookUrl::parse("/just/a/path").is_err());
    }

    #[test]
    fn the_secret_comes_from_a_file_and_must_be_long() {
        let dir = std::env::temp_dir().join(format!("sandboxd-webhook-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let long = dir.join("long");
        std::fs::write(&long, "0123456789abcdef0123\n").unwrap();
        let short = dir.join("short");
        std::fs::write(&short, "tiny\n").unwrap();
        let url = Some("http://127.0.0.1:9/x");
        let c = WebhookConfig::from_flags(url, Some(&long), None)
            .unwrap()
            .unwrap();
        assert_eq!(c.secret.expose(), "0123456789abcdef0123");
        assert!(!format!("{c:?}").contains("0123456789abcdef"));
        assert!(matches!(
            WebhookConfig::from_flags(url, Some(&short), None),
            Err(WebhookConfigError::ShortSecret { .. })
        ));
        assert!(matches!(
            WebhookConfig::from_flags(url, Some(&dir.join("absent")), None),
            Err(WebhookConfigError::SecretFile { .. })
        ));
        assert_eq!(
            WebhookConfig::from_flags(url, None, None),
            Err(WebhookConfigError::Incomplete)
        );
        assert_eq!(WebhookConfig::from_flags(None, None, None), Ok(None));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
