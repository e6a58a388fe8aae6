//! Templates under Swarm: one per node, made by a global job.
//!
//! A template is a volume, and a volume lives on one node. So the job that
//! fills it runs as a Swarm *global job* (API 1.41: one task on every
//! active node, run to completion), each task filling its own node's
//! volume of the template's name, and sandboxd remembers which nodes'
//! tasks completed and which failed. A sandbox from the template is kept
//! off the nodes where it failed (a placement constraint), so a node that
//! cannot build it never takes such a sandbox.
//!
//! A node that had no task (it joined the Swarm, or was made active, after
//! the job) has no template: a sandbox placed there mounts a new, empty
//! volume of that name, the engine's entrypoint refuses to start from it,
//! and sandboxd starts that sandbox cold and runs the job again (see
//! `controller::provision::forget_template`), which covers the new node;
//! on the others, the job finds its template built and exits at once.

use super::{
    api, caps, docker_name, is_status, log_driver, named_mount, part_labels, takes_tasks,
    tmpfs_mounts, uid_gid, SwarmRuntime, PART_OF,
};
use crate::domain::id::ContainerId;
use crate::domain::labels;
use crate::ports::runtime::{Containers, NetworkSpec, Networks, RuntimeError, TemplateJob};
use bollard::models::{
    NetworkAttachmentConfig, ServiceSpec, ServiceSpecMode, Task, TaskSpec, TaskSpecContainerSpec,
    TaskSpecResources, TaskSpecRestartPolicy, TaskSpecRestartPolicyConditionEnum, TaskState,
};
use bollard::query_parameters::RemoveContainerOptionsBuilder;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

/// How long a job's tasks may stay fewer than the active nodes, all ended,
/// before the job counts as over: a node that became unavailable since it
/// was counted never gets its task.
const FEWER_TASKS_GRACE: Duration = Duration::from_secs(10);

/// How often a running job's tasks are looked at.
const POLL: Duration = Duration::from_millis(250);

/// The nodes each template (by volume name) was built on and failed on,
/// as the last job of each found (memory only, as the controller's own
/// template slots are: after a restart, the first sandbox of each kind
/// runs the job again).
#[derive(Debug, Default)]
pub(super) struct Built(Mutex<HashMap<String, Outcome>>);

