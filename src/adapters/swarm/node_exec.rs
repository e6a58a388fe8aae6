//! Commands inside an engine whose task runs on another node.
//!
//! A checkpoint, a reset and Mongo's probe run commands inside the
//! engine's container. The manager's API reaches every node's services,
//! tasks and logs, but `docker exec` only the containers of the engine it
//! is sent to, and sandboxd talks to one node. So a command for a task on
//! another node runs there as a one-shot *replicated job*: one task, held
//! to that node (`node.id==`), running `sandboxd node-exec` from the
//! helper image (`--swarm-helper-image`, sandboxd's own image: it must be
//! on every node, like the engine images). The task reaches its node's
//! engine by the Docker socket mounted into it, runs the command with the
//! same exec as on one host (refusing a container sandboxd did not make),
//! prints its output and exits with its code; sandboxd reads both from the
//! task (its logs and status travel through the manager) and removes the
//! job.
//!
//! The helper holds its node's Docker socket, which is root on that node:
//! it runs only sandboxd's binary with the arguments below (a container id
//! and the engine's command, which carries no credential: the job refuses
//! extra environment, which its spec would show), on an internal overlay
//! of its own (no route anywhere; a Swarm task cannot have no network),
//! with a read-only root, no capability and small caps. Measured here: a
//! job takes about a second from create to its logs.

use super::{api, docker_name, is_status, past_orphan_age, time, SwarmRuntime, PART_OF};
use crate::adapters::docker::{HELPER_FAILED, NODE_EXEC};
use crate::domain::container::ExecOutput;
use crate::domain::id::Deployment;
use crate::domain::labels;
use crate::ports::runtime::{NetworkSpec, Networks, RuntimeError};
use bollard::models::{
    Limit, Mount, MountType, NetworkAttachmentConfig, ServiceSpec, ServiceSpecMode,
    ServiceSpecModeReplicatedJob, Task, TaskSpec, TaskSpecContainerSpec, TaskSpecLogDriver,
    TaskSpecPlacement, TaskSpecResources, TaskSpecRestartPolicy,
    TaskSpecRestartPolicyConditionEnum, TaskState,
};
use bollard::query_parameters::{ListServicesOptionsBuilder, LogsOptionsBuilder};
use bollard::Docker;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often a running job's task is looked at.
const POLL: Duration = Duration::from_millis(100);

/// Where a node's engine listens (bind-mounted into the helper).
const DOCKER_SOCKET: &str = "/var/run/docker.sock";

/// One command for one engine's container on another node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Call<'a> {
    /// The Swarm id of the node the container is on.
    pub(super) node: &'a str,
    /// The container (the engine's task's).
    pub(super) container: &'a str,
    /// The command and its arguments.
    pub(super) cmd: &'a [&'a str],
    /// The engine's service, named in the job's labels.
    pub(super) service: &'a str,
    /// The deployment whose helper jobs these are.
    pub(super) deployment: &'a str,
}

