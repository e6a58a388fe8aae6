//! What can go wrong on the command line, and the exit code of each.

use crate::adapters::http::HttpError;
use crate::adapters::postgres::RoleError;
use crate::client::ClientError;
use crate::domain::id::SandboxId;
use crate::ports::{RuntimeError, StoreError};

/// Exit code of a command whose `--wait` ended with the sandbox `failed`.
pub const EXIT_FAILED: u8 = 3;
/// Exit code of a command whose `--wait` ended before the sandbox was ready.
pub const EXIT_TIMED_OUT: u8 = 4;

/// Errors surfaced by the CLI.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// No usable database URL.
    #[error(transparent)]
    NoDatabase(#[from] crate::state_url::StateUrlError),
    /// Bad flag values.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Bad --features value.
    #[error("invalid --features value {0:?}: use ENGINE=FEATURE, e.g. postgres=pg_trgm or postgres=vector,postgis")]
    Feature(String),
    /// Bad --seed value.
    #[error("invalid --seed value {0:?}: use ENGINE=HASH once per engine, e.g. postgres=sha256:… (the hash `sandboxd seed put` printed)")]
    Seed(String),
    /// The seed file cannot be read.
    #[error("cannot read the seed from {0}: {1}")]
    SeedFile(String, #[source] std::io::Error),
    /// Store failures.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Client failures.
    #[error(transparent)]
    Client(#[from] crate::client::ClientError),
    /// Registering orchestrator roles failed.
    #[error(transparent)]
    Role(#[from] RoleError),
    /// Docker failures.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The webhook's TLS client cannot be set up.
    #[error(transparent)]
    WebhookTls(#[from] crate::adapters::webhook_tls::WebhookTlsError),
    /// Controller failures.
    #[error(transparent)]
    Controller(#[from] crate::controller::ControllerError),
    /// HTTP server failures.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// The operator page's token file cannot be used.
    #[error(transparent)]
    OperatorToken(#[from] super::console::TokenError),
    /// A `--http-host` is not a host name.
    #[error(transparent)]
    HttpHost(#[from] crate::domain::http_host::HostError),
    /// The node-exec helper could not run its command.
    #[error("node-exec: {0}")]
    NodeExec(RuntimeError),
    /// A chaos run could not run.
    #[error("{0}")]
    Chaos(String),
    /// A chaos run found an invariant broken (the report says which).
    #[error("chaos: an invariant did not hold (see unhealed, leaked, duplicate, lost_credentials and unconverged in the report)")]
    ChaosFound,
    /// A `sandboxd quota` argument is unusable.
    #[error("{0}")]
    Quota(String),
    /// The sandbox does not exist.
    #[error("no status for sandbox {0}: it was never applied, or sandboxd has not seen it yet")]
    NotFound(SandboxId),
    /// A touch found nothing to touch.
    #[error("sandbox {0} is not desired, has expired, or is being released: request it again (sandboxd request {0} --services …)")]
    NotDesired(SandboxId),
    /// The state database named in the file `scripts/run.sh` wrote does
    /// not answer.
    #[error("{error}\n(the URL came from {file}, which scripts/run.sh wrote when it started its state database: start it again with scripts/run.sh, or `docker start sandboxd-state`; or pass --database-url)")]
    RecordedUnreachable {
        /// The file.
        file: String,
        /// The connection failure.
        error: Box<CliError>,
    },
    /// A status holds an environment variable name a shell cannot take.
    #[error("the status of sandbox {id} has an environment variable named {name:?}, which is not a shell variable name; refusing to print it for eval (is the state database tampered with?)")]
    UnsafeVariable {
        /// Sandbox id.
        id: SandboxId,
        /// The name, without control characters.
        name: String,
    },
}

impl CliError {
    /// The process exit code: [`EXIT_FAILED`] when a waited-for sandbox
    /// failed, [`EXIT_TIMED_OUT`] when it was not ready in time, 1 otherwise
    /// (clap exits 2 on invalid arguments).
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::RecordedUnreachable { error, .. } => error.exit_code(),
            CliError::Client(ClientError::Failed { .. }) => EXIT_FAILED,
            CliError::Client(ClientError::Timeout { .. }) => EXIT_TIMED_OUT,
            CliError::Client(ClientError::CheckpointFailed { .. }) => EXIT_FAILED,
            CliError::Client(ClientError::CheckpointTimeout { .. }) => EXIT_TIMED_OUT,
            CliError::ChaosFound => EXIT_FAILED,
            CliError::NodeExec(_) => crate::adapters::docker::HELPER_FAILED,
            _ => 1,
        }
    }
}

impl CliError {
    /// Whether the state database could not be reached at all.
    pub(super) fn is_unreachable(&self) -> bool {
        matches!(
            self,
            CliError::Store(StoreError::Connect(_))
                | CliError::Client(ClientError::Store(StoreError::Connect(_)))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn exit_codes_tell_a_failed_sandbox_from_one_not_ready_in_time() {
        let id = SandboxId::parse("agent-7").unwrap();
        let failed = CliError::Client(ClientError::Failed {
            id: id.clone(),
            message: "why".into(),
        });
        let timed_out = CliError::Client(ClientError::Timeout {
            id: id.clone(),
            timeout: Duration::from_secs(1),
            phase: "provisioning".into(),
        });
        assert_eq!(failed.exit_code(), EXIT_FAILED);
        assert_eq!(timed_out.exit_code(), EXIT_TIMED_OUT);
        assert_eq!(CliError::NotDesired(id).exit_code(), 1);
        assert_eq!(
            CliError::NoDatabase(crate::state_url::StateUrlError::Empty(Default::default()))
                .exit_code(),
            1
        );
    }
}
