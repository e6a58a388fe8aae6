//! The Swarm backend (`--backend swarm`) on a real single-node Swarm that
//! the tests create on the engine they use and leave again: rows become
//! hardened one-replica services, reachable with their credentials through
//! the sandbox's attachable overlay; a killed task is healed with the same
//! credentials; a grown feature set rotates them; a released row's
//! services, secrets, volumes and network go (persistent rows are tested
//! on two nodes, `swarm_two_nodes.rs`); no credential appears in
//! `docker service inspect` or in `docker inspect` of the tasks'
//! containers.
//!
//! The controller runs in the test process on the host, so it probes the
//! engines at 127.0.0.1 on the port each task publishes in host mode
//! (`--swarm-publish host`). The Swarm's gateway bridge is created first
//! without masquerading or traffic between its containers, as the backend
//! requires for that mode.

use crate::common;

use common::{
    docker, docker_ok, eventually, exec_in, host_pg_url, remove_swarm_objects, request, sample,
    sandbox_id, templates_built, Agent, SingleNodeSwarm, TestEnv,
};
use sandboxd::adapters::swarm::docker_name;
use sandboxd::client::{Client, SandboxRequest};
use sandboxd::config::ControllerConfig;
use sandboxd::controller::template::TEMPLATE;
use sandboxd::domain::{Phase, SandboxId, SandboxStatus, ServiceStatus};
use sandboxd::ports::runtime::Containers as _;
use sqlx::{Connection, PgConnection};
use std::time::Duration;

const READY: Duration = Duration::from_secs(120);

/// Removes what a test's deployment left.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        remove_swarm_objects(
            &format!("io.sandboxd.deployment={}", self.0),
            &format!("io.sandboxd.swarm-deployment={}", self.0),
        );
    }
}

/// A controller of `env`'s deployment on the Swarm backend.
async fn start(env: &TestEnv) -> common::RunningController {
    start_tuned(env, |_| {}).await
}

/// [`start`], with `tune` applied to its configuration first.
async fn start_tuned(
    env: &TestEnv,
    tune: impl FnOnce(&mut ControllerConfig),
) -> common::RunningController {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut config = env.config();
    config.relist_interval = Duration::from_secs(2);
    tune(&mut config);
    let (controller, _) = env.start_on_swarm(config).await;
    controller
}

/// `docker service ls` of a label: each service's name and replicas.
fn services(label: &str) -> Vec<String> {
    let out = docker_ok(&[
        "service",
        "ls",
        "--filter",
        &format!("label={label}"),
        "--format",
        "{{.Name}} {{.Replicas}}",
    ]);
    out.lines().map(str::to_owned).collect()
}

/// The containers (tasks) of a label, running or not.
fn task_containers(label: &str) -> Vec<String> {
    let out = docker_ok(&["ps", "-aq", "--filter", &format!("label={label}")]);
    out.split_whitespace().map(str::to_owned).collect()
}

/// Kills the task container of the sandbox `id` (its one engine,
/// postgres, published as `pg`) on this node and waits for its first
/// heal: ready again on a new instance.
async fn kill_and_await_heal(client: &Client, id: &SandboxId, pg: &ServiceStatus) -> SandboxStatus {
    let label = format!("label=io.sandboxd.sandbox={id}");
    let running = docker_ok(&["ps", "-q", "--filter", &label]);
    assert_eq!(running.lines().count(), 1, "{running}");
    docker_ok(&["kill", running.trim()]);
    eventually("the heal", READY, || async {
        let s = client.status(id).await.ok()??;
        let p = s.services.get("postgres")?;
        (s.phase == Phase::Ready && p.heals == 1 && p.instance != pg.instance).then_some(s)
    })
    .await
}

/// Whether `url` logs in (within a few seconds).
async fn logs_in(url: &str) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(url)).await,
        Ok(Ok(_))
    )
}

