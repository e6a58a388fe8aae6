//! The Swarm backend on two nodes: this machine's engine as the manager
//! and a second `dockerd` in a network namespace of its own as a worker
//! (`tests/fixtures/swarm-worker.sh`), set up by the test and torn down
//! after it. Sandboxes whose reservations do not fit one node together are
//! placed on both; a task killed on the worker (whose events the manager
//! does not see) is healed at the next relist with the same credentials;
//! one that fits on neither stays unplaced with Swarm's reason; each
//! status names its node; the worker's sandbox takes a checkpoint and goes
//! back to it through the node-exec helper's job on the worker (its image
//! copied there with Redis's); a released sandbox's task is reaped on the
//! worker; draining the manager moves its sandbox to the worker with the
//! same credentials, reached by an agent over the cross-node overlay, while
//! a persistent sandbox (its data on the manager) waits, its status naming
//! the drained node and the command, then runs on the manager (held
//! there, with its capped volume), keeps its data across a killed task and
//! its volume goes with the row; a grown feature set rotates the worker's
//! sandbox there. A template is built on each node and a sandbox on the
//! worker starts from the worker's; a warm pool of services on the
//! worker serves claims made from the manager, and a claimed task killed
//! on the worker is healed.
//!
//! Both nodes share this VM's memory: the reservations (13 GiB of the
//! 24 GiB each node reports) are Swarm's bookkeeping, nothing is used.

use crate::common;

use common::{
    create_closed_gateway_bridge, docker, docker_ok, eventually, exec_in, request, sandbox_id,
    Agent, TestEnv,
};
use sandboxd::client::{Client, SandboxRequest};
use sandboxd::domain::container::ContainerState;
use sandboxd::domain::{Phase, SandboxId, SandboxStatus};
use sandboxd::ports::runtime::Containers as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const READY: Duration = Duration::from_secs(120);
/// Where the manager advertises itself (the host's end of the veth pair
/// the fixture creates).
const MANAGER_ADDR: &str = "10.210.0.1";
const GIB: i64 = 1024 * 1024 * 1024;

