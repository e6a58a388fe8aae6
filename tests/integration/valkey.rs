//! Valkey end to end: a row asking for valkey becomes ready with a password
//! that a real Redis-protocol client uses, on the Debian-built image.

use crate::common;

use common::{eventually, request, sandbox_id, TestEnv};
use sandboxd::client::Client;
use sandboxd::domain::Phase;
use std::time::Duration;

async fn connect(url: &str) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

#[tokio::test]
async fn a_valkey_row_becomes_ready_with_a_password_a_real_client_uses() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.images = common::test_images_with_valkey();
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("valkey");
    let status = client
        .provision(&id, &request(&["valkey"], &[]), Duration::from_secs(60))
        .await
        .expect("valkey sandbox ready");
    assert_eq!(status.phase, Phase::Ready);
    let v = &status.services["valkey"];
    assert_eq!(v.port, 6379);
    assert_eq!(v.user, "default");
    assert_eq!(v.password.expose().len(), 32);
    assert_eq!(v.env["SANDBOX_VALKEY_PASSWORD"], v.password.expose());
    assert_eq!(v.env["SANDBOX_VALKEY_HOST"], v.host);
    assert!(v.url.starts_with("redis://:"), "{}", v.url);

    // The published credentials work from the host.
    let good = format!(
        "redis://:{}@127.0.0.1:{}/0",
        v.password.expose(),
        v.host_port
    );
    let mut con = connect(&good).await.expect("login with the password");
    let () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut con)
        .await
        .unwrap();
    let got: String = redis::cmd("GET")
        .arg("k")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(got, "v");
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(info.contains("valkey_version:8."), "{info}");

    // Nothing gets in without it.
    let bad = format!("redis://:wrong@127.0.0.1:{}/0", v.host_port);
    assert!(connect(&bad).await.is_err(), "a wrong password is refused");
    let anonymous = format!("redis://127.0.0.1:{}/0", v.host_port);
    if let Ok(mut con) = connect(&anonymous).await {
        let ping: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut con).await;
        assert!(ping.is_err(), "no password, no PING");
    }

    client.release(&id).await.unwrap();
    eventually("valkey torn down", Duration::from_secs(30), || async {
        env.containers(Some(&id)).await.is_empty().then_some(())
    })
    .await;
    controller.stop().await;
}
