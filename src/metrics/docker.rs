//! The Docker adapter's metrics: how long its API calls take, and where
//! the engines run. The adapter has no registry of its own, so these are
//! process-wide and every [`super::Metrics`] registers them.

use prometheus::{
    exponential_buckets, HistogramOpts, HistogramTimer, HistogramVec, IntGaugeVec, Opts, Registry,
};
use std::collections::BTreeMap;
use std::sync::LazyLock;

/// The Docker API calls sandboxd times (`sandboxd_docker_api_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DockerCall {
    /// Container list.
    List,
    /// Network list/create.
    Network,
    /// Image inspect.
    InspectImage,
    /// Image pull.
    Pull,
    /// Container create and start.
    Create,
    /// Container inspect.
    Inspect,
    /// Container stop and remove.
    Remove,
    /// Container rename.
    Rename,
    /// Container logs.
    Logs,
    /// Exec in a container.
    Exec,
    /// Volume list, create, inspect and remove.
    Volume,
    /// Container pause and unpause.
    Pause,
}

impl DockerCall {
    /// The `operation` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DockerCall::List => "list",
            DockerCall::Network => "network",
            DockerCall::InspectImage => "inspect_image",
            DockerCall::Pull => "pull",
            DockerCall::Create => "create",
            DockerCall::Inspect => "inspect",
            DockerCall::Remove => "remove",
            DockerCall::Rename => "rename",
            DockerCall::Logs => "logs",
            DockerCall::Exec => "exec",
            DockerCall::Volume => "volume",
            DockerCall::Pause => "pause",
        }
    }
}

/// Duration of Docker operations, by operation.
static DOCKER_API_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    HistogramVec::new(
        HistogramOpts::new(
            "sandboxd_docker_api_seconds",
            "Duration of Docker API operations, by operation",
        )
        .buckets(exponential_buckets(0.001, 2.0, 16).expect("static buckets")),
        &["operation"],
    )
    .expect("metric definition is valid")
});

/// Times one Docker API call until the returned timer drops.
pub(crate) fn time_docker_call(call: DockerCall) -> HistogramTimer {
    DOCKER_API_SECONDS
        .with_label_values(&[call.as_str()])
        .start_timer()
}

/// Sandbox engines per node (the Swarm backend's placement; `local` for
/// the container backend), set at every full list.
static ENGINES_BY_NODE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    IntGaugeVec::new(
        Opts::new(
            "sandboxd_engines_by_node",
            "Sandbox engines by the node they run on (Swarm: the hostname of the node of the service's current task, unassigned while pending; the container backend: local) and state (running: alive in some form; exited)",
        ),
        &["node", "state"],
    )
    .expect("metric definition is valid")
});

/// Replaces the placement gauge with `counts` (node hostname and
/// state to engines): nodes that no longer hold any drop out.
pub(crate) fn set_placement(counts: &BTreeMap<(String, &'static str), i64>) {
    ENGINES_BY_NODE.reset();
    for ((node, state), n) in counts {
        ENGINES_BY_NODE
            .with_label_values(&[node.as_str(), state])
            .set(*n);
    }
}

/// Adds the process-wide Docker metrics to `registry`.
pub(super) fn register(registry: &Registry) {
    registry
        .register(Box::new(DOCKER_API_SECONDS.clone()))
        .expect("docker api metric registers once per registry");
    registry
        .register(Box::new(ENGINES_BY_NODE.clone()))
        .expect("swarm placement metric registers once per registry");
}
