//! The database itself enforces the orchestrator contract.

mod common;

use common::TestEnv;
use sqlx::postgres::PgListener;
use std::time::Duration;

/// (id, services, features JSON, expected message fragments)
const BAD_ROWS: &[(&str, &str, &str, &[&str])] = &[
    (
        "bad-engine",
        // Engine names are lowercase letters and digits: this one can never
        // become an engine.
        "{no-such-engine}",
        "{}",
        &[
            "unknown engine 'no-such-engine'",
            "allowed engines are mongo, postgres, redis, valkey",
        ],
    ),
    (
        "no-services",
        "{}",
        "{}",
        &["requests no services", "mongo, postgres, redis, valkey"],
    ),
    ("dup", "{redis,redis}", "{}", &["name an engine twice"]),
    (
        "plpython",
        "{postgres}",
        r#"{"postgres":["plpython3u"]}"#,
        &[
            "feature 'plpython3u' is not allowed for engine 'postgres'",
            "citext, pg_trgm, postgis, uuid-ossp, vector",
        ],
    ),
    (
        "redis-bad",
        "{redis}",
        r#"{"redis":["timeseries"]}"#,
        &[
            "feature 'timeseries' is not allowed for engine 'redis'",
            "bloom, json, search",
        ],
    ),
    (
        "mongo-feature",
        "{mongo}",
        r#"{"mongo":["anything"]}"#,
        &[
            "not allowed for engine 'mongo'",
            "allowed features are (none)",
        ],
    ),
    (
        "unrequested",
        "{postgres}",
        r#"{"redis":["search"]}"#,
        &["name engine 'redis', which its services (postgres) do not request"],
    ),
    (
        "not-object",
        "{postgres}",
        r#"["pg_trgm"]"#,
        &["must be a JSON object mapping engine to an array of feature names"],
    ),
    (
        "not-array",
        "{postgres}",
        r#"{"postgres":"pg_trgm"}"#,
        &[
            "for engine 'postgres' must be a JSON array",
            "allowed features are",
        ],
    ),
    (
        "not-string",
        "{postgres}",
        r#"{"postgres":[42]}"#,
        &["must be strings, got 42"],
    ),
    (
        "",
        "{postgres}",
        "{}",
        &["invalid sandbox id ''", "1 to 63 characters"],
    ),
    (
        "this-id-is-much-too-long-for-a-container-name-and-the-contract-says-so",
        "{postgres}",
        "{}",
        &["invalid sandbox id", "1 to 63 characters"],
    ),
    ("Upper", "{postgres}", "{}", &["invalid sandbox id 'Upper'"]),
    ("semi;colon", "{postgres}", "{}", &["invalid sandbox id"]),
];

#[tokio::test]
async fn every_invalid_desired_row_is_rejected_with_a_message_naming_what_is_allowed() {
    let env = TestEnv::new().await;
    for (id, services, features, fragments) in BAD_ROWS {
        let err = sqlx::query(
            "INSERT INTO sandbox_desired (id, owner, services, features) VALUES ($1, 'test', $2::text[], $3::jsonb)",
        )
        .bind(id)
        .bind(services)
        .bind(features)
        .execute(&env.pool)
        .await
        .expect_err(&format!("row {id:?} {services} {features} must be rejected"));
        let message = err
            .as_database_error()
            .expect("a database error")
            .message()
            .to_owned();
        for fragment in *fragments {
            assert!(
                message.contains(fragment),
                "row {id:?}: message {message:?} lacks {fragment:?}"
            );
        }
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM sandbox_desired")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(count, 0);
}

#[tokio::test]
async fn valid_rows_are_accepted_and_generation_is_bumped_by_the_database_only_on_change() {
    let env = TestEnv::new().await;
    let gen: i64 = sqlx::query_scalar(
        r#"INSERT INTO sandbox_desired (id, owner, services, features, generation)
           VALUES ('agent-1', 'me', '{postgres,redis}', '{"postgres":["pg_trgm","citext"],"redis":["search"]}', 99)
           RETURNING generation"#,
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(gen, 1, "the orchestrator cannot choose the generation");

    let gen: i64 = sqlx::query_scalar(
        "UPDATE sandbox_desired SET services = '{postgres,redis,mongo}' WHERE id = 'agent-1' RETURNING generation",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(gen, 2);

    let gen: i64 = sqlx::query_scalar(
        "UPDATE sandbox_desired SET owner = owner, generation = 7 WHERE id = 'agent-1' RETURNING generation",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(gen, 2, "a no-op update does not bump the generation");
}

#[tokio::test]
async fn changes_to_desired_rows_notify_listeners_with_the_id() {
    let env = TestEnv::new().await;
    let mut listener = PgListener::connect_with(&env.pool).await.unwrap();
    listener.listen("sandbox_desired").await.unwrap();
    sqlx::query("INSERT INTO sandbox_desired (id, services) VALUES ('notify-me', '{redis}')")
        .execute(&env.pool)
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a NOTIFY within 5s")
        .unwrap();
    assert_eq!(n.payload(), "notify-me");
    sqlx::query("DELETE FROM sandbox_desired WHERE id = 'notify-me'")
        .execute(&env.pool)
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a NOTIFY for the delete")
        .unwrap();
    assert_eq!(n.payload(), "notify-me");
}