fn fixture(command: &str, state: &std::path::Path) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/swarm-worker.sh");
    let mut run = Command::new("bash");
    run.arg(script).arg(command).arg(state);
    if command == "up" {
        // The worker runs Redis, Postgres and the node-exec helper (and
        // saves a copy of the rest).
        run.env(
            "SBXW_IMAGES",
            format!(
                "sandboxd/redis:8 sandboxd/postgres:17 {}",
                common::controller_image()
            ),
        );
    }
    let out = run.output().expect("run the worker fixture");
    assert!(
        out.status.success(),
        "swarm-worker.sh {command}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The two-node Swarm: the manager (this engine, with a closed gateway
/// bridge) and the fixture's worker; all of it undone when dropped.
struct TwoNodes {
    state: PathBuf,
    worker: String,
}

impl TwoNodes {
    fn start() -> Self {
        let state = std::env::temp_dir().join(format!("sbxw-{}", std::process::id()));
        let state_s = state.clone();
        let this = TwoNodes {
            state,
            worker: String::new(),
        };
        assert_eq!(
            docker_ok(&["info", "--format", "{{.Swarm.LocalNodeState}}"]),
            "inactive",
            "the engine must not be in a Swarm already"
        );
        fixture("net", &state_s);
        create_closed_gateway_bridge();
        docker_ok(&["swarm", "init", "--advertise-addr", MANAGER_ADDR]);
        let mut this = this;
        this.worker = fixture("up", &state_s);
        this
    }
}

impl TwoNodes {
    /// `docker ARGS` against the worker's own engine, which must succeed;
    /// its standard output, trimmed.
    fn on_worker(&self, args: &[&str]) -> String {
        let host = format!("unix://{}", self.state.join("docker.sock").display());
        let out = Command::new("docker")
            .arg("-H")
            .arg(&host)
            .args(args)
            .output()
            .expect("run docker");
        assert!(
            out.status.success(),
            "docker -H {host} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/swarm-worker.sh");
        let _ = Command::new("bash")
            .arg(script)
            .arg("down")
            .arg(&self.state)
            .output();
        docker(&["swarm", "leave", "--force"]);
        docker(&["network", "rm", "docker_gwbridge"]);
    }
}

/// The hostname of the node running the current task of the sandbox's
/// one engine, once Swarm placed it.
fn node_of(id: &SandboxId) -> Option<String> {
    let service = docker_ok(&[
        "service",
        "ls",
        "-q",
        "--filter",
        &format!("label=io.sandboxd.sandbox={id}"),
    ]);
    node_of_service(service.lines().next()?)
}

/// [`pings`], until it answers PONG or 30 s pass: a new task's name
/// reaches an agent on the other node once Swarm's DNS has it (moments
/// after the task runs: CI once saw "Name or service not known" right
/// after a heal).
async fn pings_within(env: &TestEnv, agent: &str, password: &str) -> String {
    let mut last = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            last = pings(env, agent, password).await;
            if last == "PONG" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    last
}

/// The hostname of the node running the current task of the service
/// `service` (an id or name), once Swarm placed it.
fn node_of_service(service: &str) -> Option<String> {
    let nodes = docker_ok(&[
        "service",
        "ps",
        "--filter",
        "desired-state=running",
        "--format",
        "{{.Node}}",
        service,
    ]);
    nodes
        .lines()
        .next()
        .map(str::to_owned)
        .filter(|n| !n.is_empty())
}

/// Pings the sandbox's Redis by name from `agent` with `password`.
async fn pings(env: &TestEnv, agent: &str, password: &str) -> String {
    redis_cli(env, agent, password, "ping").await
}

/// Runs the Redis command `command` against the sandbox's Redis, by name,
/// from `agent` with `password`: its answer.
async fn redis_cli(env: &TestEnv, agent: &str, password: &str, command: &str) -> String {
    let (_, out) = exec_in(
        env,
        agent,
        &format!("redis-cli --no-auth-warning -h redis -p 6379 {command}"),
        vec![format!("REDISCLI_AUTH={password}")],
    )
    .await;
    out.trim().to_owned()
}

#[tokio::test]
async fn sandboxes_are_placed_on_both_nodes_by_their_reservations_and_a_drained_node_moves_its_sandbox_with_the_same_credentials(
) {
    let nodes = TwoNodes::start();
    let manager = docker_ok(&["info", "--format", "{{.Name}}"]);
    let env = TestEnv::new().await;
    let deployment = env.deployment.to_string();
    let _cleanup = scopeguard(deployment.clone());
    let mut config = env.config();
    config.relist_interval = Duration::from_secs(2);
    config.limits.memory_bytes = 13 * GIB;
    // A task on the worker, under CI's load (the tests, clippy and the
    // simulation on two cores), once took over 15 s (Redis's default) to
    // answer after a rotation; the persistent sandbox's wait below is
    // reported when this deadline passes.
    config.readiness =
        sandboxd::config::readiness_overrides(&[("redis".into(), Duration::from_secs(30))])
            .unwrap();
    let (controller, _) = env.start_on_swarm(config).await;
    let client = Client::from_pool(env.pool.clone());

    // Two sandboxes of 13 GiB each: no node holds both.
    let agents: Vec<Agent> = (0..2)
        .map(|i| Agent::start(&format!("{deployment}-agent{i}")))
        .collect();
    let ids: Vec<SandboxId> = (0..2).map(|i| sandbox_id(&format!("two{i}"))).collect();
    let mut statuses: Vec<SandboxStatus> = Vec::new();
    for (id, agent) in ids.iter().zip(&agents) {
        let req = SandboxRequest {
            attach: vec![agent.0.clone()],
            ..request(&["redis"], &[])
        };
        statuses.push(
            client
                .provision(id, &req, READY)
                .await
                .expect("each sandbox is placed and ready"),
        );
    }
    let placed: Vec<String> = ids.iter().map(|id| node_of(id).expect("placed")).collect();
    let mut both = placed.clone();
    both.sort();
    let mut expected = vec![manager.clone(), nodes.worker.clone()];
    expected.sort();
    assert_eq!(both, expected, "one sandbox on each node");
    // Each answers its agent (on the manager) over its overlay, the one on
    // the worker across nodes.
    for ((status, agent), node) in statuses.iter().zip(&agents).zip(&placed) {
        let password = status.services["redis"].password.expose();
        assert_eq!(pings(&env, &agent.0, password).await, "PONG", "on {node}");
        assert_eq!(
            status.services["redis"].node.as_ref(),
            Some(node),
            "the status names the node"
        );
    }

    // A checkpoint runs inside the engine's container: the manager's
    // sandbox takes one by `docker exec`; the worker's through the
    // node-exec helper's job there, and goes back to it on a reset.
    let on_worker = placed
        .iter()
        .position(|n| *n == nodes.worker)
        .expect("a sandbox on the worker");
    client
        .checkpoint(&ids[1 - on_worker], "here", READY)
        .await
        .expect("a checkpoint of the manager's task");
    let (agent, password) = (
        &agents[on_worker].0,
        statuses[on_worker].services["redis"].password.expose(),
    );
    assert_eq!(
        redis_cli(&env, agent, password, "set note before").await,
        "OK"
    );
    let taken = client
        .checkpoint(&ids[on_worker], "there", READY)
        .await
        .expect("a checkpoint of the worker's task, through the helper");
    assert!(taken.size_bytes.unwrap_or(0) > 0, "{taken:?}");
    assert_eq!(
        redis_cli(&env, agent, password, "set note after").await,
        "OK"
    );
    client
        .reset(&ids[on_worker], Some("there"), READY)
        .await
        .expect("a reset of the worker's task, through the helper");
    assert_eq!(
        redis_cli(&env, agent, password, "get note").await,
        "before",
        "the data as the checkpoint took it"
    );
    // The helper's jobs are gone, their containers stay exited on the
    // worker (a later run removes them once old), and nothing of theirs
    // ran on the manager.
    let jobs = docker_ok(&[
        "service",
        "ls",
        "-q",
        "--filter",
        "label=io.sandboxd.node-exec",
    ]);
    assert_eq!(jobs, "", "no node-exec job left");
    let helpers = nodes.on_worker(&[
        "ps",
        "-a",
        "--filter",
        "label=io.sandboxd.node-exec",
        "--format",
        "{{.Status}}",
    ]);
    assert!(
        !helpers.is_empty() && helpers.lines().all(|s| s.starts_with("Exited (0)")),
        "{helpers}"
    );
    assert_eq!(
        docker_ok(&["ps", "-aq", "--filter", "label=io.sandboxd.node-exec"]),
        ""
    );

    // A task killed on the worker (whose events the manager does not
    // see) is healed at the next relist, with the same password.
    let (id, before) = (&ids[on_worker], &statuses[on_worker].services["redis"]);
    let service = docker_ok(&[
        "service",
        "ls",
        "--filter",
        &format!("label=io.sandboxd.sandbox={id}"),
        "--format",
        "{{.Name}}",
    ]);
    let task = nodes.on_worker(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=com.docker.swarm.service.name={service}"),
    ]);
    nodes.on_worker(&["kill", &task]);
    let healed: SandboxStatus = eventually("the worker's killed task healed", READY, || async {
        let s = client.status(id).await.ok()??;
        let r = s.services.get("redis")?;
        (s.phase == Phase::Ready && r.heals == 1 && r.instance != before.instance).then_some(s)
    })
    .await;
    let after = &healed.services["redis"];
    assert_eq!(after.password.expose(), before.password.expose());
    assert_eq!(
        pings_within(&env, &agents[on_worker].0, after.password.expose()).await,
        "PONG",
        "the same password after the heal"
    );
    statuses[on_worker] = healed.clone();

    // A grown feature set rotates the worker's sandbox in place: new
    // credentials (the old refused), the feature loaded, still on the
    // worker (the manager's 13 GiB are taken).
    let agent = &agents[on_worker].0;
    let old = statuses[on_worker].services["redis"]
        .password
        .expose()
        .to_owned();
    let grown = SandboxRequest {
        attach: vec![agent.clone()],
        ..request(&["redis"], &[("redis", "json")])
    };
    let generation = client.apply(&ids[on_worker], &grown).await.unwrap();
    let rotated = client
        .wait_ready(&ids[on_worker], &generation, READY)
        .await
        .expect("the rotation finishes");
    let new = &rotated.services["redis"];
    assert_ne!(new.password.expose(), old, "new credentials");
    assert_eq!(new.node.as_deref(), Some(nodes.worker.as_str()));
    assert_eq!(
        pings_within(&env, agent, new.password.expose()).await,
        "PONG"
    );
    assert_ne!(
        pings(&env, agent, &old).await,
        "PONG",
        "the old password refused"
    );
    assert_eq!(
        redis_cli(&env, agent, new.password.expose(), "JSON.SET doc $ 1").await,
        "OK",
        "the feature loaded"
    );

    // Released, the worker's sandbox is reaped there too: its service goes
    // and with it its task's container on the worker.
    let on_manager = 1 - on_worker;
    let reaped = &ids[on_worker];
    assert!(client.release(reaped).await.unwrap());
    let reaped_label = format!("label=io.sandboxd.sandbox={reaped}");
    eventually(
        "the worker's sandbox reaped on the worker",
        READY,
        || async {
            (node_of(reaped).is_none()
                && nodes
                    .on_worker(&["ps", "-aq", "--filter", &reaped_label])
                    .is_empty())
            .then_some(())
        },
    )
    .await;

    // The manager drained: its sandbox moves to the worker, with the same
    // credentials.
    let before = &statuses[on_manager].services["redis"];
    let drained = placed[on_manager].clone();
    assert_eq!(drained, manager);
    docker_ok(&["node", "update", "--availability", "drain", &drained]);
    struct Undrain(String);
    impl Drop for Undrain {
        fn drop(&mut self) {
            docker(&["node", "update", "--availability", "active", &self.0]);
        }
    }
    let undrain = Undrain(drained.clone());
    let moved: SandboxStatus = eventually("the drained node's sandbox moved", READY, || async {
        let s = client.status(&ids[on_manager]).await.ok()??;
        let r = s.services.get("redis")?;
        (s.phase == Phase::Ready && r.heals >= 1 && r.instance != before.instance).then_some(s)
    })
    .await;
    let now_on = node_of(&ids[on_manager]).expect("placed again");
    assert_eq!(now_on, nodes.worker, "moved off the drained node");
    let after = &moved.services["redis"];
    assert_eq!(
        after.node.as_ref(),
        Some(&now_on),
        "the status names the new node"
    );
    assert_eq!(after.password.expose(), before.password.expose());
    assert_eq!(
        pings_within(&env, &agents[on_manager].0, after.password.expose()).await,
        "PONG",
        "the same password works on {now_on}"
    );

    // Meanwhile a persistent sandbox, whose data volume is made on the
    // manager, is not placed on the worker: its status names the drained
    // node and the command that makes it active again.
    let kept = sandbox_id("twokeep");
    let keeper = Agent::start(&format!("{deployment}-keeper"));
    let persistent = SandboxRequest {
        persistent: true,
        attach: vec![keeper.0.clone()],
        ..request(&["redis"], &[])
    };
    client.apply(&kept, &persistent).await.unwrap();
    let waiting = eventually("the status names the drained manager", READY, || async {
        let s = client.status(&kept).await.ok()??;
        s.message.contains("which is set to drain").then_some(s)
    })
    .await;
    assert!(
        waiting.message.contains(&format!(
            "docker node update --availability active {manager}"
        )),
        "{}",
        waiting.message
    );
    assert_eq!(node_of(&kept), None, "never placed on the worker");

    // The manager active again: the persistent sandbox runs there, says
    // so, and a task killed keeps its data.
    drop(undrain);
    let ready: SandboxStatus = eventually("the persistent sandbox ready", READY, || async {
        let s = client.status(&kept).await.ok()??;
        (s.phase == Phase::Ready).then_some(s)
    })
    .await;
    let r = ready.services["redis"].clone();
    assert_eq!(r.node.as_deref(), Some(manager.as_str()));
    // Its service is held to the manager, where its capped data volume is.
    let kept_label = format!("label=io.sandboxd.sandbox={kept}");
    let service = docker_ok(&["service", "ls", "-q", "--filter", &kept_label]);
    let manager_id = docker_ok(&["info", "--format", "{{.Swarm.NodeID}}"]);
    assert_eq!(
        docker_ok(&[
            "service",
            "inspect",
            "-f",
            "{{json .Spec.TaskTemplate.Placement.Constraints}}",
            service.trim(),
        ]),
        format!("[\"node.id=={manager_id}\"]")
    );
    let volumes = docker_ok(&["volume", "ls", "-q", "--filter", &kept_label]);
    // (Beside the task's tmpfs volumes, named after its service.)
    let data: Vec<&str> = volumes
        .lines()
        .filter(|v| v.starts_with("sandboxd."))
        .collect();
    assert_eq!(data.len(), 1, "one data volume: {volumes}");
    let options = docker_ok(&["volume", "inspect", "-f", "{{json .Options}}", data[0]]);
    assert!(options.contains("\"type\":\"ext4\""), "capped: {options}");
    let password = r.password.expose();
    assert_eq!(
        redis_cli(&env, &keeper.0, password, "set note kept").await,
        "OK"
    );
    let task = docker_ok(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=io.sandboxd.sandbox={kept}"),
    ]);
    docker_ok(&["kill", task.trim()]);
    let healed: SandboxStatus = eventually("the persistent sandbox healed", READY, || async {
        let s = client.status(&kept).await.ok()??;
        let h = s.services.get("redis")?;
        (s.phase == Phase::Ready && h.heals == 1 && h.instance != r.instance).then_some(s)
    })
    .await;
    assert_eq!(
        healed.services["redis"].node.as_deref(),
        Some(manager.as_str())
    );
    assert_eq!(pings_within(&env, &keeper.0, password).await, "PONG");
    assert_eq!(
        redis_cli(&env, &keeper.0, password, "get note").await,
        "kept",
        "the data written before the kill"
    );
    // Both nodes full again (the persistent sandbox on the manager, the
    // moved one on the worker): a third fits on neither, and Swarm leaves
    // it unplaced and says why. (Released, it goes once its provisioning
    // gives up.)
    let third = sandbox_id("two2");
    client
        .apply(&third, &request(&["redis"], &[]))
        .await
        .unwrap();
    eventually("Swarm's reason for not placing it", READY, || async {
        let service = docker_ok(&[
            "service",
            "ls",
            "-q",
            "--filter",
            &format!("label=io.sandboxd.sandbox={third}"),
        ]);
        let service = service.lines().next()?.to_owned();
        let errors = docker_ok(&[
            "service",
            "ps",
            "--no-trunc",
            "--format",
            "{{.Error}}",
            &service,
        ]);
        errors
            .contains("insufficient resources on 2 nodes")
            .then_some(())
    })
    .await;
    assert!(client.release(&third).await.unwrap());

    assert!(client.release(&ids[on_manager]).await.unwrap());
    // Released: its service, then its data volume, go.
    assert!(client.release(&kept).await.unwrap());
    eventually("the persistent sandbox's volume gone", READY, || async {
        let left = docker_ok(&["volume", "ls", "-q", "--filter", &kept_label]);
        (node_of(&kept).is_none() && !left.contains(data[0])).then_some(())
    })
    .await;
    drop(keeper);
    drop(controller);
    drop(agents);

    a_template_on_each_node_and_a_pool_on_the_worker_serve_sandboxes(&nodes, &manager).await;
}

