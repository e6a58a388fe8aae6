//! The state Postgres restarted, or away for a minute, under a running
//! controller (data and address kept): the controller loses its
//! connections and its lease, changes nothing in Docker while the
//! database is away, leads again once it is back, and every sandbox is
//! ready again, heals and new rows included.

use crate::common;

use bollard::query_parameters::KillContainerOptions;
use common::{eventually, free_port, request, sandbox_id, StateStorage, TestEnv};
use sandboxd::client::Client;
use sandboxd::domain::container::ContainerState;
use sandboxd::domain::{Phase, SandboxId, SandboxStatus};
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

async fn ready(client: &Client, id: &SandboxId) -> Option<SandboxStatus> {
    client
        .status(id)
        .await
        .ok()
        .flatten()
        .filter(|s| s.phase == Phase::Ready)
}

/// Waits until `id`'s redis, whose status was `before`, is ready again
/// with one more heal, and checks it kept its credentials.
async fn healed(client: &Client, id: &SandboxId, before: &SandboxStatus) {
    let healed = eventually("the killed sandbox is ready again", READY, || async {
        ready(client, id)
            .await
            .filter(|s| s.services["redis"].heals > before.services["redis"].heals)
    })
    .await;
    assert_eq!(
        healed.services["redis"].password, before.services["redis"].password,
        "healed with the same credentials"
    );
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

    healed(&client, &first, &before).await;
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

/// What the deployment's sandbox containers are: id and whether each runs.
async fn fleet(env: &TestEnv) -> Vec<(String, bool)> {
    let mut all: Vec<(String, bool)> = (env.containers(None).await.into_iter())
        .map(|c| (c.id.as_str().to_owned(), c.state == ContainerState::Running))
        .collect();
    all.sort();
    all
}

/// The state database away for a minute (stopped: its address refuses):
/// once the lease's trust has run out, nothing of Docker changes, not
/// even the container killed meanwhile; within 5 s of the database's
/// return that container is healed with the same credentials, and the
/// requests written just before it went and just after it came back are
/// both served.
#[tokio::test]
async fn a_state_database_away_for_a_minute_touches_nothing_and_heals_within_seconds_of_its_return()
{
    let env = TestEnv::new_with(StateStorage::Restartable { port: free_port() }).await;
    let mut config = env.config();
    config.relist_interval = Duration::from_secs(5);
    let lease = config.lease.duration;
    let controller = env.start_bounded(config).await;
    let client = Client::from_pool(env.pool.clone());
    let victim = sandbox_id("away");
    let before = client
        .provision(&victim, &request(&["redis"], &[]), READY)
        .await
        .unwrap();
    let early = sandbox_id("away");
    client
        .apply(&early, &request(&["redis"], &[]))
        .await
        .unwrap();

    env.stop_state_database();
    let gone = tokio::time::Instant::now();
    let killed = env.containers(Some(&victim)).await.remove(0);
    env.docker
        .kill_container(killed.id.as_str(), None::<KillContainerOptions>)
        .await
        .unwrap();
    // Past the lease (what the controller may still do on its trust):
    // from then on, nothing changes.
    tokio::time::sleep(lease + Duration::from_secs(5)).await;
    let settled = fleet(&env).await;
    assert!(
        settled
            .iter()
            .any(|(id, running)| id == killed.id.as_str() && !running),
        "the killed container stays as it is: {settled:?}"
    );
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(gone.elapsed())).await;
    assert_eq!(
        fleet(&env).await,
        settled,
        "no container touched while the database was away"
    );

    env.start_state_database();
    eventually(
        "the state database answers",
        Duration::from_secs(30),
        || async { sqlx::query("SELECT 1").execute(&env.pool).await.ok() },
    )
    .await;
    let back = tokio::time::Instant::now();
    let late = sandbox_id("away");
    client
        .apply(&late, &request(&["redis"], &[]))
        .await
        .unwrap();
    healed(&client, &victim, &before).await;
    let took = back.elapsed();
    assert!(
        took <= Duration::from_secs(5),
        "healed {took:?} after the database came back (at most 5 s)"
    );
    for id in [&early, &late] {
        eventually(
            "the requests around the outage are served",
            READY,
            || async { ready(&client, id).await },
        )
        .await;
    }
    eprintln!("healed {took:?} after the state database came back from a minute away");
    controller.stop().await;
}
