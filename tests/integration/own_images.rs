//! sandboxd's own images (`sandboxd/…`) are built on this host and never
//! pulled (issue 29, hole 6): anyone may publish under that name on Docker
//! Hub, and a pulled image would carry whatever labels its author chose.

use crate::common;

use common::{docker_ok, eventually, request, sandbox_id, total, TestEnv};
use sandboxd::client::Client;
use sandboxd::config::Images;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

#[tokio::test]
async fn an_absent_own_image_is_never_pulled_and_the_status_says_how_to_build_it() {
    let env = TestEnv::new().await;
    let image = format!("sandboxd/absent-{}:1", env.deployment);
    let mut config = env.config();
    config.images = Images::new(&[format!("redis={image}")], &[]).unwrap();
    config.image_build_command = None;
    let since = unix_now();
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("own");
    client.apply(&id, &request(&["redis"], &[])).await.unwrap();

    let status = eventually(
        "the status to say the image is built here, never pulled",
        Duration::from_secs(60),
        || async {
            client
                .status(&id)
                .await
                .unwrap()
                .filter(|s| s.message.contains("never pulled from a registry"))
        },
    )
    .await;
    assert!(status.message.contains(&image), "{}", status.message);
    assert!(
        status.message.contains("deploy/images/build.sh"),
        "{}",
        status.message
    );

    // No pull was attempted: sandboxd counted none, and the engine saw none.
    let metrics = controller.metrics.render();
    assert_eq!(
        total(&metrics, "sandboxd_image_pulls_total"),
        0.0,
        "no pull of an own image:\n{metrics}"
    );
    let events = docker_ok(&[
        "events",
        "--since",
        &since.to_string(),
        "--until",
        &(unix_now() + 1).to_string(),
        "--filter",
        "type=image",
        "--format",
        "{{.Action}} {{.Actor.ID}}",
    ]);
    assert!(
        !events.lines().any(|l| l.contains(&image)),
        "the engine saw image events for {image}:\n{events}"
    );
    controller.stop().await;
}
