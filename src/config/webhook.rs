//! The webhook's configuration: where each recorded event is POSTed, the
//! secret it is signed with, and how hard sandboxd tries. Validated once,
//! at start; the URL is never shown in full (its path or query may hold a
//! token) and the secret never at all.

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
    #[error("invalid --webhook-url ({shown}): use http://HOST[:PORT]/PATH")]
    Url {
        /// The URL with its path and query hidden.
        shown: String,
    },
    /// The URL's scheme is not http.
    #[error("--webhook-url {shown}: only http:// is supported (this build has no TLS client); send to a relay on the same host or network that forwards over https")]
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
}

/// A validated `http://` webhook URL. `Display` and `Debug` show only
/// `http://host:port/…` (no path, no query).
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookUrl {
    uri: hyper::Uri,
    host: String,
    port: u16,
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
        match uri.scheme_str() {
            Some("http") => {}
            Some(_) => return Err(WebhookConfigError::Scheme { shown: shown() }),
            None => return Err(WebhookConfigError::Url { shown: shown() }),
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(WebhookConfigError::Url { shown: shown() });
        }
        Ok(Self {
            host: host.to_owned(),
            port: authority.port_u16().unwrap_or(80),
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

    /// The whole URL (to send the request; never to log).
    pub fn uri(&self) -> &hyper::Uri {
        &self.uri
    }
}

impl fmt::Display for WebhookUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}:{}/…", self.host, self.port)
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
        }
    }

    /// The configuration of `--webhook-url` and `--webhook-secret-file`:
    /// none if neither is given. The secret is the file's content without
    /// surrounding whitespace.
    pub fn from_flags(
        url: Option<&str>,
        secret_file: Option<&Path>,
    ) -> Result<Option<Self>, WebhookConfigError> {
        match (url, secret_file) {
            (None, None) => Ok(None),
            (Some(url), Some(path)) => {
                let url = WebhookUrl::parse(url)?;
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
                Ok(Some(Self::new(url, Secret::new(secret))))
            }
            _ => Err(WebhookConfigError::Incomplete),
        }
    }

    /// Checks the limits.
    pub fn check(&self) -> Result<(), WebhookConfigError> {
        if self.timeout.is_zero() || self.queue == 0 {
            return Err(WebhookConfigError::Zero);
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
    fn https_userinfo_and_garbage_are_refused_without_echoing_the_url() {
        let e = WebhookUrl::parse("https://hooks.example/T0K3N").unwrap_err();
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
        let c = WebhookConfig::from_flags(url, Some(&long))
            .unwrap()
            .unwrap();
        assert_eq!(c.secret.expose(), "0123456789abcdef0123");
        assert!(!format!("{c:?}").contains("0123456789abcdef"));
        assert!(matches!(
            WebhookConfig::from_flags(url, Some(&short)),
            Err(WebhookConfigError::ShortSecret { .. })
        ));
        assert!(matches!(
            WebhookConfig::from_flags(url, Some(&dir.join("absent"))),
            Err(WebhookConfigError::SecretFile { .. })
        ));
        assert_eq!(
            WebhookConfig::from_flags(url, None),
            Err(WebhookConfigError::Incomplete)
        );
        assert_eq!(WebhookConfig::from_flags(None, None), Ok(None));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