#[tokio::test]
async fn a_postgres_and_redis_row_becomes_hardened_swarm_services_reachable_through_its_overlay_with_no_credential_in_any_inspect(
) {
    let _swarm = SingleNodeSwarm::join();
    let env = TestEnv::new().await;
    let _cleanup = Cleanup(env.deployment.to_string());
    let _controller = start(&env).await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("swarm");
    // Agents the row attaches to its overlay (sandboxd detaches strangers).
    let agent = Agent::start_from(&format!("{}-agent", env.deployment), "sandboxd/postgres:17");
    let redis_agent = Agent::start(&format!("{}-redis-agent", env.deployment));
    let status = client
        .provision(
            &id,
            &SandboxRequest {
                attach: vec![agent.0.clone(), redis_agent.0.clone()],
                ..request(&["postgres", "redis"], &[])
            },
            READY,
        )
        .await
        .expect("the sandbox becomes ready on Swarm");
    let pg = &status.services["postgres"];
    let redis = &status.services["redis"];

    // Two one-replica services, and every container of the deployment is
    // one of their tasks.
    let sandbox_label = format!("io.sandboxd.sandbox={id}");
    let listed = services(&sandbox_label);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().all(|l| l.ends_with(" 1/1")), "{listed:?}");
    for c in task_containers(&format!("io.sandboxd.deployment={}", env.deployment)) {
        let service = docker_ok(&[
            "inspect",
            "--format",
            "{{index .Config.Labels \"com.docker.swarm.service.id\"}}",
            &c,
        ]);
        assert!(!service.is_empty(), "container {c} is not a Swarm task");
    }

    // Hardened as containers are: the engine's uid, read-only root, no
    // capability, tmpfs volumes, caps and reservations, no restart by Swarm.
    let ids = docker_ok(&[
        "service",
        "ls",
        "-q",
        "--filter",
        &format!("label={sandbox_label}"),
    ]);
    for service in ids.split_whitespace() {
        let spec = docker_ok(&[
            "service",
            "inspect",
            "--format",
            "{{json .Spec.TaskTemplate}} {{json .Spec.EndpointSpec}}",
            service,
        ]);
        for part in [
            r#""User":"999:999""#,
            r#""ReadOnly":true"#,
            r#""CapabilityDrop":["ALL"]"#,
            r#""Condition":"none""#,
            r#""SecretName":"#,
            r#""MemoryBytes":268435456"#,
            r#""Reservations":{"MemoryBytes":268435456}"#,
            r#""Mode":"dnsrr""#,
            r#""PublishMode":"host""#,
            "mode=0700,noexec,nosuid,nodev",
        ] {
            assert!(spec.contains(part), "{part} missing from {spec}");
        }
        assert!(!spec.contains(r#""Type":"tmpfs""#), "{spec}");
    }

    // The overlay is attachable; the gateway bridge that host-mode
    // publishing puts tasks on neither masquerades nor connects them.
    let network = docker_name(
        &status
            .network
            .clone()
            .expect("the status names the network"),
    );
    assert_eq!(
        docker_ok(&[
            "network",
            "inspect",
            "--format",
            "{{.Driver}} {{.Attachable}}",
            &network
        ]),
        "overlay true"
    );
    let gw = docker_ok(&[
        "network",
        "inspect",
        "--format",
        "{{json .Options}}",
        "docker_gwbridge",
    ]);
    assert!(
        gw.contains(r#""com.docker.network.bridge.enable_ip_masquerade":"false""#)
            && gw.contains(r#""com.docker.network.bridge.enable_icc":"false""#),
        "{gw}"
    );

    // The agents the row attached reach both engines by name on the
    // overlay with the status's credentials; another password is refused.
    let psql = format!(
        "psql -h {} -p {} -U {} -d {} -tAc 'select 40 + 2'",
        pg.host, pg.port, pg.user, pg.database
    );
    let (code, out) = exec_in(
        &env,
        &agent.0,
        &psql,
        vec![format!("PGPASSWORD={}", pg.password.expose())],
    )
    .await;
    assert_eq!((code, out.trim()), (0, "42"), "{out}");
    let (code, out) = exec_in(&env, &agent.0, &psql, vec!["PGPASSWORD=wrong".into()]).await;
    assert_ne!(code, 0, "a wrong password logged in: {out}");
    let ping = format!(
        "redis-cli --no-auth-warning -h {} -p {} ping",
        redis.host, redis.port
    );
    let (code, out) = exec_in(
        &env,
        &redis_agent.0,
        &ping,
        vec![format!("REDISCLI_AUTH={}", redis.password.expose())],
    )
    .await;
    assert_eq!((code, out.trim()), (0, "PONG"), "{out}");
    let (_, out) = exec_in(
        &env,
        &redis_agent.0,
        &ping,
        vec!["REDISCLI_AUTH=wrong".into()],
    )
    .await;
    assert_ne!(out.trim(), "PONG", "a wrong password was let in");

    // The controller, on the host, logs in at the published port too.
    assert!(logs_in(&host_pg_url(pg)).await);

    // No password in any inspect of the services or their tasks' containers.
    let mut inspected = docker_ok(
        &["service", "inspect"]
            .into_iter()
            .chain(ids.split_whitespace())
            .collect::<Vec<_>>(),
    );
    for c in task_containers(&sandbox_label) {
        inspected.push_str(&docker_ok(&["inspect", &c]));
    }
    for password in [pg.password.expose(), redis.password.expose()] {
        assert!(!inspected.contains(password), "a password is in an inspect");
    }
    assert!(inspected.contains("SANDBOXD_SECRETS_FILE=/run/secrets/sandboxd"));
}

#[tokio::test]
async fn a_sandbox_starts_from_its_template_a_killed_task_is_healed_from_it_with_the_same_credentials_a_grown_feature_set_rotates_and_a_released_row_leaves_nothing(
) {
    let _swarm = SingleNodeSwarm::join();
    let env = TestEnv::new().await;
    let _cleanup = Cleanup(env.deployment.to_string());
    let controller = start_tuned(&env, |c| c.templates = true).await;
    // The plain image's template, built at start by a global job.
    templates_built(&controller, 1.0).await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("swarmheal");
    let first = client
        .provision(&id, &request(&["postgres"], &[]), READY)
        .await
        .expect("ready");
    let pg = first.services["postgres"].clone();
    assert!(logs_in(&host_pg_url(&pg)).await);
    let template = mounted_template(&id.to_string());
    assert!(template.contains("-template-postgres-plain-"), "{template}");
    assert_eq!(template_starts(&controller), 1.0);
    // The job's service and overlay went with it.
    assert!(services(TEMPLATE).is_empty(), "{:?}", services(TEMPLATE));
    let job_overlays = docker_ok(&["network", "ls", "-q", "--filter", "name=-template-"]);
    assert!(job_overlays.is_empty(), "{job_overlays}");

    // Kill the task's container: Swarm does not restart it (condition
    // none); sandboxd re-creates the service with the same credentials.
    let sandbox_label = format!("io.sandboxd.sandbox={id}");
    let healed = kill_and_await_heal(&client, &id, &pg).await;
    let after = &healed.services["postgres"];
    assert_eq!(after.password.expose(), pg.password.expose());
    assert_eq!(after.user, pg.user);
    assert!(
        logs_in(&host_pg_url(after)).await,
        "the healed engine takes the same password"
    );
    assert_eq!(services(&sandbox_label).len(), 1);
    assert_eq!(
        template_starts(&controller),
        2.0,
        "the heal starts from the template"
    );

    // A grown feature set rotates: new credentials, the feature there,
    // one service.
    let generation = client
        .apply(&id, &request(&["postgres"], &[("postgres", "citext")]))
        .await
        .unwrap();
    let rotated = client
        .wait_ready(&id, &generation, READY)
        .await
        .expect("the rotation finishes");
    let new = &rotated.services["postgres"];
    assert_ne!(new.password.expose(), pg.password.expose());
    assert!(
        new.available_extensions.iter().any(|e| e == "citext"),
        "{:?}",
        new.available_extensions
    );
    assert!(logs_in(&host_pg_url(new)).await);
    let old_password = host_pg_url(new).replace(new.password.expose(), pg.password.expose());
    assert!(
        !logs_in(&old_password).await,
        "the old password still works"
    );
    assert_eq!(services(&sandbox_label).len(), 1);

    // Released: its service, secrets, volumes and network go.
    assert!(client.release(&id).await.unwrap());
    let network = docker_name(&rotated.network.clone().expect("network"));
    eventually("everything of the released sandbox gone", READY, || async {
        let left = [
            docker_ok(&[
                "service",
                "ls",
                "-q",
                "--filter",
                &format!("label={sandbox_label}"),
            ]),
            docker_ok(&[
                "secret",
                "ls",
                "-q",
                "--filter",
                &format!("label={sandbox_label}"),
            ]),
            docker_ok(&[
                "volume",
                "ls",
                "-q",
                "--filter",
                &format!("label={sandbox_label}"),
            ]),
            docker_ok(&[
                "network",
                "ls",
                "-q",
                "--filter",
                &format!("name=^{network}$"),
            ]),
        ];
        left.iter().all(String::is_empty).then_some(())
    })
    .await;

    // A node without the template (here: its volume removed behind
    // sandboxd's back, as on a node that joined after the job): the
    // engine placed there does not start from it, so sandboxd starts it
    // again at once, cold (the row never fails), and the job runs again
    // and builds the template.
    // (The grown feature set's template is built by then: two jobs.)
    templates_built(&controller, 2.0).await;
    // (Removable once the released sandbox's task containers are gone.)
    eventually("the template volume removed", READY, || async {
        docker(&["volume", "rm", &template])
            .status
            .success()
            .then_some(())
    })
    .await;
    let again = sandbox_id("swarmtpl");
    let cold = client
        .provision(&again, &request(&["postgres"], &[]), READY)
        .await
        .expect("ready, cold");
    assert!(logs_in(&host_pg_url(&cold.services["postgres"])).await);
    assert_eq!(template_starts(&controller), 2.0, "started cold");
    templates_built(&controller, 3.0).await;
    let from_template = sandbox_id("swarmtpl2");
    client
        .provision(&from_template, &request(&["postgres"], &[]), READY)
        .await
        .expect("ready");
    assert_eq!(mounted_template(&from_template.to_string()), template);
    assert_eq!(
        template_starts(&controller),
        3.0,
        "the rebuilt template serves"
    );
}

/// The template volume the service of the sandbox `id` mounts (read-only).
fn mounted_template(id: &str) -> String {
    let service = services(&format!("io.sandboxd.sandbox={id}"))[0]
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    let mounts = docker_ok(&[
        "service",
        "inspect",
        "-f",
        "{{range .Spec.TaskTemplate.ContainerSpec.Mounts}}{{.Source}} {{.ReadOnly}}\n{{end}}",
        &service,
    ]);
    let line = mounts
        .lines()
        .find(|l| l.contains("-template-"))
        .unwrap_or_else(|| panic!("no template among the mounts: {mounts}"));
    let (volume, read_only) = line.split_once(' ').unwrap();
    assert_eq!(read_only, "true", "{line}");
    volume.to_owned()
}

/// How many engines started from a template.
fn template_starts(controller: &common::RunningController) -> f64 {
    sample(
        &controller.metrics.render(),
        "sandboxd_container_starts_total{engine=\"postgres\",from=\"template\"}",
    )
    .unwrap_or(0.0)
}

/// Whether Redis on 127.0.0.1:`port` answers PING with `password`.
async fn redis_pongs(port: u16, password: &str) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://:{password}@127.0.0.1:{port}/0")) else {
        return false;
    };
    let ping = async {
        let mut con = client.get_multiplexed_async_connection().await.ok()?;
        redis::cmd("PING")
            .query_async::<String>(&mut con)
            .await
            .ok()
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(5), ping).await,
        Ok(Some(p)) if p == "PONG"
    )
}

