//! The fixtures themselves: testcontainers starts a state Postgres of its
//! own from the locally built engine image against this Docker engine
//! (20.10 here), and the shared state Postgres hands each test a database
//! of its own. Every integration test depends on these; they say so first
//! and loudly if a testcontainers or bollard upgrade breaks them.

use crate::common;

use common::{StatePostgres, StateStorage, TestEnv, STATE_LABEL};
use sqlx::Connection;

#[tokio::test]
async fn testcontainers_starts_the_state_postgres_from_the_local_image_and_removes_it() {
    let state = StatePostgres::start_with(StateStorage::Tmpfs).await;
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

/// The owner of the current database and whether the current user is a
/// superuser, as `(user, superuser, owner)`.
async fn who(conn: &mut sqlx::PgConnection) -> (String, bool, String) {
    sqlx::query_as(
        "SELECT current_user::text, rolsuper, pg_get_userbyid(d.datdba)::text
         FROM pg_roles, pg_database d
         WHERE rolname = current_user AND d.datname = current_database()",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_shared_state_postgres_gives_each_test_a_migrated_database_of_its_own_and_drops_it() {
    let first = TestEnv::new().await;
    let second = TestEnv::new().await;
    let database = |url: &str| url.rsplit_once('/').unwrap().1.to_owned();
    let (one, two) = (database(&first.url), database(&second.url));
    assert_ne!(one, two, "each test has a database of its own");
    // Both on the one server, published on loopback only and labelled for
    // the clean-up.
    let server = |url: &str| {
        url.split_once('@')
            .unwrap()
            .1
            .rsplit_once('/')
            .unwrap()
            .0
            .to_owned()
    };
    assert_eq!(server(&first.url), server(&second.url));
    assert!(first.url.contains("@127.0.0.1:"), "{}", first.url);
    let empty = StatePostgres::start().await;
    let label = common::docker_ok(&[
        "inspect",
        "-f",
        &format!(
            "{{{{index .Config.Labels \"{STATE_LABEL}\"}}}} {{{{json .HostConfig.PortBindings}}}}"
        ),
        empty.id(),
    ]);
    assert!(label.starts_with("true "), "{label}");
    assert!(
        label.contains("\"HostIp\":\"127.0.0.1\""),
        "published on loopback only: {label}"
    );

    // The controller's role owns it, and is no superuser; the superuser's
    // URL reaches the same database.
    let mut conn = sqlx::PgConnection::connect(&first.url).await.unwrap();
    assert_eq!(
        who(&mut conn).await,
        ("sandboxd".to_owned(), false, "sandboxd".to_owned())
    );
    conn.close().await.unwrap();
    let mut admin = sqlx::PgConnection::connect(&first.admin_url).await.unwrap();
    let (_, superuser, _) = who(&mut admin).await;
    assert!(superuser);
    admin.close().await.unwrap();

    // Migrated, each with an identity of its own (a migration makes one).
    let identity = |env: &TestEnv| {
        let pool = env.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT state_id::text FROM sandbox_identity")
                .fetch_one(&pool)
                .await
                .expect("a migrated database has its identity")
        }
    };
    assert_ne!(identity(&first).await, identity(&second).await);

    // An empty one has no tables.
    let mut conn = sqlx::PgConnection::connect(&empty.url).await.unwrap();
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(tables, 0);
    assert_eq!(
        who(&mut conn).await,
        ("sandboxd".to_owned(), false, "sandboxd".to_owned())
    );
    conn.close().await.unwrap();

    // A test's database goes when it ends; the server stays for the others.
    let admin_url = second.admin_url.clone();
    drop(first);
    let mut admin = sqlx::PgConnection::connect(&admin_url).await.unwrap();
    let left: Vec<String> =
        sqlx::query_scalar("SELECT datname::text FROM pg_database WHERE datname = ANY($1)")
            .bind([one.clone(), two.clone()])
            .fetch_all(&mut admin)
            .await
            .unwrap();
    assert_eq!(left, [two]);
    admin.close().await.unwrap();
}
