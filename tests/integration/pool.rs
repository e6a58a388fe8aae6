//! The warm pool on the real Docker engine and a real state Postgres:
//! matching sandboxes are served by claiming ready pool containers (fresh
//! credentials set at claim time), the pool is refilled to its size and
//! never above it, a restart keeps the claims, and a heal claims too.

use crate::common;

use bollard::query_parameters::{InspectContainerOptions, KillContainerOptions};
use common::{
    eventually, exec_in, host_pg_url, request, sandbox_id, total, Agent, RunningController, TestEnv,
};
use sandboxd::client::Client;
use sandboxd::config::{warm_pools, ControllerConfig};
use sandboxd::domain::container::ContainerState;
use sandboxd::domain::pool::PooledContainer;
use sandboxd::domain::{Phase, SandboxId, SandboxStatus};
use sandboxd::ports::runtime::{Containers, Networks};
use sqlx::Connection;
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

fn pooled(env: &TestEnv, sizes: &[&str]) -> ControllerConfig {
    let mut config = env.config();
    config.warm_pool =
        warm_pools(&sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    config
}

async fn pool_containers(env: &TestEnv) -> Vec<PooledContainer> {
    env.runtime
        .pool_containers(&env.deployment)
        .await
        .expect("list pool containers")
}

/// Waits until the pool holds `n` ready containers per engine (the
/// controller's gauge) and returns the listed pool containers.
async fn pool_ready(
    env: &TestEnv,
    controller: &RunningController,
    engines: &[&str],
    n: f64,
) -> Vec<PooledContainer> {
    eventually("a full warm pool", Duration::from_secs(90), || async {
        let text = controller.metrics.render();
        engines
            .iter()
            .all(|e| {
                common::sample(
                    &text,
                    &format!("sandboxd_pool_size{{engine=\"{e}\",state=\"ready\"}}"),
                ) == Some(n)
            })
            .then_some(())
    })
    .await;
    pool_containers(env).await
}

async fn claimed_ids(env: &TestEnv, status: &SandboxStatus, id: &SandboxId) -> Vec<String> {
    // The containers now serving the sandbox are the pool's, renamed.
    let listed = pool_containers(env).await;
    let mut ids = Vec::new();
    for engine in status.services.keys() {
        let name = format!("sandboxd.{}.{}.{}", env.deployment, id, engine);
        let c = listed
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("{engine} is served by a pool container named {name}"));
        ids.push(c.id.as_str().to_owned());
    }
    ids
}

async fn redis_ping(host_port: u16, password: &str) -> Result<String, String> {
    let client = redis::Client::open(format!("redis://:{password}@127.0.0.1:{host_port}/0"))
        .map_err(|e| e.to_string())?;
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    redis::cmd("PING")
        .query_async::<String>(&mut con)
        .await
        .map_err(|e| e.to_string())
}

async fn assert_secret_not_in_inspect(env: &TestEnv, container: &str, secret: &str) {
    let info = env
        .docker
        .inspect_container(container, None::<InspectContainerOptions>)
        .await
        .unwrap();
    let config = info.config.unwrap();
    let seen = format!(
        "{:?} {:?} {:?} {:?} {:?}",
        config.env, config.cmd, config.labels, info.args, config.entrypoint
    );
    assert!(
        !seen.contains(secret),
        "the password is in docker inspect of {container}"
    );
}

/// The networks `container` is on, with its aliases there.
async fn networks_of(env: &TestEnv, container: &str) -> Vec<(String, Vec<String>)> {
    let info = env
        .docker
        .inspect_container(container, None::<InspectContainerOptions>)
        .await
        .unwrap();
    let mut networks: Vec<_> = info
        .network_settings
        .and_then(|n| n.networks)
        .unwrap_or_default()
        .into_iter()
        .map(|(name, endpoint)| (name, endpoint.aliases.unwrap_or_default()))
        .collect();
    networks.sort();
    networks
}

/// The names of the containers on `network`.
async fn members(env: &TestEnv, network: &str) -> Option<Vec<String>> {
    env.runtime
        .network_members(network)
        .await
        .expect("inspect network")
}

