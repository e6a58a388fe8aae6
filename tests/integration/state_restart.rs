//! The state Postgres restarted under a running controller (data and
//! address kept): the controller loses its connections and its lease,
//! stands by while the database is away, leads again once it is back, and
//! every sandbox is ready again, heals and new rows included.

use crate::common;

use bollard::query_parameters::KillContainerOptions;
use common::{eventually, free_port, request, sandbox_id, StateStorage, TestEnv};
use sandboxd::client::Client;
use sandboxd::domain::{Phase, SandboxId};
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

async fn ready(client: &Client, id: &SandboxId) -> Option<sandboxd::domain::SandboxStatus> {
    client
        .status(id)
        .await
        .ok()
        .flatten()
        .filter(|s| s.phase == Phase::Ready)
}

#[tokio::test]
async fn restarting_the_state_postgres_brings_every_sandbox_back_to_ready() {
    let env = TestEnv::new_with(StateStorage::Restartable { port: free_port() }).await;
    let mut config = env.config();
    config.relist_interval = Duration::from_secs(5);
    let relist = config.relist_interval;
    let controller = env.start_bounded(config).await;
    let client = Client::from_pool(env.pool.clone());
    let first = sandbox_id("restart");
    let before = client
        .provision(&first, &request(&["redis"], &[]), READY)
        .await
        .unwrap();

    env.restart_state_database();
    let back = tokio::time::Instant::now();
    // Whatever happened while the database was away is converged too: a
    // container dies, a row arrives.
    let victim = env.containers(Some(&first)).await.remove(0);
    env.docker
        .kill_container(victim.id.as_str(), None::<KillContainerOptions>)
        .await
        .unwrap();
    let second = sandbox_id("restart");
    eventually(
        "the new row is accepted",
        Duration::from_secs(30),
        || async { client.apply(&second, &request(&["redis"], &[])).await.ok() },
    )
    .await;

    let healed = eventually("the killed sandbox is ready again", READY, || async {
        ready(&client, &first)
            .await
            .filter(|s| s.services["redis"].heals > before.services["redis"].heals)
    })
    .await;
    assert_eq!(
        healed.services["redis"].password, before.services["redis"].password,
        "healed with the same credentials"
    );
    eventually("the new sandbox is ready", READY, || async {
        ready(&client, &second).await
    })
    .await;
    let took = back.elapsed();
    eprintln!(
        "every sandbox ready {took:?} after the state database came back (relist {relist:?})"
    );
    let leading = common::sample(&controller.metrics.render(), "sandboxd_leader");
    assert_eq!(leading, Some(1.0), "the controller leads again");
    controller.stop().await;
}
