//! The fixtures themselves: testcontainers starts the state Postgres from
//! the locally built engine image against this Docker engine (20.10 here).
//! Every integration test depends on this; this test says so first and
//! loudly if a testcontainers or bollard upgrade breaks it.

use crate::common;

use common::{StatePostgres, STATE_LABEL};
use sqlx::Connection;

#[tokio::test]
async fn testcontainers_starts_the_state_postgres_from_the_local_image_and_removes_it() {
    let state = StatePostgres::start().await;
    let id = state.id().to_owned();
    let mut conn = sqlx::PgConnection::connect(&state.url)
        .await
        .expect("connect to the state Postgres");
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(version.starts_with("17."), "{version}");
    // The controller's URL is an ordinary role owning its database; the
    // superuser is a separate URL.
    let (user, superuser, owner): (String, bool, String) = sqlx::query_as(
        "SELECT current_user::text, rolsuper, pg_get_userbyid(d.datdba)::text
         FROM pg_roles, pg_database d
         WHERE rolname = current_user AND d.datname = current_database()",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        (user.as_str(), superuser, owner.as_str()),
        ("sandboxd", false, "sandboxd")
    );
    let mut admin = sqlx::PgConnection::connect(&state.admin_url)
        .await
        .expect("connect as the superuser");
    let superuser: bool =
        sqlx::query_scalar("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert!(superuser);
    admin.close().await.unwrap();
    assert!(state.url.contains("@127.0.0.1:"), "{}", state.url);
    let inspect = std::process::Command::new("docker")
        .args([
            "inspect",
            "-f",
            &format!("{{{{index .Config.Labels \"{STATE_LABEL}\"}}}} {{{{json .HostConfig.PortBindings}}}}"),
            &id,
        ])
        .output()
        .unwrap();
    let inspect = String::from_utf8_lossy(&inspect.stdout);
    assert!(inspect.starts_with("true "), "{inspect}");
    assert!(
        inspect.contains("\"HostIp\":\"127.0.0.1\""),
        "published on loopback only: {inspect}"
    );
    conn.close().await.unwrap();

    drop(state);
    let gone = std::process::Command::new("docker")
        .args(["inspect", &id])
        .output()
        .unwrap();
    assert!(!gone.status.success(), "the container is removed on drop");
}