#[tokio::test]
async fn a_matching_sandbox_is_served_by_claims_and_the_pool_is_refilled_to_its_size() {
    let env = TestEnv::new().await;
    let controller = env.start(pooled(&env, &["postgres=1", "redis=1"]));
    let before = pool_ready(&env, &controller, &["postgres", "redis"], 1.0).await;
    assert_eq!(before.len(), 2);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("pool");
    let status = client
        .provision(&id, &request(&["postgres", "redis"], &[]), READY)
        .await
        .unwrap();
    assert_eq!(status.phase, Phase::Ready);

    let serving = claimed_ids(&env, &status, &id).await;
    for c in &serving {
        assert!(
            before.iter().any(|b| b.id.as_str() == c),
            "container {c} was a pool container before the request"
        );
    }
    // The sandbox's credentials work.
    let pg = &status.services["postgres"];
    let mut conn = sqlx::PgConnection::connect(&host_pg_url(pg))
        .await
        .expect("connect with the sandbox's credentials");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);
    let redis = &status.services["redis"];
    assert_eq!(
        redis_ping(redis.host_port, redis.password.expose())
            .await
            .unwrap(),
        "PONG"
    );
    // The pool's admin login is gone: only the sandbox's password opens Redis.
    let wrong = redis::Client::open(format!("redis://127.0.0.1:{}/0", redis.host_port)).unwrap();
    let mut con = wrong.get_multiplexed_async_connection().await.unwrap();
    let auth: Result<String, _> = redis::cmd("AUTH")
        .arg("sandboxd-pool")
        .arg(redis.password.expose())
        .query_async(&mut con)
        .await;
    assert!(auth.is_err(), "the pool's admin user survived the claim");
    // Neither secret is in the containers' configuration.
    for (engine, c) in status.services.keys().zip(&serving) {
        assert_secret_not_in_inspect(&env, c, status.services[engine].password.expose()).await;
    }
    // The sandbox adopted the network of its first claim (postgres): no
    // network was created for it. Each claimed container is on that
    // network under its engine's name; the other one (redis) is otherwise
    // only on its own pool network, alone.
    let pool_prefix = format!("sandboxd-pool.{}.", env.deployment);
    let sandbox_network = status
        .network
        .clone()
        .expect("the status names the network");
    assert!(
        sandbox_network.starts_with(&pool_prefix),
        "{sandbox_network}"
    );
    assert!(
        members(&env, &format!("sandboxd.{}.{id}", env.deployment))
            .await
            .is_none(),
        "no network of the sandbox's own name was created"
    );
    let mut pool_networks = vec![sandbox_network.clone()];
    for (engine, c) in status.services.keys().zip(&serving) {
        let networks = networks_of(&env, c).await;
        let on_sandbox = networks.iter().find(|(n, _)| *n == sandbox_network);
        let (_, aliases) = on_sandbox.expect("on the sandbox's network");
        assert!(aliases.iter().any(|a| a == engine), "{aliases:?}");
        match engine.as_str() {
            "postgres" => assert_eq!(networks.len(), 1, "{networks:?}"),
            _ => {
                assert_eq!(networks.len(), 2, "{networks:?}");
                let (own, _) = networks
                    .iter()
                    .find(|(n, _)| *n != sandbox_network)
                    .unwrap();
                assert!(own.starts_with(&pool_prefix), "{own}");
                let on_own = members(&env, own).await.expect("the pool network exists");
                assert_eq!(on_own.len(), 1, "alone on {own}: {on_own:?}");
                pool_networks.push(own.clone());
            }
        }
    }
    let on_sandbox = members(&env, &sandbox_network).await.unwrap();
    assert_eq!(on_sandbox.len(), 2, "both engines: {on_sandbox:?}");

    // Refilled to its size, never above it.
    let after = pool_ready(&env, &controller, &["postgres", "redis"], 1.0).await;
    let unclaimed = after
        .iter()
        .filter(|c| !serving.contains(&c.id.as_str().to_owned()))
        .count();
    assert_eq!(unclaimed, 2, "one ready pool container per engine again");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = pool_containers(&env).await;
    assert_eq!(later.len(), 4, "never above the size: {later:?}");
    let text = controller.metrics.render();
    assert_eq!(total(&text, "sandboxd_pool_claims_total"), 2.0);
    assert!(text.contains(
        "sandboxd_pool_claims_total{engine=\"postgres\",kind=\"create\",result=\"hit\"} 1"
    ));

    // Released: the claimed containers go, and their pool networks with
    // them (at a relist).
    client.release(&id).await.unwrap();
    for network in &pool_networks {
        eventually(
            "the pool network of a removed container to go",
            READY,
            || async { members(&env, network).await.is_none().then_some(()) },
        )
        .await;
    }
    controller.stop().await;
}

