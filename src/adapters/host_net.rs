//! The host's routes and Linux bridges, read from `/proc/net/route` and
//! `/sys/class/net` (no process started), and a stale bridge removed with
//! `ip link delete`.
//!
//! Removing a link takes CAP_NET_ADMIN in the host's network namespace.
//! sandboxd run on the host as root (or with that capability) has it; as
//! an ordinary user in the `docker` group, or in its own container
//! (`deploy/compose.yaml` drops every capability and is not on the host's
//! network), it has not: the removal is refused, and the caller says so
//! and counts it, and goes on.

use crate::domain::host_net::{parse_routes, Link, Route};
use crate::ports::runtime::BridgeOutcome;
use std::path::Path;
use std::time::Duration;

/// Why the host's network could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostNetError {
    /// `/proc/net/route` or `/sys/class/net` could not be read.
    #[error("could not read {path}: {source}; sandboxd cannot check the host's routes and bridges (is /proc or /sys mounted?)")]
    Read {
        /// What was read.
        path: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

/// The host's IPv4 routes of the main table that are up.
pub(crate) fn routes() -> Result<Vec<Route>, HostNetError> {
    const PATH: &str = "/proc/net/route";
    std::fs::read_to_string(PATH)
        .map(|text| parse_routes(&text))
        .map_err(|source| HostNetError::Read { path: PATH, source })
}

/// The network interfaces this process sees, with whether each is a
/// bridge and how many ports it has.
pub(crate) fn links() -> Result<Vec<Link>, HostNetError> {
    const PATH: &str = "/sys/class/net";
    let read = |source| HostNetError::Read { path: PATH, source };
    let mut links = Vec::new();
    for entry in std::fs::read_dir(PATH).map_err(read)? {
        let entry = entry.map_err(read)?;
        let dir = entry.path();
        let ports = std::fs::read_dir(dir.join("brif")).map_or(0, |d| d.count());
        links.push(Link {
            name: entry.file_name().to_string_lossy().into_owned(),
            bridge: dir.join("bridge").is_dir(),
            ports,
        });
    }
    Ok(links)
}

/// Whether this process sees a network interface called `name`.
pub(crate) fn has_link(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('/')
        && name != ".."
        && Path::new("/sys/class/net").join(name).exists()
}

/// Removes the bridge `name` with `ip link delete`, within `within`.
pub(crate) async fn delete_bridge(name: &str, within: Duration) -> BridgeOutcome {
    let run = tokio::process::Command::new("ip")
        .args(["link", "delete", "dev", name, "type", "bridge"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(within, run).await {
        Err(_) => {
            return BridgeOutcome::Failed(format!(
                "`ip link delete {name}` did not finish within {within:?}"
            ))
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return BridgeOutcome::NotPermitted(format!(
                "removing it needs `ip` (iproute2), which this host or image lacks: install it, or remove the bridge as root with `ip link delete {name}`"
            ))
        }
        Ok(Err(e)) => return BridgeOutcome::Failed(format!("could not run `ip`: {e}")),
        Ok(Ok(out)) => out,
    };
    if out.status.success() {
        return BridgeOutcome::Removed;
    }
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if stderr.contains("Cannot find device") {
        BridgeOutcome::Gone
    } else if stderr.contains("Operation not permitted") {
        BridgeOutcome::NotPermitted(format!(
            "removing it needs CAP_NET_ADMIN, which sandboxd runs without: remove it as root with `ip link delete {name}`, or run sandboxd with that capability ({stderr})"
        ))
    } else {
        BridgeOutcome::Failed(format!("`ip link delete {name}` failed: {stderr}"))
    }
}