impl Built {
    /// Placement constraints that keep a sandbox from the template
    /// `volume` off the nodes where its job failed.
    pub(super) fn avoid(&self, volume: &str) -> Vec<String> {
        let built = self.0.lock().unwrap_or_else(|e| e.into_inner());
        built
            .get(volume)
            .map(|o| {
                o.failed
                    .keys()
                    .map(|node| format!("node.id!={node}"))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn record(&self, volume: &str, outcome: Outcome) {
        let mut built = self.0.lock().unwrap_or_else(|e| e.into_inner());
        built.insert(volume.to_owned(), outcome);
    }
}

/// What a finished job's tasks say, by node id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Outcome {
    /// Nodes whose task completed: their volume holds the template.
    pub(super) built: BTreeSet<String>,
    /// Nodes whose task did not, with Swarm's word for why.
    pub(super) failed: BTreeMap<String, String>,
    /// The exit code of a failed task, if one exited.
    pub(super) exit_code: Option<i64>,
}

impl Outcome {
    /// Reads the ended tasks of a job.
    pub(super) fn of(tasks: &[Task]) -> Self {
        let mut outcome = Self::default();
        for t in tasks {
            let node = t.node_id.clone().unwrap_or_else(|| "unassigned".into());
            let status = t.status.as_ref();
            if status.and_then(|s| s.state) == Some(TaskState::COMPLETE) {
                outcome.built.insert(node);
                continue;
            }
            let why = status
                .and_then(|s| s.err.clone().or_else(|| s.message.clone()))
                .unwrap_or_else(|| "ended without completing".into());
            if let Some(code) = status
                .and_then(|s| s.container_status.as_ref())
                .and_then(|c| c.exit_code)
                .filter(|c| *c != 0)
            {
                outcome.exit_code.get_or_insert(code);
            }
            outcome.failed.insert(node, why);
        }
        // A node with a completed task holds the template, whatever an
        // earlier task there said.
        outcome
            .failed
            .retain(|node, _| !outcome.built.contains(node));
        outcome
    }
}

/// Whether a job is over: it has tasks and all have ended, one per active
/// node, or fewer once `waited` passes [`FEWER_TASKS_GRACE`] (a node
/// counted active may have left since).
pub(super) fn finished(tasks: &[Task], active_nodes: usize, waited: Duration) -> bool {
    let ended = |t: &Task| {
        matches!(
            t.status.as_ref().and_then(|s| s.state),
            Some(
                TaskState::COMPLETE
                    | TaskState::FAILED
                    | TaskState::REJECTED
                    | TaskState::SHUTDOWN
                    | TaskState::ORPHANED
                    | TaskState::REMOVE
            )
        )
    };
    !tasks.is_empty()
        && tasks.iter().all(ended)
        && (tasks.len() >= active_nodes || waited >= FEWER_TASKS_GRACE)
}

/// The global job that fills `job`'s volumes on every active node: the
/// hardening of a sandbox's service, run once to completion, on the
/// internal overlay `network` (a Swarm task cannot have no network), the
/// template and binaries volumes read-write and made with their labels
/// where missing (Docker copying the image's directories, and their
/// ownership, into them).
pub(super) fn job_spec(
    job: &TemplateJob,
    service: &str,
    instance: &str,
    network: &str,
) -> Result<ServiceSpec, RuntimeError> {
    let ids = uid_gid(&job.user, &job.name)?;
    let parts = part_labels(&job.labels, service);
    let mut mounts = vec![named_mount(&job.volume, false, Some(&job.volume.labels))];
    mounts.extend(
        job.binaries
            .iter()
            .map(|b| named_mount(b, false, Some(&b.labels))),
    );
    mounts.extend(tmpfs_mounts(&job.tmpfs, instance, ids, &parts));
    let limits = &job.limits;
    Ok(ServiceSpec {
        name: Some(service.to_owned()),
        labels: Some(job.labels.clone()),
        mode: Some(ServiceSpecMode {
            global_job: Some(HashMap::new()),
            ..Default::default()
        }),
        task_template: Some(TaskSpec {
            container_spec: Some(TaskSpecContainerSpec {
                image: Some(job.image.clone()),
                labels: Some(job.labels.clone()),
                args: (!job.cmd.is_empty()).then(|| job.cmd.clone()),
                env: Some(job.env.clone()),
                user: Some(job.user.clone()),
                read_only: Some(true),
                mounts: Some(mounts),
                capability_drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            resources: Some(TaskSpecResources {
                limits: Some(caps(limits)),
                ..Default::default()
            }),
            restart_policy: Some(TaskSpecRestartPolicy {
                condition: Some(TaskSpecRestartPolicyConditionEnum::NONE),
                ..Default::default()
            }),
            networks: Some(vec![NetworkAttachmentConfig {
                target: Some(network.to_owned()),
                ..Default::default()
            }]),
            log_driver: Some(log_driver(limits)),
            ..Default::default()
        }),
        ..Default::default()
    })
}

impl SwarmRuntime {
    /// Runs `job` on every active node (see the module's comment) and
    /// records where the template was built; fails only when it was built
    /// nowhere.
    pub(super) async fn run_global_template_job(
        &self,
        job: &TemplateJob,
    ) -> Result<(), RuntimeError> {
        self.node.check_image(&job.image, None).await?;
        // This node's volumes are judged as on one host: made with their
        // labels, replaced when they hold this deployment's older content,
        // refused when they are not sandboxd's to mount.
        self.node.ensure_template_volume(&job.volume).await?;
        if let Some(binaries) = &job.binaries {
            self.node.ensure_template_volume(binaries).await?;
        }
        let service = docker_name(&job.name);
        // A job a crash or a deadline left behind.
        if let Some(id) = self.service_named(&service).await?.and_then(|s| s.id) {
            self.remove_job(&ContainerId::new(id), &service).await;
        }
        let network = self.job_network(job, &service).await?;
        let body = job_spec(
            job,
            &service,
            &docker_name(&format!("{}.run", job.name)),
            &network,
        )?;
        let created = self.docker.create_service(body, None).await;
        let id = match created {
            Ok(c) => ContainerId::new(c.id.unwrap_or_default()),
            Err(e) => {
                self.remove_job_network(&network).await;
                return Err(api("create template job", &service)(e));
            }
        };
        let tasks = self.wait_job(&id).await;
        let logs = match &tasks {
            Ok(t) if Outcome::of(t).built.is_empty() => self
                .logs_tail(&id, 15)
                .await
                .unwrap_or_else(|e| format!("(logs unavailable: {e})")),
            _ => String::new(),
        };
        self.remove_job(&id, &service).await;
        self.remove_job_network(&network).await;
        let outcome = Outcome::of(&tasks?);
        let volume = job.volume.name.clone();
        let built = outcome.built.len();
        let failed = outcome.failed.clone();
        let code = outcome.exit_code;
        self.templates.record(&volume, outcome);
        if built == 0 {
            let why: Vec<String> = failed
                .iter()
                .map(|(n, w)| format!("node {n}: {w}"))
                .collect();
            return Err(RuntimeError::TemplateJob {
                name: job.name.clone(),
                code: code.unwrap_or(-1),
                logs: format!("{}\n{logs}", why.join("\n")),
            });
        }
        if !failed.is_empty() {
            tracing::warn!(template = %volume, built, failed = ?failed, "template built on some nodes only; its sandboxes are not placed on the others");
        }
        tracing::debug!(template = %volume, built, "template built on the Swarm's active nodes");
        Ok(())
    }

    /// Waits until the job `id` is over (the caller's deadline bounds it).
    async fn wait_job(&self, id: &ContainerId) -> Result<Vec<Task>, RuntimeError> {
        let active = self.active_nodes().await?;
        let started = tokio::time::Instant::now();
        loop {
            let tasks = self.tasks_of(&[id.as_str()]).await?;
            if finished(&tasks, active, started.elapsed()) {
                return Ok(tasks);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// How many nodes are ready and active: each gets a task of a job.
    async fn active_nodes(&self) -> Result<usize, RuntimeError> {
        let nodes = self
            .docker
            .list_nodes(None)
            .await
            .map_err(api("list nodes", "the swarm"))?;
        Ok(nodes.iter().filter(|n| takes_tasks(n)).count())
    }

    /// An internal overlay of the job's own: no route out, nothing else
    /// on it. Labelled as a part of the deployment, not with the
    /// deployment label, so that the controller's network collection does
    /// not take it for a sandbox's.
    async fn job_network(&self, job: &TemplateJob, service: &str) -> Result<String, RuntimeError> {
        let mut labels =
            HashMap::from([(labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned())]);
        if let Some(d) = job.labels.get(labels::DEPLOYMENT) {
            labels.insert(PART_OF.to_owned(), d.clone());
        }
        let spec = NetworkSpec {
            name: service.to_owned(),
            labels,
            subnets: None,
            egress: false,
            bridge: None,
        };
        self.node.ensure_network(&spec).await?;
        Ok(spec.name)
    }

    /// Removes the job's service, its task containers on this node and
    /// its scratch volumes. A global job's completed task keeps its
    /// container after its service is removed (measured on Engine 20.10:
    /// still there minutes later), and that container holds the template
    /// volume; on other nodes such containers stay, exited (docs/swarm.md).
    async fn remove_job(&self, id: &ContainerId, service: &str) {
        match self.docker.delete_service(id.as_str()).await {
            Ok(()) => {}
            Err(e) if is_status(&e, &[404]) => {}
            Err(e) => {
                tracing::warn!(service, error = %e, "could not remove a template job's service; the next job of that template will");
                return;
            }
        }
        let containers = self.task_containers(id, false).await.unwrap_or_default();
        for c in containers {
            let force = RemoveContainerOptionsBuilder::default()
                .force(true)
                .v(false)
                .build();
            if let Err(e) = self.docker.remove_container(&c, Some(force)).await {
                tracing::debug!(service, container = c, error = %e, "could not remove a template job's task container");
            }
        }
        self.remove_parts(service).await;
    }

    async fn remove_job_network(&self, network: &str) {
        if let Err(e) = self.docker.remove_network(network).await {
            tracing::debug!(network, error = %e, "could not remove a template job's overlay; the next job of that template reuses it");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::{ContainerStatus, TaskStatus};

    fn task(node: &str, state: TaskState, exit: Option<i64>, err: Option<&str>) -> Task {
        Task {
            node_id: Some(node.into()),
            status: Some(TaskStatus {
                state: Some(state),
                err: err.map(str::to_owned),
                container_status: exit.map(|c| ContainerStatus {
                    exit_code: Some(c),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_job_is_over_when_every_active_node_has_an_ended_task() {
        use TaskState::*;
        let s = Duration::from_secs;
        let cases: &[(&[TaskState], usize, Duration, bool)] = &[
            (&[], 1, s(60), false),
            (&[RUNNING], 1, s(0), false),
            (&[COMPLETE], 1, s(0), true),
            (&[FAILED], 1, s(0), true),
            (&[REJECTED, COMPLETE], 2, s(0), true),
            (&[COMPLETE, RUNNING], 2, s(0), false),
            // a node counted active that never got its task
            (&[COMPLETE], 2, s(0), false),
            (&[COMPLETE], 2, FEWER_TASKS_GRACE, true),
            (&[COMPLETE, PENDING], 2, s(60), false),
        ];
        for (states, active, waited, want) in cases {
            let tasks: Vec<Task> = states
                .iter()
                .enumerate()
                .map(|(i, st)| task(&format!("n{i}"), *st, None, None))
                .collect();
            assert_eq!(
                finished(&tasks, *active, *waited),
                *want,
                "{states:?} on {active} nodes after {waited:?}"
            );
        }
    }

    #[test]
    fn the_outcome_names_the_nodes_that_hold_the_template_and_why_the_others_do_not() {
        let tasks = [
            task("a", TaskState::COMPLETE, Some(0), None),
            task(
                "b",
                TaskState::FAILED,
                Some(64),
                Some("task: non-zero exit (64)"),
            ),
            task(
                "c",
                TaskState::REJECTED,
                None,
                Some("No such image: sandboxd/postgres:17"),
            ),
        ];
        let o = Outcome::of(&tasks);
        assert_eq!(o.built, BTreeSet::from(["a".to_owned()]));
        assert_eq!(o.failed.keys().collect::<Vec<_>>(), ["b", "c"], "{o:?}");
        assert_eq!(o.failed["c"], "No such image: sandboxd/postgres:17");
        assert_eq!(o.exit_code, Some(64));

        let built = Built::default();
        built.record("tpl", o);
        assert_eq!(built.avoid("tpl"), ["node.id!=b", "node.id!=c"]);
        assert!(
            built.avoid("other").is_empty(),
            "an unknown template avoids nothing"
        );
    }

    #[test]
    fn a_node_whose_later_task_completed_holds_the_template() {
        let o = Outcome::of(&[
            task("a", TaskState::FAILED, Some(1), Some("x")),
            task("a", TaskState::COMPLETE, Some(0), None),
        ]);
        assert!(o.failed.is_empty(), "{o:?}");
        assert_eq!(o.built.len(), 1);
    }
}
