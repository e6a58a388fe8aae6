//! Containers as sandboxd observes them: what the runtime listed, reduced to
//! what the decision needs.

use super::id::ContainerId;
use super::labels::ContainerLabels;
use chrono::{DateTime, Utc};

/// Coarse container state as sandboxd needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContainerState {
    /// Created, not started yet.
    Created,
    /// Running (or restarting/paused: alive in some form).
    Running,
    /// Exited or dead.
    Exited,
    /// Being removed.
    Removing,
}

impl ContainerState {
    /// Every state, for metrics.
    pub const ALL: [ContainerState; 4] = [
        ContainerState::Created,
        ContainerState::Running,
        ContainerState::Exited,
        ContainerState::Removing,
    ];

    /// Label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerState::Created => "created",
            ContainerState::Running => "running",
            ContainerState::Exited => "exited",
            ContainerState::Removing => "removing",
        }
    }
}

/// One managed container as listed by the runtime.
#[derive(Debug, Clone)]
pub struct ObservedContainer {
    /// Container id.
    pub id: ContainerId,
    /// Container name without the leading slash.
    pub name: String,
    /// What its labels say.
    pub labels: ContainerLabels,
    /// Its state.
    pub state: ContainerState,
    /// When the runtime created it (the runtime's clock).
    pub created: DateTime<Utc>,
    /// Port published on the host for the engine port, if any.
    pub host_port: Option<u16>,
    /// The networks it is on, by name, as the list saw them.
    pub networks: Vec<String>,
    /// Frozen (`docker pause`): alive (its state is
    /// [`ContainerState::Running`]) but serving nothing until unpaused.
    pub paused: bool,
}

/// Whether the last run of a container is alive, and how it ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunState {
    /// The container is running.
    pub running: bool,
    /// The kernel OOM-killed its last run.
    pub(crate) oom_killed: bool,
    /// When its last run ended (`None` while running or if never run).
    pub(crate) finished_at: Option<DateTime<Utc>>,
    /// How its last run's process ended (`None` while running, or if the
    /// runtime did not say).
    pub(crate) exit_code: Option<i64>,
}

/// What a command run inside a container printed, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit code (-1 if the runtime did not report one).
    pub exit_code: i64,
    /// Combined stdout and stderr.
    pub output: String,
}

/// Bytes as they arrive, a chunk at a time (a process's standard input,
/// a file's content), so that nothing large is ever held whole. An `Err`
/// ends them early, saying why: whoever reads them must not take what
/// came before it for all there is.
pub type ByteStream<'a> = futures::stream::BoxStream<'a, Result<bytes::Bytes, String>>;

/// What a command run inside a container with input on its standard
/// input wrote, its standard output apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterOutput {
    /// Exit code (-1 if the runtime did not report one).
    pub exit_code: i64,
    /// The last bytes of its standard output (as many as the caller
    /// asked to keep).
    pub stdout: Vec<u8>,
    /// The first bytes of its standard error (enough for a message).
    pub stderr: String,
}
