//! Which `Host` a request to sandboxd's HTTP port may name.
//!
//! A page on any site can make the operator's browser read this port
//! through DNS rebinding: its name (`rebind.example`) first resolves to the
//! attacker's server, which serves the page, then to 127.0.0.1, and the
//! browser, still counting what answers as `rebind.example`'s, lets the
//! page's script read it: on the operator page every owner, sandbox id and
//! message; on `/metrics` owners (quota series) and sandbox ids (heal
//! loops). The browser cannot lie about the name, though: the request says
//! `Host: rebind.example:9187`. So the port answers only requests whose
//! Host is a name it is served on:
//!
//! - an IP address (`127.0.0.1:9187`, `[::1]:9187`, the address of a
//!   container or host sandboxd listens on): a page whose origin is an
//!   address was served from that address and port, by sandboxd itself,
//!   so no rebinding is involved; Prometheus and probes that target an
//!   address need nothing more;
//! - `localhost`, which browsers resolve to loopback themselves;
//! - the names the operator adds with `--http-host` (a scrape target or
//!   proxy that reaches sandboxd by name).
//!
//! The port is not compared: a port forward (`ssh -L 8080:127.0.0.1:9187`)
//! changes it, and the attacker's name is what tells. A request without a
//! Host (HTTP/1.0) is no browser's and is answered. Names compare without
//! case and without a trailing dot. Forwarding headers (`X-Forwarded-Host`,
//! `Forwarded`) are never read: a rebinding page may set them.
//!
//! Pure, tested with a table.

use std::collections::BTreeSet;
use std::net::IpAddr;

/// The flag that adds a name.
pub const FLAG: &str = "--http-host";

/// A name given to `--http-host` that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// Not letters, digits, `-`, `_` and `.` (a port, a scheme, a path,
    /// or empty).
    #[error("--http-host {0:?} is not a host name: give the bare name clients reach sandboxd by (letters, digits, '-', '_' and '.', no scheme or port), e.g. --http-host sandboxd.internal")]
    NotAName(String),
}

/// The names the HTTP port answers to besides addresses and `localhost`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    names: BTreeSet<String>,
}

impl AllowedHosts {
    /// Addresses and `localhost`, and `names` (from `--http-host`).
    pub fn new(names: &[String]) -> Result<Self, HostError> {
        let names = names
            .iter()
            .map(|n| {
                let name = normalise(n.trim());
                let ok = !name.is_empty()
                    && name.len() <= 253
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
                ok.then_some(name)
                    .ok_or_else(|| HostError::NotAName(n.clone()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { names })
    }

    /// Whether a request whose Host (or URI authority) is `host` is
    /// answered; `None`: it named none.
    pub fn admits(&self, host: Option<&str>) -> bool {
        let Some(host) = host else {
            return true;
        };
        let name = normalise(without_port(host));
        if name.parse::<IpAddr>().is_ok() {
            return true;
        }
        name == "localhost" || self.names.contains(&name)
    }

    /// The names added, for the refusal's text.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }
}

/// `host` without its `:port`, and an IPv6 address without its brackets.
fn without_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(host, |(address, _)| address);
    }
    match host.rsplit_once(':') {
        // One colon: a port. More: an unbracketed IPv6 address.
        Some((name, _)) if !name.contains(':') => name,
        _ => host,
    }
}

/// Lowercase, without one trailing dot (`Localhost.` is `localhost`).
fn normalise(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_localhost_and_the_names_added_are_answered() {
        let allowed =
            AllowedHosts::new(&["sandboxd.internal".into(), "Prom_Target".into()]).unwrap();
        let cases = [
            (None, true),
            (Some("127.0.0.1:9187"), true),
            (Some("127.0.0.1"), true),
            (Some("[::1]:9187"), true),
            (Some("[::1]"), true),
            (Some("::1"), true),
            (Some("10.1.2.3:9187"), true),
            (Some("localhost:9187"), true),
            (Some("LOCALHOST.:8080"), true),
            (Some("sandboxd.internal:9187"), true),
            (Some("SandboxD.Internal."), true),
            (Some("prom_target:9187"), true),
            // A rebinding page's own name, whatever it resolves to now.
            (Some("rebind.example:9187"), false),
            (Some("127.0.0.1.rebind.example:9187"), false),
            (Some("localhost.rebind.example"), false),
            (Some("sub.localhost:9187"), false),
            (Some("sandboxd.internal.example"), false),
            (Some("internal"), false),
            (Some(""), false),
            (Some("[::1"), false),
            (Some("2130706433:9187"), false),
        ];
        for (host, answered) in cases {
            assert_eq!(allowed.admits(host), answered, "{host:?}");
        }
        let bare = AllowedHosts::default();
        assert!(!bare.admits(Some("sandboxd.internal:9187")));
        assert!(bare.admits(Some("127.0.0.1:9187")));
    }

    #[test]
    fn a_name_added_must_be_a_bare_host_name() {
        for bad in [
            "",
            " ",
            "sandboxd:9187",
            "http://sandboxd",
            "sandboxd/x",
            "a b",
            "é.example",
        ] {
            assert_eq!(
                AllowedHosts::new(&[bad.into()]),
                Err(HostError::NotAName(bad.into())),
                "{bad:?}"
            );
        }
        let refused = HostError::NotAName("sandboxd:9187".into()).to_string();
        assert!(
            refused.contains("--http-host sandboxd.internal"),
            "{refused}"
        );
        let added = AllowedHosts::new(&["Sandboxd.Internal.".into(), "10.0.0.1".into()]).unwrap();
        assert_eq!(
            added.names().collect::<Vec<_>>(),
            ["10.0.0.1", "sandboxd.internal"]
        );
    }
}