#[tokio::test]
async fn a_pooled_postgres_a_cold_redis_and_an_attached_agent_share_the_adopted_pool_network() {
    let env = TestEnv::new().await;
    let controller = env.start(pooled(&env, &["postgres=1"]));
    pool_ready(&env, &controller, &["postgres"], 1.0).await;
    let client = Client::from_pool(env.pool.clone());
    let agent = Agent::start(&format!("agent-{}", env.deployment));
    let id = sandbox_id("poolmixed");
    let mut req = request(&["postgres", "redis"], &[]);
    req.attach = vec![agent.0.clone()];
    let status = client.provision(&id, &req, READY).await.unwrap();
    assert_eq!(status.phase, Phase::Ready, "{}", status.message);
    let network = status
        .network
        .clone()
        .expect("the status names the network");
    assert!(
        network.starts_with(&format!("sandboxd-pool.{}.", env.deployment)),
        "the claimed postgres's pool network is the sandbox's: {network}"
    );
    // Both engines, the cold one too, answer the agent by their names.
    let auth = format!(
        "REDISCLI_AUTH={}",
        status.services["redis"].password.expose()
    );
    let (code, out) = exec_in(&env, &agent.0, "redis-cli -h redis ping", vec![auth]).await;
    assert_eq!(
        (code, out.trim()),
        (0, "PONG"),
        "the cold redis from the agent"
    );
    let (code, out) = exec_in(
        &env,
        &agent.0,
        "timeout 3 bash -c '</dev/tcp/postgres/5432' && echo connected",
        vec![],
    )
    .await;
    assert_eq!(
        (code, out.trim()),
        (0, "connected"),
        "the claimed postgres from the agent"
    );
    let mut on = members(&env, &network).await.expect("the network exists");
    on.sort();
    assert_eq!(on.len(), 3, "postgres, redis and the agent: {on:?}");
    assert!(on.contains(&agent.0), "{on:?}");

    // Released: the agent is let go and the adopted network goes.
    client.release(&id).await.unwrap();
    eventually("the adopted network to go", READY, || async {
        members(&env, &network).await.is_none().then_some(())
    })
    .await;
    controller.stop().await;
}

