//! The network comes back: a sandbox network removed out of band (every
//! container disconnected, then `docker network rm`) is created again by
//! the controller, woken by the removal, with its engines back on it under
//! their names, the agent attached again and the credentials unchanged
//! (real Docker, real Postgres).

use crate::common;

use bollard::query_parameters::InspectNetworkOptions;
use common::{eventually, exec_in, host_pg_url, request, sandbox_id, Agent, TestEnv};
use sandboxd::client::Client;
use sandboxd::domain::{Phase, SandboxStatus};
use sqlx::Connection;
use std::time::Duration;

/// The names of the containers on `network`, sorted; `None` if it does not
/// exist.
async fn members(env: &TestEnv, network: &str) -> Option<Vec<String>> {
    let info = env
        .docker
        .inspect_network(network, None::<InspectNetworkOptions>)
        .await
        .ok()?;
    let mut names: Vec<String> = info
        .containers
        .unwrap_or_default()
        .into_values()
        .filter_map(|c| c.name)
        .collect();
    names.sort();
    Some(names)
}

/// `docker CMD…`, which must succeed.
fn docker(args: &[&str]) {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The agent reaches Redis by its name with the published password, and
/// Postgres by its name on its port.
async fn agent_reaches_both(env: &TestEnv, agent: &Agent, status: &SandboxStatus) {
    let auth = format!(
        "REDISCLI_AUTH={}",
        status.services["redis"].password.expose()
    );
    let (code, out) = exec_in(env, &agent.0, "redis-cli -h redis ping", vec![auth]).await;
    assert_eq!((code, out.trim()), (0, "PONG"), "redis by its name");
    let (code, out) = exec_in(
        env,
        &agent.0,
        "getent hosts postgres && timeout 3 bash -c '</dev/tcp/postgres/5432' && echo connected",
        vec![],
    )
    .await;
    assert!(
        code == 0 && out.contains("connected"),
        "postgres by its name: {out}"
    );
}

#[tokio::test]
async fn docker_network_rm_of_a_sandbox_network_is_followed_by_its_recreation_with_the_engines_back_under_their_names(
) {
    let env = TestEnv::new().await;
    let mut config = env.config();
    // No relist within the test: the removal's event wakes the sandbox.
    config.relist_interval = Duration::from_secs(3600);
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("netrm");
    let agent = Agent::start(&format!("agent-{}", env.deployment));
    let mut req = request(&["postgres", "redis"], &[]);
    req.attach = vec![agent.0.clone()];
    let before = client
        .provision(&id, &req, Duration::from_secs(120))
        .await
        .expect("ready");
    let network = before
        .network
        .clone()
        .expect("the status names its network");
    agent_reaches_both(&env, &agent, &before).await;
    let on_it = members(&env, &network).await.expect("the network exists");
    assert_eq!(on_it.len(), 3, "two engines and the agent: {on_it:?}");

    // Out of band: everything off the network, then the network removed.
    for name in &on_it {
        docker(&["network", "disconnect", "-f", &network, name]);
    }
    docker(&["network", "rm", &network]);

    // It comes back with the same three on it.
    let back = eventually(
        "the network is back with the engines and the agent",
        Duration::from_secs(60),
        || async { members(&env, &network).await.filter(|m| m == &on_it) },
    )
    .await;
    assert_eq!(back, on_it);

    // Same credentials, same containers; the host ports Docker gave anew are
    // published, and they log in.
    let after = eventually(
        "the status publishes working host ports",
        Duration::from_secs(60),
        || async {
            let status = client.status(&id).await.unwrap()?;
            let url = host_pg_url(&status.services["postgres"]);
            let works =
                tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(&url))
                    .await
                    .is_ok_and(|c| c.is_ok());
            (status.phase == Phase::Ready && works).then_some(status)
        },
    )
    .await;
    for engine in ["postgres", "redis"] {
        let (b, a) = (&before.services[engine], &after.services[engine]);
        assert_eq!(a.password, b.password, "{engine}'s password");
        assert_eq!(a.instance, b.instance, "{engine}'s container");
    }
    agent_reaches_both(&env, &agent, &after).await;
    let metrics = controller.metrics.render();
    for line in [
        "sandboxd_networks_recreated_total 1",
        "sandboxd_network_reconnects_total 2",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    controller.stop().await;
}

#[tokio::test]
async fn a_relist_leaves_converged_sandboxes_alone_and_puts_back_an_engine_disconnected_out_of_band(
) {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.relist_interval = Duration::from_secs(2);
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let quiet = sandbox_id("quiet");
    let cut = sandbox_id("cut");
    for id in [&quiet, &cut] {
        client
            .provision(id, &request(&["redis"], &[]), Duration::from_secs(120))
            .await
            .expect("ready");
    }
    // Read back from Postgres and listed by Docker, both sandboxes are
    // judged converged: a relist reconciles neither.
    let converged = || {
        common::sample(
            &controller.metrics.render(),
            "sandboxd_relist_converged_sandboxes",
        )
    };
    eventually(
        "a relist finds both sandboxes converged",
        Duration::from_secs(30),
        || async { (converged() == Some(2.0)).then_some(()) },
    )
    .await;
    let before = client.status(&cut).await.unwrap().expect("a status");
    let network = before
        .network
        .clone()
        .expect("the status names its network");
    let on_it = members(&env, &network).await.expect("the network exists");
    assert_eq!(on_it.len(), 1, "the engine alone: {on_it:?}");

    // Out of band, with no event sandboxd listens to: the next relist sees
    // the engine off its network and puts it back under its name.
    docker(&["network", "disconnect", "-f", &network, &on_it[0]]);
    eventually(
        "the engine is back on its network",
        Duration::from_secs(30),
        || async { members(&env, &network).await.filter(|m| m == &on_it) },
    )
    .await;
    eventually(
        "both sandboxes are converged again",
        Duration::from_secs(30),
        || async { (converged() == Some(2.0)).then_some(()) },
    )
    .await;
    let after = client.status(&cut).await.unwrap().expect("a status");
    assert_eq!(after.phase, Phase::Ready);
    let (b, a) = (&before.services["redis"], &after.services["redis"]);
    assert_eq!(a.password, b.password, "same credentials");
    assert_eq!(a.instance, b.instance, "same container");
    assert!(
        controller
            .metrics
            .render()
            .contains("sandboxd_network_reconnects_total 1"),
        "one reconnect"
    );
    controller.stop().await;
}
