//! A sandbox that holds: what the published credentials may do, how the
//! containers are locked down, where secrets never appear, and which
//! networks reach which engines. Real Docker, real engines.

use crate::common;

use bollard::query_parameters::{InspectContainerOptions, InspectNetworkOptions};
use common::{eventually, exec_in, request, sandbox_id, Agent, TestEnv};
use sandboxd::client::Client;
use sandboxd::domain::{Phase, SandboxId, SandboxStatus};
use sqlx::Connection;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

async fn ready(
    client: &Client,
    id: &SandboxId,
    req: &sandboxd::client::SandboxRequest,
) -> SandboxStatus {
    client
        .provision(id, req, READY)
        .await
        .unwrap_or_else(|e| panic!("{id} ready: {e}"))
}

/// A RESP command as the agent would send it; the error text if refused.
async fn redis_cmd(
    con: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> Result<redis::Value, String> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(con).await.map_err(|e| e.to_string())
}

#[tokio::test]
async fn the_published_credentials_give_an_agent_its_own_database_and_nothing_else() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("least");
    let req = request(
        &["postgres", "redis"],
        &[
            ("postgres", "pg_trgm"),
            ("postgres", "citext"),
            ("redis", "search"),
        ],
    );
    let status = ready(&client, &id, &req).await;

    // Postgres: no superuser, no server programs, the features installed.
    let pg = &status.services["postgres"];
    let mut conn = sqlx::PgConnection::connect(&common::host_pg_url(pg))
        .await
        .unwrap();
    let superuser: bool =
        sqlx::query_scalar("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(!superuser, "the agent's role is not a superuser");
    let err = sqlx::query("COPY (SELECT 1) TO PROGRAM 'id'")
        .execute(&mut conn)
        .await
        .expect_err("COPY TO PROGRAM is refused");
    assert_eq!(
        err.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("42501"),
        "{err}"
    );
    let err = sqlx::query("CREATE FUNCTION evil() RETURNS int AS '/lib/x86_64-linux-gnu/libc.so.6', 'getpid' LANGUAGE C")
        .execute(&mut conn)
        .await
        .expect_err("C functions are refused");
    assert_eq!(
        err.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("42501"),
        "{err}"
    );
    let privileged: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid
         WHERE m.member = (SELECT oid FROM pg_roles WHERE rolname = current_user)
           AND r.rolname IN ('pg_execute_server_program', 'pg_read_server_files', 'pg_write_server_files')",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(privileged, 0);
    let extensions: Vec<String> = sqlx::query_scalar("SELECT extname::text FROM pg_extension")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert!(extensions.contains(&"pg_trgm".to_owned()), "{extensions:?}");
    assert!(extensions.contains(&"citext".to_owned()), "{extensions:?}");
    // Its own database is its own: tables, trusted extensions, databases.
    sqlx::query("CREATE TABLE t (x citext)")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("CREATE EXTENSION hstore")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("CREATE DATABASE scratch")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    // The bootstrap superuser cannot log in over the network.
    let as_postgres = format!(
        "postgres://postgres:{}@127.0.0.1:{}/postgres",
        pg.password.expose(),
        pg.host_port
    );
    assert!(sqlx::PgConnection::connect(&as_postgres).await.is_err());

    // Redis: no module loading or server reconfiguration; a test suite's
    // commands and the requested module's commands work.
    let mut con = common::host_redis(&status.services["redis"]).await;
    for refused in [
        &["MODULE", "LOAD", "/usr/lib/redis/modules/redisearch.so"][..],
        &["CONFIG", "SET", "dir", "/tmp"],
        &["REPLICAOF", "127.0.0.1", "6380"],
        &["DEBUG", "SLEEP", "0"],
        &["SHUTDOWN", "NOSAVE"],
        &["ACL", "SETUSER", "evil", "on", ">pw", "+@all"],
    ] {
        let err = redis_cmd(&mut con, refused)
            .await
            .expect_err(&refused.join(" "));
        assert!(
            err.contains("NOPERM") || err.contains("not allowed") || err.contains("disabled"),
            "{}: {err}",
            refused.join(" ")
        );
    }
    redis_cmd(&mut con, &["SET", "k", "v"]).await.unwrap();
    redis_cmd(&mut con, &["FLUSHALL"]).await.unwrap();
    redis_cmd(&mut con, &["FLUSHDB"]).await.unwrap();
    redis_cmd(&mut con, &["EVAL", "return 1", "0"])
        .await
        .unwrap();
    redis_cmd(&mut con, &["CONFIG", "GET", "maxmemory"])
        .await
        .unwrap();
    redis_cmd(&mut con, &["FT.CREATE", "idx", "SCHEMA", "title", "TEXT"])
        .await
        .expect("the requested module's commands work");
    controller.stop().await;
}