#[tokio::test]
async fn a_controller_restart_keeps_the_claim_and_replaces_unclaimed_pool_containers() {
    let env = TestEnv::new().await;
    let config = pooled(&env, &["postgres=1"]);
    let controller = env.start(config.clone());
    pool_ready(&env, &controller, &["postgres"], 1.0).await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("poolrestart");
    let status = client
        .provision(&id, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    let claimed = claimed_ids(&env, &status, &id).await;
    let spare = pool_ready(&env, &controller, &["postgres"], 1.0).await;
    let spare: Vec<String> = spare
        .iter()
        .map(|c| c.id.as_str().to_owned())
        .filter(|c| !claimed.contains(c))
        .collect();
    assert_eq!(spare.len(), 1);
    controller.stop().await;

    let controller = env.start(config);
    // The spare's password died with the first process: replaced.
    let now = pool_ready(&env, &controller, &["postgres"], 1.0).await;
    assert!(!now.iter().any(|c| c.id.as_str() == spare[0]));
    // The claimed container still serves the sandbox, untouched and ready.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = client.status(&id).await.unwrap().unwrap();
    assert_eq!(again.phase, Phase::Ready);
    assert_eq!(
        again.services["postgres"].instance,
        status.services["postgres"].instance
    );
    assert_eq!(claimed_ids(&env, &again, &id).await, claimed);
    assert!(now
        .iter()
        .any(|c| c.id.as_str() == claimed[0] && c.state == ContainerState::Running));
    controller.stop().await;
}

#[tokio::test]
async fn a_heal_after_docker_kill_claims_from_the_pool_with_the_same_credentials() {
    let env = TestEnv::new().await;
    let mut config = pooled(&env, &["postgres=1"]);
    config.relist_interval = Duration::from_secs(3600);
    let controller = env.start(config);
    pool_ready(&env, &controller, &["postgres"], 1.0).await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("poolheal");
    let before = client
        .provision(&id, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    let victim = claimed_ids(&env, &before, &id).await.remove(0);
    let spare = pool_ready(&env, &controller, &["postgres"], 1.0).await;
    let spare: Vec<String> = spare
        .iter()
        .map(|c| c.id.as_str().to_owned())
        .filter(|c| c != &victim)
        .collect();
    env.docker
        .kill_container(&victim, None::<KillContainerOptions>)
        .await
        .unwrap();
    let after = eventually(
        "a healed, ready sandbox",
        Duration::from_secs(30),
        || async {
            let s = client.status(&id).await.unwrap()?;
            (s.phase == Phase::Ready
                && s.services["postgres"].instance != before.services["postgres"].instance)
                .then_some(s)
        },
    )
    .await;
    assert_eq!(
        after.services["postgres"].password,
        before.services["postgres"].password
    );
    assert_eq!(
        claimed_ids(&env, &after, &id).await,
        spare,
        "the heal claimed the spare"
    );
    let mut conn = sqlx::PgConnection::connect(&host_pg_url(&after.services["postgres"]))
        .await
        .expect("the same credentials work after the heal");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);
    let text = controller.metrics.render();
    assert!(text.contains(
        "sandboxd_pool_claims_total{engine=\"postgres\",kind=\"heal\",result=\"hit\"} 1"
    ));
    controller.stop().await;
}

#[tokio::test]
async fn feature_sets_that_are_asked_for_get_pools_of_their_own_and_creates_and_heals_claim_from_them(
) {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.relist_interval = Duration::from_secs(3600);
    config.warm_pool_demand = sandboxd::config::PoolDemand {
        max: 2,
        window: Duration::from_secs(600),
    };
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let trgm = || request(&["postgres"], &[("postgres", "pg_trgm")]);
    let hits = |kind: &str| {
        common::sample(
            &controller.metrics.render(),
            &format!(
                "sandboxd_pool_claims_total{{engine=\"postgres\",kind=\"{kind}\",result=\"hit\"}}"
            ),
        )
        .unwrap_or(0.0)
    };

    // The first request of a feature set is a miss, served cold; it
    // teaches the pool the set.
    let first = sandbox_id("learn1");
    client.provision(&first, &trgm(), READY).await.unwrap();
    assert_eq!(hits("create"), 0.0);
    let ready = pool_ready(&env, &controller, &["postgres"], 1.0).await;
    assert_eq!(ready.len(), 1);
    assert_eq!(
        ready[0]
            .features
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        ["pg_trgm"],
        "a pool container of the asked-for set"
    );

    // The next one claims it, with its feature.
    let second = sandbox_id("learn2");
    let status = client.provision(&second, &trgm(), READY).await.unwrap();
    assert_eq!(hits("create"), 1.0);
    let mut conn = sqlx::PgConnection::connect(&host_pg_url(&status.services["postgres"]))
        .await
        .unwrap();
    let trgm_there: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_extension WHERE extname = 'pg_trgm'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(trgm_there, 1);

    // A heal of the cold one claims the refilled spare, same credentials.
    pool_ready(&env, &controller, &["postgres"], 1.0).await;
    let (before, after) =
        common::kill_and_wait_healed(&env, &client, &first, "postgres", Duration::from_secs(30))
            .await;
    assert_eq!(
        after.services["postgres"].password,
        before.services["postgres"].password
    );
    assert_eq!(hits("heal"), 1.0);
    // Never above the bound, whatever was asked.
    assert!(
        pool_containers(&env).await.len() <= 2 + 2,
        "two claimed, at most two spare"
    );
    controller.stop().await;
}

/// The names of the containers Docker's name filter `selector` lists.
async fn named(env: &TestEnv, selector: &str) -> Vec<(String, String)> {
    let injector = sandboxd::adapters::chaos::Injector::new((*env.runtime).clone());
    let mut found: Vec<(String, String)> = injector
        .named(selector)
        .await
        .expect("list by name")
        .into_iter()
        .map(|c| (c.name, c.id.as_str().to_owned()))
        .collect();
    found.sort();
    found
}

// Multi-threaded: the controller runs in this process while the test
// blocks on `sandboxd describe`.
#[tokio::test(flavor = "multi_thread")]
async fn the_documented_selector_finds_a_sandboxs_claimed_and_cold_containers_and_none_of_a_sandbox_it_prefixes(
) {
    use sandboxd::domain::network::container_selector;
    let env = TestEnv::new().await;
    let controller = env.start(pooled(&env, &["postgres=1"]));
    pool_ready(&env, &controller, &["postgres"], 1.0).await;
    let client = Client::from_pool(env.pool.clone());
    let a = sandbox_id("sel");
    // `a`'s id is a prefix of `ab`'s.
    let ab = SandboxId::parse(&format!("{a}b")).unwrap();
    let status = client
        .provision(&a, &request(&["postgres", "redis"], &[]), READY)
        .await
        .unwrap();
    client
        .provision(&ab, &request(&["redis"], &[]), READY)
        .await
        .unwrap();
    let claimed = pool_containers(&env)
        .await
        .into_iter()
        .find(|c| c.name == format!("sandboxd.{}.{a}.postgres", env.deployment))
        .expect("a's postgres is a claimed pool container");
    let cold = env
        .containers(Some(&a))
        .await
        .into_iter()
        .find(|c| c.labels.engine == "redis")
        .expect("a's cold redis");
    // Why a label selector will not do: the claimed one has no sandbox label.
    let labelled: Vec<String> = env
        .containers(Some(&a))
        .await
        .into_iter()
        .map(|c| c.id.as_str().to_owned())
        .collect();
    assert!(
        !labelled.contains(&claimed.id.as_str().to_owned()),
        "the claimed container carries no io.sandboxd.sandbox label"
    );

    let selector = container_selector(&env.deployment, &a);
    let found = named(&env, &selector).await;
    let want = {
        let mut w = vec![
            (claimed.name.clone(), claimed.id.as_str().to_owned()),
            (cold.name.clone(), cold.id.as_str().to_owned()),
        ];
        w.sort();
        w
    };
    assert_eq!(
        found, want,
        "{selector} finds a's claimed postgres and cold redis, and nothing else (not ab's)"
    );
    let found_ab = named(&env, &container_selector(&env.deployment, &ab)).await;
    assert_eq!(found_ab.len(), 1, "ab's own redis only: {found_ab:?}");
    assert!(found_ab[0]
        .0
        .starts_with(&format!("sandboxd.{}.{ab}.", env.deployment)));
    // Unescaped, the same prefix would find ab's too: the escaping matters.
    let loose = named(&env, &format!("^sandboxd.{}.{a}.", env.deployment)).await;
    assert_eq!(loose.len(), 3, "{loose:?}");

    // `sandboxd describe` prints that selector.
    let out = std::process::Command::new(common::BIN)
        .args([
            "describe",
            a.as_str(),
            "--deployment",
            env.deployment.as_str(),
        ])
        .env("DATABASE_URL", &env.url)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("docker ps -a --filter 'name={selector}'")),
        "{text}"
    );
    assert_eq!(status.phase, Phase::Ready);
    controller.stop().await;
}

