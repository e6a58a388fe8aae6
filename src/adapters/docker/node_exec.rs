//! The node-exec helper's side of a command inside an engine on another
//! Swarm node.
//!
//! A manager's API reaches every node's services, tasks and logs, but not
//! their containers: `docker exec` needs the engine that runs the
//! container. So, under `--backend swarm`, sandboxd runs a command inside
//! an engine whose task is on another node as a one-shot job there
//! (`adapters::swarm::node_exec`): `sandboxd node-exec`, which reaches
//! that node's engine by its socket, runs the command in the container
//! with the exec below, prints the command's output on stdout and exits
//! with its code. The job's logs and exit code travel back through the
//! manager.

use super::{api, DockerRuntime};
use crate::domain::container::ExecOutput;
use crate::domain::id::ContainerId;
use crate::domain::labels;
use crate::ports::runtime::{Commands, RuntimeError};
use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder};
use std::collections::HashMap;

/// The exit code of a helper that could not run the command at all (its
/// reason on stderr), as `docker run` uses it for its own failures.
pub(crate) const HELPER_FAILED: u8 = 125;

/// How old an exited helper's container must be before a later run
/// removes it: far longer than any command may run, so its output was
/// read.
const ENDED_HELPER_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// Label on the helper's job and its task containers (value: the service
/// whose engine it ran a command in).
pub(crate) const NODE_EXEC: &str = "io.sandboxd.node-exec";

impl DockerRuntime {
    /// Runs `cmd` inside container `id` of this engine, which must be one
    /// sandboxd made (label `io.sandboxd.managed-by=sandboxd`): the helper
    /// holds the node's Docker socket, and is lent to no other container.
    pub(crate) async fn exec_in_sandboxd_container(
        &self,
        id: &ContainerId,
        cmd: &[&str],
    ) -> Result<ExecOutput, RuntimeError> {
        let info = self
            .docker
            .inspect_container(id.as_str(), None)
            .await
            .map_err(api("inspect", id.as_str()))?;
        let managed = info
            .config
            .and_then(|c| c.labels)
            .and_then(|l| l.get(labels::MANAGED_BY).cloned());
        if managed.as_deref() != Some(labels::MANAGER) {
            return Err(RuntimeError::Refused(format!(
                "container {} is not sandboxd's (no label {}={}): node-exec runs commands in sandboxd's engines only",
                id.as_str(),
                labels::MANAGED_BY,
                labels::MANAGER
            )));
        }
        self.exec(id, cmd, Vec::new()).await
    }

    /// Removes the exited task containers of earlier helper runs on this
    /// engine: a finished job's task container stays after its service is
    /// removed (measured on Engine 20.10), so each run clears the ones
    /// before it that are older than [`ENDED_HELPER_AGE`] (a younger one's
    /// output may not have been read yet). Returns how many went; one that
    /// will not go is left for the next run.
    pub(crate) async fn remove_ended_helpers(&self) -> usize {
        let filters = HashMap::from([
            ("label", vec![NODE_EXEC.to_owned()]),
            ("status", vec!["exited".to_owned()]),
        ]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let ended = self
            .docker
            .list_containers(Some(options))
            .await
            .unwrap_or_default();
        let before = chrono::Utc::now().timestamp() - ENDED_HELPER_AGE.as_secs() as i64;
        let mut removed = 0;
        let old = ended
            .into_iter()
            .filter(|c| c.created.is_some_and(|t| t < before));
        for id in old.filter_map(|c| c.id) {
            let options = RemoveContainerOptionsBuilder::default().v(true).build();
            if self
                .docker
                .remove_container(&id, Some(options))
                .await
                .is_ok()
            {
                removed += 1;
            }
        }
        removed
    }
}
