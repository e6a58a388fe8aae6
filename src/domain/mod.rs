//! The pure core: identifiers, secrets, the sandbox model, observed
//! containers, and the two decisions (`plan` and the status decision).
//!
//! Nothing here talks to Docker or Postgres or waits on anything: this
//! module imports no tokio, bollard or sqlx, so every decision is a plain
//! function tested with tables.

pub mod admission;
pub mod attach;
pub mod breaker;
pub mod checkpoint;
pub mod clock;
pub mod container;
pub mod crash_loop;
pub mod death;
pub(crate) mod desired_row;
pub(crate) mod entropy;
pub mod event;
pub mod fork;
pub(crate) mod gate;
pub(crate) mod hex;
pub mod host_net;
pub mod http_host;
pub(crate) mod id;
pub mod identity;
pub mod isolation;
pub mod labels;
pub mod lease;
pub mod limits;
#[cfg(any(test, feature = "simulation"))]
pub mod mutation;
pub mod network;
pub mod notice;
pub(crate) mod own_image;
pub(crate) mod pause;
pub(crate) mod pg_script;
pub mod plan;
pub mod pool;
pub(crate) mod resync;
pub mod sandbox;
pub(crate) mod secret;
pub mod seed;
pub(crate) mod start;
pub mod status;
pub mod template_volume;
pub(crate) mod volume_disk;

pub use self::id::{ContainerId, Deployment, EngineName, IdError, SandboxId};
pub use self::identity::{Incarnation, StateId};
pub use self::isolation::Isolation;
pub use self::sandbox::{DesiredSandbox, Phase, SandboxStatus, ServiceStatus};
pub use self::secret::Secret;

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path.display().to_string(), text));
            }
        }
    }

    #[test]
    fn the_domain_imports_no_runtime_docker_or_database_crate() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/domain");
        let mut files = Vec::new();
        sources(&dir, &mut files);
        assert!(files.len() >= 10, "found {} files", files.len());
        for (path, text) in files {
            for line in text.lines().map(str::trim_start) {
                if line.starts_with("//") {
                    continue;
                }
                for forbidden in [
                    "tokio",
                    "bollard",
                    "sqlx",
                    "crate::adapters",
                    "crate::controller",
                ] {
                    assert!(!line.contains(&format!("{forbidden}::")), "{path}: {line}");
                }
            }
        }
    }
}