/// `docker rm -f` of a claimed pool container, again and again: each heal
/// (a claim or a cold create, whichever the pool allows) meets the name
/// still held for a moment and goes on; no reconcile fails.
#[tokio::test]
async fn a_claimed_container_force_removed_again_and_again_is_healed_each_time_without_a_reconcile_error(
) {
    use bollard::query_parameters::RemoveContainerOptionsBuilder;
    let env = TestEnv::new().await;
    let mut config = pooled(&env, &["postgres=1"]);
    config.relist_interval = Duration::from_secs(3600);
    let controller = env.start(config);
    pool_ready(&env, &controller, &["postgres"], 1.0).await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("poolrm");
    let before = client
        .provision(&id, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    let name = format!("sandboxd.{}.{id}.postgres", env.deployment);
    let force = RemoveContainerOptionsBuilder::default().force(true).build();
    let mut instance = before.services["postgres"].instance.clone();
    for round in 1..=3 {
        env.docker
            .remove_container(&name, Some(force.clone()))
            .await
            .unwrap();
        let after = eventually(
            "a healed, ready sandbox",
            Duration::from_secs(30),
            || async {
                let s = client.status(&id).await.unwrap()?;
                (s.phase == Phase::Ready && s.services["postgres"].instance != instance)
                    .then_some(s)
            },
        )
        .await;
        instance = after.services["postgres"].instance.clone();
        assert_eq!(
            after.services["postgres"].password, before.services["postgres"].password,
            "round {round}"
        );
        let mut conn = sqlx::PgConnection::connect(&host_pg_url(&after.services["postgres"]))
            .await
            .unwrap_or_else(|e| panic!("round {round}: the same credentials work: {e}"));
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(one, 1);
    }
    let events = client.events(&id, 100).await.unwrap();
    let failed: Vec<_> = events
        .iter()
        .filter(|e| e.reason == "reconcile_failed")
        .collect();
    assert!(failed.is_empty(), "no reconcile failed: {failed:#?}");
    let text = controller.metrics.render();
    assert_eq!(
        common::sample(
            &text,
            "controller_runtime_reconcile_errors_total{controller=\"sandbox\"}"
        ),
        Some(0.0),
        "no reconcile error at all"
    );
    controller.stop().await;
}