/// The job that runs `call` with `image` on the overlay `network`, as the
/// Docker service `name`.
pub(super) fn job_spec(call: &Call<'_>, image: &str, name: &str, network: &str) -> ServiceSpec {
    let labels = HashMap::from([
        (labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned()),
        (PART_OF.to_owned(), call.deployment.to_owned()),
        (NODE_EXEC.to_owned(), call.service.to_owned()),
    ]);
    let mut args = vec![
        "node-exec".to_owned(),
        "--container".to_owned(),
        call.container.to_owned(),
        "--".to_owned(),
    ];
    args.extend(call.cmd.iter().map(|s| (*s).to_owned()));
    ServiceSpec {
        name: Some(name.to_owned()),
        labels: Some(labels.clone()),
        mode: Some(ServiceSpecMode {
            replicated_job: Some(ServiceSpecModeReplicatedJob {
                max_concurrent: Some(1),
                total_completions: Some(1),
            }),
            ..Default::default()
        }),
        task_template: Some(TaskSpec {
            container_spec: Some(TaskSpecContainerSpec {
                image: Some(image.to_owned()),
                labels: Some(labels),
                args: Some(args),
                // The socket is root's; uid 0 owns it, so no capability
                // is needed to open it.
                user: Some("0:0".into()),
                read_only: Some(true),
                capability_drop: Some(vec!["ALL".into()]),
                mounts: Some(vec![Mount {
                    target: Some(DOCKER_SOCKET.into()),
                    source: Some(DOCKER_SOCKET.into()),
                    typ: Some(MountType::BIND),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            resources: Some(TaskSpecResources {
                limits: Some(Limit {
                    nano_cpus: Some(1_000_000_000),
                    memory_bytes: Some(128 * 1024 * 1024),
                    pids: Some(64),
                }),
                ..Default::default()
            }),
            restart_policy: Some(TaskSpecRestartPolicy {
                condition: Some(TaskSpecRestartPolicyConditionEnum::NONE),
                ..Default::default()
            }),
            placement: Some(TaskSpecPlacement {
                constraints: Some(vec![format!("node.id=={}", call.node)]),
                ..Default::default()
            }),
            networks: Some(vec![NetworkAttachmentConfig {
                target: Some(network.to_owned()),
                ..Default::default()
            }]),
            log_driver: Some(TaskSpecLogDriver {
                name: Some("json-file".into()),
                options: Some(HashMap::from([
                    ("max-size".to_owned(), "4m".to_owned()),
                    ("max-file".to_owned(), "1".to_owned()),
                ])),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// How a helper's task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ended {
    /// The helper ran and exited with this code: the command's, or
    /// [`HELPER_FAILED`] when the helper itself could not run it.
    Exited(i64),
    /// The task never ran the helper (its image is missing on the node,
    /// the node went), with Swarm's word for why.
    NotRun(String),
}

/// How the task ended, or `None` while it has not.
pub(super) fn ended(task: &Task) -> Option<Ended> {
    let status = task.status.as_ref()?;
    let code = status.container_status.as_ref().and_then(|c| c.exit_code);
    let why = || {
        status
            .err
            .clone()
            .or_else(|| status.message.clone())
            .unwrap_or_else(|| "ended without running".into())
    };
    match status.state? {
        TaskState::COMPLETE => Some(Ended::Exited(0)),
        TaskState::FAILED => Some(match code {
            Some(c) if c != 0 => Ended::Exited(c),
            _ => Ended::NotRun(why()),
        }),
        TaskState::REJECTED | TaskState::SHUTDOWN | TaskState::ORPHANED | TaskState::REMOVE => {
            Some(Ended::NotRun(why()))
        }
        _ => None,
    }
}

/// Makes the Docker service names of helper jobs unique in the Swarm.
static JOBS: AtomicU64 = AtomicU64::new(0);

/// Removes a job's service when dropped, unless disarmed: a job cut off by
/// the caller's deadline is not left running.
struct JobGuard {
    docker: Docker,
    id: Option<String>,
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        let (Some(id), Ok(rt)) = (self.id.take(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        let docker = self.docker.clone();
        rt.spawn(async move {
            if let Err(e) = docker.delete_service(&id).await {
                if !is_status(&e, &[404]) {
                    tracing::warn!(service = id, error = %e, "could not remove a node-exec job; the orphan collection will");
                }
            }
        });
    }
}

impl SwarmRuntime {
    /// Runs `call` on its node through the helper (see the module's
    /// comment); `node` is that node's hostname, for messages.
    pub(super) async fn exec_on_node(
        &self,
        call: &Call<'_>,
        node: &str,
    ) -> Result<ExecOutput, RuntimeError> {
        let network = self.exec_network(call.deployment).await?;
        let name = docker_name(&format!(
            "{}.exec.{}.{}",
            call.deployment,
            std::process::id(),
            JOBS.fetch_add(1, Ordering::Relaxed)
        ));
        let spec = job_spec(call, &self.helper_image, &name, &network);
        let created = self
            .docker
            .create_service(spec, None)
            .await
            .map_err(api("create node-exec job", &name))?;
        let id = created.id.unwrap_or_default();
        let mut guard = JobGuard {
            docker: self.docker.clone(),
            id: Some(id.clone()),
        };
        let (task, end) = loop {
            let tasks = self.tasks_of(&[id.as_str()]).await?;
            if let Some((t, e)) = tasks.iter().find_map(|t| Some((t, ended(t)?))) {
                break (t.clone(), e);
            }
            tokio::time::sleep(POLL).await;
        };
        let task_id = task.id.clone().unwrap_or_default();
        let result = match end {
            Ended::NotRun(why) => Err(RuntimeError::Refused(format!(
                "the node-exec helper did not run on the Swarm node {node} ({why}): its image {image} must be on every node (no registry: `docker save {image} | docker -H <node> load`), or name another with --swarm-helper-image",
                image = self.helper_image
            ))),
            Ended::Exited(code) if code == i64::from(HELPER_FAILED) => {
                let why = self.task_output(&task_id, false).await;
                if why.trim().is_empty() {
                    // The command's own 125, with nothing from the helper.
                    Ok(ExecOutput {
                        exit_code: code,
                        output: self.task_output(&task_id, true).await,
                    })
                } else {
                    Err(RuntimeError::Refused(format!(
                        "the node-exec helper on the Swarm node {node} could not run the command: {}",
                        why.trim()
                    )))
                }
            }
            Ended::Exited(code) => Ok(ExecOutput {
                exit_code: code,
                output: self.task_output(&task_id, true).await,
            }),
        };
        guard.id = None;
        match self.docker.delete_service(&id).await {
            Ok(()) => {}
            Err(e) if is_status(&e, &[404]) => {}
            Err(e) => {
                tracing::warn!(service = name, error = %e, "could not remove a node-exec job; the orphan collection will")
            }
        }
        result
    }

    /// Removes `deployment`'s helper jobs older than `ORPHAN_AGE`: ones
    /// a crashed controller left (a live call removes its own).
    pub(super) async fn collect_exec_jobs(&self, deployment: &Deployment) {
        let filters = HashMap::from([(
            "label",
            vec![NODE_EXEC.to_owned(), format!("{PART_OF}={deployment}")],
        )]);
        let options = ListServicesOptionsBuilder::default()
            .filters(&filters)
            .build();
        let jobs = self
            .docker
            .list_services(Some(options))
            .await
            .unwrap_or_default();
        for job in jobs {
            if let (Some(id), true) = (job.id, past_orphan_age(time(job.created_at))) {
                match self.docker.delete_service(&id).await {
                    Ok(()) => tracing::info!(service = id, "orphan node-exec job removed"),
                    Err(e) => {
                        tracing::debug!(service = id, error = %e, "node-exec job not removed yet")
                    }
                }
            }
        }
    }

    /// The task's stdout (`stdout`) or stderr, as its node kept it.
    async fn task_output(&self, task: &str, stdout: bool) -> String {
        let options = LogsOptionsBuilder::default()
            .stdout(stdout)
            .stderr(!stdout)
            .build();
        let mut logs = self.docker.task_logs(task, Some(options));
        let mut out = String::new();
        while let Some(Ok(chunk)) = logs.next().await {
            out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
        }
        out
    }

    /// The internal overlay the deployment's helper jobs run on, made on
    /// first use and kept (it holds nothing between jobs). Labelled as a
    /// part of the deployment, not with the deployment label, so that the
    /// controller's network collection does not take it for a sandbox's.
    async fn exec_network(&self, deployment: &str) -> Result<String, RuntimeError> {
        let spec = NetworkSpec {
            name: docker_name(&format!("{deployment}.exec")),
            labels: HashMap::from([
                (labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned()),
                (PART_OF.to_owned(), deployment.to_owned()),
                (NODE_EXEC.to_owned(), "network".to_owned()),
            ]),
            subnets: None,
            egress: false,
            bridge: None,
        };
        self.node.ensure_network(&spec).await?;
        Ok(spec.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::{ContainerStatus, TaskStatus};

    fn call() -> Call<'static> {
        Call {
            node: "n1",
            container: "c0ffee",
            cmd: &["sh", "-c", "echo hi"],
            service: "svc",
            deployment: "dev",
        }
    }

    #[test]
    fn the_job_runs_once_on_the_tasks_node_with_the_socket_and_nothing_else() {
        let spec = job_spec(&call(), "img:1", "job", "net");
        let mode = spec.mode.unwrap().replicated_job.unwrap();
        assert_eq!(
            (mode.max_concurrent, mode.total_completions),
            (Some(1), Some(1))
        );
        let task = spec.task_template.unwrap();
        assert_eq!(
            task.placement.unwrap().constraints.unwrap(),
            vec!["node.id==n1"]
        );
        assert_eq!(
            task.restart_policy.unwrap().condition,
            Some(TaskSpecRestartPolicyConditionEnum::NONE)
        );
        let c = task.container_spec.unwrap();
        assert_eq!(
            c.args.unwrap(),
            vec![
                "node-exec",
                "--container",
                "c0ffee",
                "--",
                "sh",
                "-c",
                "echo hi"
            ]
        );
        assert_eq!(c.env, None, "no environment: the spec would show it");
        assert_eq!(c.read_only, Some(true));
        assert_eq!(c.capability_drop.unwrap(), vec!["ALL"]);
        let mounts = c.mounts.unwrap();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].source.as_deref(), Some(DOCKER_SOCKET));
        let labels = c.labels.unwrap();
        assert_eq!(labels.get(NODE_EXEC).map(String::as_str), Some("svc"));
        assert_eq!(labels.get(PART_OF).map(String::as_str), Some("dev"));
        assert!(
            !labels.contains_key(labels::DEPLOYMENT),
            "not listed as a sandbox's"
        );
        assert_eq!(task.networks.unwrap()[0].target.as_deref(), Some("net"));
    }

    fn task(state: TaskState, code: Option<i64>, err: Option<&str>) -> Task {
        Task {
            status: Some(TaskStatus {
                state: Some(state),
                err: err.map(str::to_owned),
                container_status: Some(ContainerStatus {
                    exit_code: code,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_task_ends_with_the_helpers_code_or_swarms_reason() {
        let no_image = "No such image: img:1";
        let cases = [
            (TaskState::RUNNING, None, None, None),
            (TaskState::PENDING, None, None, None),
            (TaskState::COMPLETE, Some(0), None, Some(Ended::Exited(0))),
            (
                TaskState::FAILED,
                Some(3),
                Some("task: non-zero exit (3)"),
                Some(Ended::Exited(3)),
            ),
            (
                TaskState::FAILED,
                Some(125),
                Some("task: non-zero exit (125)"),
                Some(Ended::Exited(125)),
            ),
            (
                TaskState::REJECTED,
                None,
                Some(no_image),
                Some(Ended::NotRun(no_image.into())),
            ),
            (
                TaskState::FAILED,
                None,
                Some("starting container failed"),
                Some(Ended::NotRun("starting container failed".into())),
            ),
            (
                TaskState::ORPHANED,
                None,
                None,
                Some(Ended::NotRun("ended without running".into())),
            ),
        ];
        for (state, code, err, want) in cases {
            assert_eq!(ended(&task(state, code, err)), want, "{state:?} {code:?}");
        }
    }
}