#[tokio::test]
async fn sandbox_containers_are_locked_down_and_carry_no_credential() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("locked");
    let status = ready(&client, &id, &request(&["postgres", "redis"], &[])).await;
    let passwords: Vec<String> = status
        .services
        .values()
        .map(|s| s.password.expose().to_owned())
        .collect();
    let containers = env.containers(Some(&id)).await;
    assert_eq!(containers.len(), 2);
    for c in containers {
        let info = env
            .docker
            .inspect_container(c.id.as_str(), None::<InspectContainerOptions>)
            .await
            .unwrap();
        let host = info.host_config.clone().unwrap();
        let config = info.config.clone().unwrap();
        let name = &c.name;
        assert_eq!(host.readonly_rootfs, Some(true), "{name}: read-only root");
        let user = config.user.clone().unwrap_or_default();
        assert!(
            !user.is_empty() && !user.starts_with("0") && user != "root",
            "{name}: user {user:?}"
        );
        assert!(
            host.cap_add.unwrap_or_default().is_empty(),
            "{name}: no added capabilities"
        );
        assert_eq!(host.cap_drop.unwrap_or_default(), ["ALL"], "{name}");
        assert!(
            host.security_opt
                .unwrap_or_default()
                .iter()
                .any(|o| o.starts_with("no-new-privileges")),
            "{name}"
        );
        let tmpfs = host.tmpfs.unwrap_or_default();
        assert!(tmpfs.contains_key("/tmp"), "{name}: {tmpfs:?}");
        for (path, options) in &tmpfs {
            for flag in ["noexec", "nosuid", "nodev"] {
                assert!(
                    options.split(',').any(|o| o == flag),
                    "{name}: {path} {options}"
                );
            }
        }
        let log = host
            .log_config
            .unwrap_or_default()
            .config
            .unwrap_or_default();
        assert!(
            log.contains_key("max-size"),
            "{name}: log size limit {log:?}"
        );
        assert!(host.oom_score_adj.unwrap_or(0) > 0, "{name}: OOM score");
        assert!(
            host.binds.unwrap_or_default().is_empty(),
            "{name}: no host paths"
        );
        assert!(
            info.mounts.unwrap_or_default().is_empty(),
            "{name}: no volumes or binds"
        );
        let mut visible: Vec<String> = config.env.unwrap_or_default();
        visible.extend(config.cmd.unwrap_or_default());
        visible.extend(config.entrypoint.unwrap_or_default());
        visible.extend(info.path.into_iter());
        visible.extend(info.args.unwrap_or_default());
        visible.extend(
            config
                .labels
                .unwrap_or_default()
                .into_iter()
                .flat_map(|(k, v)| [k, v]),
        );
        for text in &visible {
            for pw in &passwords {
                assert!(
                    !text.contains(pw.as_str()),
                    "{name}: a password in {text:?}"
                );
            }
        }
    }
    controller.stop().await;
}

/// Every process's command line on the host, as `ps` shows it.
fn command_lines() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .collect()
}

#[tokio::test]
async fn no_password_ever_shows_in_host_ps_during_a_burst_of_provisioning() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let seen = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (seen, stop) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut samples = 0u32;
            while !stop.load(Ordering::Relaxed) {
                seen.lock().unwrap().extend(command_lines());
                samples += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            samples
        })
    };
    let ids: Vec<SandboxId> = (0..5).map(|i| sandbox_id(&format!("ps{i}"))).collect();
    let req = request(&["postgres", "redis"], &[("postgres", "pg_trgm")]);
    let statuses = futures::future::join_all(ids.iter().map(|id| ready(&client, id, &req))).await;
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().unwrap();
    assert!(samples > 10, "the sampler ran ({samples} samples)");
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.iter().any(|line| line.contains("postgres")),
        "the sampler saw the engines' processes"
    );
    for status in &statuses {
        for service in status.services.values() {
            let pw = service.password.expose();
            let leaks: Vec<&String> = seen.iter().filter(|l| l.contains(pw)).collect();
            assert!(leaks.is_empty(), "a password in host ps: {leaks:?}");
        }
    }
    controller.stop().await;
}

