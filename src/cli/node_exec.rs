//! `sandboxd node-exec --container ID -- CMD…`: the helper the Swarm
//! backend runs as a one-shot job on another node
//! (`adapters::swarm::node_exec`). It runs CMD inside container ID (one
//! sandboxd made) on this node's engine, prints the command's output on
//! stdout and exits with its code; when it cannot run the command it says
//! why on stderr and exits with [`HELPER_FAILED`].

use super::CliError;
use crate::adapters::docker::{DockerRuntime, HELPER_FAILED};
use crate::domain::id::ContainerId;
use std::io::Write as _;

/// Runs the command; returns only when it could not (a command that ran
/// ends the process with its own exit code).
pub(super) async fn run(container: &str, command: &[String]) -> Result<(), CliError> {
    let docker = DockerRuntime::connect().await.map_err(CliError::NodeExec)?;
    docker.remove_ended_helpers().await;
    let argv: Vec<&str> = command.iter().map(String::as_str).collect();
    let out = docker
        .exec_in_sandboxd_container(&ContainerId::new(container.to_owned()), &argv)
        .await
        .map_err(CliError::NodeExec)?;
    let mut stdout = std::io::stdout().lock();
    // The output is all the caller gets back: a write that fails is the
    // helper's failure, not the command's.
    if let Err(e) = stdout
        .write_all(out.output.as_bytes())
        .and_then(|()| stdout.flush())
    {
        eprintln!("sandboxd: node-exec: writing the output: {e}");
        std::process::exit(i32::from(HELPER_FAILED));
    }
    // 0..=255 as a process can exit; an unknown code (-1) is a failure.
    let code = match out.exit_code {
        0 => 0,
        c => i32::try_from(c)
            .ok()
            .filter(|c| (1..=255).contains(c))
            .unwrap_or(1),
    };
    std::process::exit(code)
}