/// Templates and the warm pool on the two nodes, in a second deployment:
/// the plain Postgres template's global job fills a volume on each node,
/// and a sandbox placed on the worker starts from the worker's. A pool of
/// two Redis services fills on the worker; a new sandbox claims one as it
/// runs, its credentials set over the engine's protocol across nodes, and
/// its agent on the manager reaches it over the claimed service's
/// overlay; the claimed task killed on the worker is healed at the next
/// relist with the same password.
async fn a_template_on_each_node_and_a_pool_on_the_worker_serve_sandboxes(
    nodes: &TwoNodes,
    manager: &str,
) {
    let env = TestEnv::new().await;
    let deployment = env.deployment.to_string();
    let _cleanup = scopeguard(deployment.clone());
    let mut config = env.config();
    config.relist_interval = Duration::from_secs(2);
    config.warm_pool = sandboxd::config::warm_pools(&["redis=2".to_owned()]).unwrap();
    config.templates = true;
    let (controller, runtime) = env.start_on_swarm(config).await;
    let client = Client::from_pool(env.pool.clone());
    // The plain Postgres template, built at start on both (active) nodes.
    common::templates_built(&controller, 1.0).await;
    let prefix = format!("{deployment}-template-postgres-plain-");
    let names = ["volume", "ls", "--format", "{{.Name}}"];
    let here = docker_ok(&names);
    let template: Vec<&str> = here.lines().filter(|v| v.starts_with(&prefix)).collect();
    assert_eq!(template.len(), 1, "the manager's template: {here}");
    // (The worker also keeps the job's tmpfs volumes, named after it.)
    let there = nodes.on_worker(&names);
    assert!(
        there.lines().any(|v| v == template[0]),
        "the worker's template {}: {there}",
        template[0]
    );
    // The pool fills while the manager is drained: both pool services on
    // the worker (those placed on the manager before are replaced there),
    // so that every claim below is made across nodes.
    docker_ok(&["node", "update", "--availability", "drain", manager]);
    let pooled = eventually("two ready pool services on the worker", READY, || async {
        let ready = common::sample(
            &controller.metrics.render(),
            "sandboxd_pool_size{engine=\"redis\",state=\"ready\"}",
        ) == Some(2.0);
        let live: Vec<_> = runtime
            .pool_containers(&env.deployment)
            .await
            .ok()?
            .into_iter()
            .filter(|p| p.state == ContainerState::Running)
            .collect();
        let on_worker = live
            .iter()
            .all(|p| node_of_service(p.id.as_str()).as_deref() == Some(nodes.worker.as_str()));
        (ready && live.len() == 2 && on_worker).then_some(live)
    })
    .await;
    // A Postgres sandbox placed on the worker meanwhile starts from the
    // worker's template.
    let pg = sandbox_id("twotpl");
    let status = client
        .provision(&pg, &request(&["postgres"], &[]), READY)
        .await
        .expect("a Postgres sandbox ready on the worker");
    assert_eq!(
        status.services["postgres"].node.as_deref(),
        Some(nodes.worker.as_str())
    );
    assert_eq!(
        common::sample(
            &controller.metrics.render(),
            "sandboxd_container_starts_total{engine=\"postgres\",from=\"template\"}",
        ),
        Some(1.0),
        "started from the worker's template"
    );
    assert!(client.release(&pg).await.unwrap());
    docker_ok(&["node", "update", "--availability", "active", manager]);

    let agents: Vec<Agent> = (0..2)
        .map(|i| Agent::start(&format!("{deployment}-pool-agent{i}")))
        .collect();
    let ids: Vec<SandboxId> = (0..2).map(|i| sandbox_id(&format!("twopool{i}"))).collect();
    let mut statuses = Vec::new();
    for (id, agent) in ids.iter().zip(&agents) {
        let req = SandboxRequest {
            attach: vec![agent.0.clone()],
            ..request(&["redis"], &[])
        };
        let status = client.provision(id, &req, READY).await.expect("ready");
        let password = status.services["redis"].password.expose().to_owned();
        assert_eq!(pings_within(&env, &agent.0, &password).await, "PONG");
        statuses.push(status);
    }
    // Each is served by a pool service; the first by one that was ready
    // on the worker (the second may take the pool's refill, wherever Swarm
    // placed it once the manager was active again).
    let listed = runtime.pool_containers(&env.deployment).await.unwrap();
    let served: Vec<String> = ids
        .iter()
        .map(|id| {
            let name = format!("sandboxd.{deployment}.{id}.redis");
            listed
                .iter()
                .find(|c| c.name == name)
                .unwrap_or_else(|| panic!("a pool service named {name}: {listed:?}"))
                .id
                .as_str()
                .to_owned()
        })
        .collect();
    assert!(
        pooled.iter().any(|p| p.id.as_str() == served[0]),
        "the first claim took a pool service ready on the worker"
    );

    // That claimed task, killed on the worker: healed at the next relist
    // with the same password.
    let i = 0;
    let before = statuses[i].services["redis"].clone();
    let task = nodes.on_worker(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=com.docker.swarm.service.id={}", served[i]),
    ]);
    nodes.on_worker(&["kill", &task]);
    let healed: SandboxStatus = eventually("the worker's claimed task healed", READY, || async {
        let s = client.status(&ids[i]).await.ok()??;
        let r = s.services.get("redis")?;
        (s.phase == Phase::Ready && r.heals == 1).then_some(s)
    })
    .await;
    let after = &healed.services["redis"];
    assert_eq!(after.password.expose(), before.password.expose());
    assert_eq!(
        pings_within(&env, &agents[i].0, after.password.expose()).await,
        "PONG",
        "the same password after the heal"
    );
    for id in &ids {
        assert!(client.release(id).await.unwrap());
    }
    drop(controller);
    drop(agents);
}

/// Removes the deployment's services and what they leave once the test
/// ends (before the Swarm goes).
fn scopeguard(deployment: String) -> impl Drop {
    struct Guard(String);
    impl Drop for Guard {
        fn drop(&mut self) {
            common::remove_swarm_objects(
                &format!("io.sandboxd.deployment={}", self.0),
                &format!("io.sandboxd.swarm-deployment={}", self.0),
            );
        }
    }
    Guard(deployment)
}