#[tokio::test]
async fn a_new_sandbox_claims_a_ready_pool_service_without_restarting_it_and_a_killed_claimed_task_is_healed(
) {
    let _swarm = SingleNodeSwarm::join();
    let env = TestEnv::new().await;
    let _cleanup = Cleanup(env.deployment.to_string());
    let mut config = env.config();
    config.relist_interval = Duration::from_secs(2);
    config.warm_pool =
        sandboxd::config::warm_pools(&["postgres=1".to_owned(), "redis=1".to_owned()]).unwrap();
    let (controller, swarm) = env.start_on_swarm(config).await;
    let pool_ready = || async {
        eventually("one ready pool service per engine", READY, || async {
            let text = controller.metrics.render();
            ["postgres", "redis"]
                .iter()
                .all(|e| {
                    common::sample(
                        &text,
                        &format!("sandboxd_pool_size{{engine=\"{e}\",state=\"ready\"}}"),
                    ) == Some(1.0)
                })
                .then_some(())
        })
        .await;
        swarm
            .pool_containers(&env.deployment)
            .await
            .expect("list pool services")
    };
    let before = pool_ready().await;
    assert_eq!(before.len(), 2, "{before:?}");
    let client = Client::from_pool(env.pool.clone());

    // A new postgres sandbox takes the ready pool service as it runs: the
    // same service and task, its overlay adopted, the sandbox's labels
    // moved onto the service, fresh credentials set over the protocol.
    let id = sandbox_id("swarmpool");
    let status = client
        .provision(&id, &request(&["postgres"], &[]), READY)
        .await
        .expect("ready");
    let pg = status.services["postgres"].clone();
    assert!(logs_in(&host_pg_url(&pg)).await);
    let name = format!("sandboxd.{}.{}.postgres", env.deployment, id);
    let listed = swarm.pool_containers(&env.deployment).await.unwrap();
    let claimed = listed
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("a pool service named {name}: {listed:?}"));
    let was = before
        .iter()
        .find(|b| b.id == claimed.id)
        .expect("the claimed service was a ready pool service before the request");
    assert_eq!(
        status.network.as_deref(),
        was.networks.first().map(String::as_str),
        "the sandbox adopted the pool service's overlay"
    );
    let service_label = format!("com.docker.swarm.service.id={}", claimed.id.as_str());
    assert_eq!(
        task_containers(&service_label).len(),
        1,
        "the claim did not restart the task"
    );
    let sandbox_label = format!("io.sandboxd.sandbox={id}");
    assert_eq!(
        services(&sandbox_label).len(),
        1,
        "the sandbox's label is on the claimed service"
    );
    // Events are written after the status (in a batch of their own).
    eventually("a claimed event", Duration::from_secs(10), || async {
        let events = client.events(&id, 50).await.ok()?;
        events.iter().any(|e| e.reason == "claimed").then_some(())
    })
    .await;

    // A two-engine sandbox: one engine from the pool (whose overlay it
    // adopts; a task cannot join another), the other started cold there.
    pool_ready().await;
    let both = sandbox_id("swarmpool2");
    let status2 = client
        .provision(&both, &request(&["postgres", "redis"], &[]), READY)
        .await
        .expect("ready");
    assert!(logs_in(&host_pg_url(&status2.services["postgres"])).await);
    let redis = &status2.services["redis"];
    assert!(redis_pongs(redis.host_port, redis.password.expose()).await);
    let pooled_now = swarm.pool_containers(&env.deployment).await.unwrap();
    let claimed2 = pooled_now
        .iter()
        .filter(|c| {
            c.name
                .starts_with(&format!("sandboxd.{}.{}.", env.deployment, both))
        })
        .count();
    assert_eq!(claimed2, 1, "one engine claimed, one cold: {pooled_now:?}");

    // The claimed task killed from outside: seen at its event (the claim
    // maps the service to its sandbox) and healed with the same password.
    let task = docker_ok(&["ps", "-q", "--filter", &format!("label={service_label}")]);
    docker_ok(&["kill", task.trim()]);
    let healed = eventually("the heal of the claimed service", READY, || async {
        let s = client.status(&id).await.ok()??;
        let p = s.services.get("postgres")?;
        (s.phase == Phase::Ready && p.heals == 1).then_some(s)
    })
    .await;
    let after = &healed.services["postgres"];
    assert_eq!(after.password.expose(), pg.password.expose());
    assert!(logs_in(&host_pg_url(after)).await);

    // Released: nothing of either sandbox is left, the pool refills.
    for id in [&id, &both] {
        assert!(client.release(id).await.unwrap());
    }
    eventually("the released sandboxes' services go", READY, || async {
        let left = [&id, &both]
            .iter()
            .map(|id| services(&format!("io.sandboxd.sandbox={id}")).len())
            .sum::<usize>();
        let pooled = swarm.pool_containers(&env.deployment).await.ok()?;
        let claimed = pooled
            .iter()
            .filter(|c| c.name.starts_with("sandboxd."))
            .count();
        (left == 0 && claimed == 0).then_some(())
    })
    .await;
    pool_ready().await;
}