#[tokio::test]
async fn an_agent_on_a_sandbox_network_reaches_that_sandbox_only_and_nothing_outside() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let agent = Agent::start(&format!("agent-{}", env.deployment));
    let a = sandbox_id("neta");
    let b = sandbox_id("netb");
    let mut req_a = request(&["redis"], &[]);
    req_a.attach = vec![agent.0.clone()];
    let status_a = ready(&client, &a, &req_a).await;
    let status_b = ready(&client, &b, &request(&["redis"], &[])).await;
    let network_a = status_a
        .network
        .clone()
        .expect("the status names the network");
    assert_ne!(Some(&network_a), status_b.network.as_ref());
    assert_eq!(status_a.services["redis"].host, "redis");

    // A's engine answers the agent by its engine name.
    let auth = format!(
        "REDISCLI_AUTH={}",
        status_a.services["redis"].password.expose()
    );
    let (code, out) = exec_in(&env, &agent.0, "redis-cli -h redis ping", vec![auth]).await;
    assert_eq!((code, out.trim()), (0, "PONG"), "A's redis from the agent");

    // B's engine neither resolves nor connects.
    let b_container = env.containers(Some(&b)).await.remove(0);
    let (code, _) = exec_in(
        &env,
        &agent.0,
        &format!("getent hosts {}", b_container.name),
        vec![],
    )
    .await;
    assert_ne!(
        code, 0,
        "B's container name does not resolve on A's network"
    );
    let b_info = env
        .docker
        .inspect_container(b_container.id.as_str(), None::<InspectContainerOptions>)
        .await
        .unwrap();
    let b_ip = b_info
        .network_settings
        .and_then(|n| n.networks)
        .and_then(|n| n.values().next().and_then(|e| e.ip_address.clone()))
        .expect("B has an address");
    let (code, out) = exec_in(
        &env,
        &agent.0,
        &format!("timeout 3 bash -c '</dev/tcp/{b_ip}/6379' && echo connected"),
        vec![],
    )
    .await;
    assert!(
        code != 0 && !out.contains("connected"),
        "B at {b_ip} is unreachable: {out}"
    );

    // No route out: the network does not masquerade.
    let net = env
        .docker
        .inspect_network(&network_a, None::<InspectNetworkOptions>)
        .await
        .unwrap();
    let options = net.options.unwrap_or_default();
    assert_eq!(
        options
            .get("com.docker.network.bridge.enable_ip_masquerade")
            .map(String::as_str),
        Some("false"),
        "{options:?}"
    );
    let subnet = net.ipam.and_then(|i| i.config).unwrap()[0]
        .subnet
        .clone()
        .unwrap();
    assert!(
        subnet.starts_with("10.213."),
        "{subnet} comes from the pool"
    );
    let bridge = options
        .get("com.docker.network.bridge.name")
        .cloned()
        .unwrap_or_default();
    assert!(
        bridge.starts_with("sbx"),
        "the bridge {bridge:?} is one the host guard covers"
    );

    // Released: the network goes, the agent is disconnected, not removed.
    client.release(&a).await.unwrap();
    eventually(
        "A's network is removed",
        Duration::from_secs(30),
        || async {
            env.docker
                .inspect_network(&network_a, None::<InspectNetworkOptions>)
                .await
                .is_err()
                .then_some(())
        },
    )
    .await;
    let (code, _) = exec_in(&env, &agent.0, "true", vec![]).await;
    assert_eq!(code, 0, "the agent container itself is left alone");
    controller.stop().await;
}

/// A listener on the host, counting the connections it accepts.
struct HostListener {
    port: u16,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl HostListener {
    fn bind(addr: std::net::IpAddr) -> Self {
        let listener = std::net::TcpListener::bind((addr, 0)).expect("bind the host listener");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (accepted.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok(_) => {
                        a.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Self {
            port,
            accepted,
            stop,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for HostListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[tokio::test]
async fn a_service_the_host_binds_on_a_sandbox_networks_gateway_is_unreachable_from_the_sandbox() {
    let guard = std::process::Command::new("deploy/host-firewall.sh")
        .arg("--check")
        .status()
        .expect("run deploy/host-firewall.sh --check");
    assert!(
        guard.success(),
        "the host guard is not installed: run deploy/host-firewall.sh as root (scripts/test.sh does)"
    );
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let agent = Agent::start(&format!("agent-gw-{}", env.deployment));
    let id = sandbox_id("gw");
    let mut req = request(&["redis"], &[]);
    req.attach = vec![agent.0.clone()];
    let status = ready(&client, &id, &req).await;
    let network = status
        .network
        .clone()
        .expect("the status names the network");
    let net = env
        .docker
        .inspect_network(&network, None::<InspectNetworkOptions>)
        .await
        .unwrap();
    let gateway: std::net::IpAddr = net.ipam.and_then(|i| i.config).unwrap()[0]
        .gateway
        .clone()
        .expect("the sandbox network has a gateway address")
        .parse()
        .unwrap();

    // Two services of the host's: one bound on the gateway address, one on
    // every address. Both answer the host itself.
    let on_gateway = HostListener::bind(gateway);
    let on_all = HostListener::bind(std::net::Ipv4Addr::UNSPECIFIED.into());
    for (l, what) in [(&on_gateway, "gateway"), (&on_all, "all addresses")] {
        std::net::TcpStream::connect_timeout(&(gateway, l.port).into(), Duration::from_secs(3))
            .unwrap_or_else(|e| panic!("the host reaches its own listener on {what}: {e}"));
    }
    eventually(
        "the host's own connections are accepted",
        Duration::from_secs(5),
        || async { (on_gateway.accepted() == 1 && on_all.accepted() == 1).then_some(()) },
    )
    .await;

    // From the sandbox's network (the attached agent, and the engine's own
    // container), neither answers.
    let engine = env.containers(Some(&id)).await.remove(0);
    for (container, who) in [
        (agent.0.as_str(), "the agent"),
        (engine.name.as_str(), "the engine"),
    ] {
        for (l, what) in [(&on_gateway, "gateway"), (&on_all, "all addresses")] {
            let (code, out) = exec_in(
                &env,
                container,
                &format!(
                    "timeout 3 bash -c '</dev/tcp/{gateway}/{}' && echo connected",
                    l.port
                ),
                vec![],
            )
            .await;
            assert!(
                code != 0 && !out.contains("connected"),
                "{who} reached the host's listener on {what} at {gateway}:{}: {out}",
                l.port
            );
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        (on_gateway.accepted(), on_all.accepted()),
        (1, 1),
        "no connection from the sandbox reached the host"
    );

    // The host still reaches the sandbox: its answers are not new connections.
    let mut con = common::host_redis(&status.services["redis"]).await;
    assert_eq!(
        redis_cmd(&mut con, &["PING"]).await,
        Ok(redis::Value::SimpleString("PONG".into()))
    );
    client.release(&id).await.unwrap();
    controller.stop().await;
}

#[tokio::test]
async fn a_container_outside_cannot_reach_a_sandbox_even_while_networks_are_being_created() {
    // Docker 20.10 drops its isolation between networks for a moment
    // whenever a network is created (it re-inserts the FORWARD jump to
    // DOCKER-ISOLATION-STAGE-1); the host guard (deploy/host-firewall.sh)
    // must hold through that. Without it, 3 of 300 tries got through here.
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("churn");
    ready(&client, &id, &request(&["redis"], &[])).await;
    let outsider = Agent::start(&format!("outsider-{}", env.deployment));
    let engine = env.containers(Some(&id)).await.remove(0);
    let info = env
        .docker
        .inspect_container(engine.id.as_str(), None::<InspectContainerOptions>)
        .await
        .unwrap();
    let ip = info
        .network_settings
        .and_then(|n| n.networks)
        .and_then(|n| n.values().next().and_then(|e| e.ip_address.clone()))
        .expect("the engine has an address");

    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (stop, tag) = (stop.clone(), env.deployment.to_string());
        std::thread::spawn(move || {
            let mut created = 0u32;
            while !stop.load(Ordering::Relaxed) {
                // Outside sandboxd's pool, so no test's allocation collides.
                let name = format!("churn-{tag}-{}", created % 32);
                let subnet = format!("10.214.{}.0/29", created % 32);
                let ok = std::process::Command::new("docker")
                    .args(["network", "create", "--label", "sandboxd-test.churn=1"])
                    .args(["--subnet", &subnet, &name])
                    .output()
                    .is_ok_and(|o| o.status.success());
                let _ = std::process::Command::new("docker")
                    .args(["network", "rm", &name])
                    .output();
                created += u32::from(ok);
            }
            created
        })
    };
    let script = format!(
        "ok=0; for i in $(seq 1 200); do timeout 0.2 bash -c '</dev/tcp/{ip}/6379' 2>/dev/null && ok=$((ok+1)); done; echo $ok"
    );
    let (_, out) = exec_in(&env, &outsider.0, &script, vec![]).await;
    stop.store(true, Ordering::Relaxed);
    let created = churn.join().unwrap();
    assert!(created >= 5, "networks were created meanwhile ({created})");
    assert_eq!(out.trim(), "0", "connections that got through to {ip}");
    controller.stop().await;
}

#[tokio::test]
async fn sandboxd_refuses_to_attach_its_own_containers_to_a_sandbox_network() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let victim = sandbox_id("victim");
    ready(&client, &victim, &request(&["redis"], &[])).await;
    let victim_container = env.containers(Some(&victim)).await.remove(0).name;
    let id = sandbox_id("greedy");
    let mut req = request(&["redis"], &[]);
    req.attach = vec![victim_container.clone()];
    client.apply(&id, &req).await.unwrap();
    let status = eventually("the attach is refused", READY, || async {
        client
            .status(&id)
            .await
            .ok()
            .flatten()
            .filter(|s| s.phase == Phase::Failed)
    })
    .await;
    // The refusal says only that it is not attachable, as for any other
    // container (crate::attach).
    assert!(
        status
            .message
            .contains(&format!("attach {victim_container}: not attachable")),
        "{}",
        status.message
    );
    let network = status.network.expect("the status names the network");
    let members = env.network_members(&network).await;
    assert!(!members.contains(&victim_container), "{members:?}");
    controller.stop().await;
}

#[tokio::test]
async fn deployments_and_ids_that_join_to_the_same_text_never_share_a_container() {
    // Deployment D with sandbox x-y, deployment D-x with sandbox y: the old
    // names (`sandboxd-D-x-y-redis`) collided and each removed the other's.
    let first = TestEnv::new().await;
    let mut second = TestEnv::new().await;
    second.deployment =
        sandboxd::domain::Deployment::parse(&format!("{}-x", first.deployment)).unwrap();
    let mut config_first = first.config();
    config_first.relist_interval = Duration::from_secs(1);
    let mut config_second = second.config();
    config_second.relist_interval = Duration::from_secs(1);
    let one = first.start(config_first);
    let two = second.start(config_second);
    let client_first = Client::from_pool(first.pool.clone());
    let client_second = Client::from_pool(second.pool.clone());
    let xy = SandboxId::parse("x-y").unwrap();
    let y = SandboxId::parse("y").unwrap();
    let req = request(&["redis"], &[]);
    let (a, b) = tokio::join!(
        ready(&client_first, &xy, &req),
        ready(&client_second, &y, &req),
    );
    let before = (first.containers(None).await, second.containers(None).await);
    assert_eq!((before.0.len(), before.1.len()), (1, 1));
    assert_ne!(before.0[0].name, before.1[0].name);
    // Several relists and reconciles of both later, nothing was replaced.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = (first.containers(None).await, second.containers(None).await);
    assert_eq!(before.0[0].id, after.0[0].id);
    assert_eq!(before.1[0].id, after.1[0].id);
    for (client, id, was) in [(&client_first, &xy, a), (&client_second, &y, b)] {
        let now = client.status(id).await.unwrap().unwrap();
        assert_eq!(now.phase, Phase::Ready);
        assert_eq!(
            now.services["redis"].instance,
            was.services["redis"].instance
        );
    }
    one.stop().await;
    two.stop().await;
}

#[tokio::test]
async fn an_image_that_does_not_read_its_secrets_from_stdin_is_refused() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    // The base image has no sandbox mode: it would run without a password.
    config.images =
        sandboxd::config::Images::new(&["redis=sandboxd/debian-base:trixie".to_owned()], &[])
            .unwrap();
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("nomode");
    let err = client
        .provision(&id, &request(&["redis"], &[]), READY)
        .await
        .expect_err("refused");
    assert!(
        err.to_string().contains("io.sandboxd.sandbox-mode=1"),
        "{err}"
    );
    assert!(
        env.containers(Some(&id)).await.is_empty(),
        "nothing was created"
    );
    controller.stop().await;
}
