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

/// (what, INSERT statement, expected message fragments): rows that are
/// hostile in shape rather than in content.
const HOSTILE_ROWS: &[(&str, &str, &[&str])] = &[
    (
        "a two-dimensional services array",
        "INSERT INTO sandbox_desired (id, services) VALUES ('h', '{{postgres}}')",
        &["must be a one-dimensional list starting at index 1"],
    ),
    (
        "a services array starting at index 0",
        "INSERT INTO sandbox_desired (id, services) VALUES ('h', '[0:0]={postgres}')",
        &["must be a one-dimensional list starting at index 1"],
    ),
    (
        "a NULL service",
        "INSERT INTO sandbox_desired (id, services) VALUES ('h', '{postgres,NULL}')",
        &["contain NULL", "mongo, postgres, redis, valkey"],
    ),
    (
        "more services than there are engines",
        "INSERT INTO sandbox_desired (id, services) VALUES ('h', '{postgres,redis,valkey,mongo,postgres}')",
        &["list 5 entries, but there are only 4 engines"],
    ),
    (
        "expires_at infinity",
        "INSERT INTO sandbox_desired (id, services, expires_at) VALUES ('h', '{postgres}', 'infinity')",
        &["expires_at of sandbox h is infinity: use a finite time, or NULL"],
    ),
    (
        "expires_at -infinity",
        "INSERT INTO sandbox_desired (id, services, expires_at) VALUES ('h', '{postgres}', '-infinity')",
        &["expires_at of sandbox h is -infinity: use a finite time"],
    ),
    (
        "expires_at past what clients can decode",
        "INSERT INTO sandbox_desired (id, services, expires_at) VALUES ('h', '{postgres}', '200000-01-01')",
        &["past the year 9999"],
    ),
    (
        "17 features for one engine",
        r#"INSERT INTO sandbox_desired (id, services, features) VALUES ('h', '{postgres}',
           jsonb_build_object('postgres', (SELECT jsonb_agg(to_jsonb('pg_trgm'::text)) FROM generate_series(1, 17))))"#,
        &["list 17 entries: at most 16 features per engine are allowed"],
    ),
    (
        "a feature twice",
        r#"INSERT INTO sandbox_desired (id, services, features) VALUES ('h', '{postgres}', '{"postgres":["citext","pg_trgm","citext"]}')"#,
        &["name a feature twice: list each feature once"],
    ),
    (
        "an owner with an ANSI escape sequence",
        r"INSERT INTO sandbox_desired (id, owner, services) VALUES ('h', E'\x1b[31mred', '{postgres}')",
        &["without control characters"],
    ),
    (
        "an owner with a newline",
        r"INSERT INTO sandbox_desired (id, owner, services) VALUES ('h', E'me\nFAKE LOG LINE', '{postgres}')",
        &["without control characters"],
    ),
    (
        "an owner of 201 characters",
        "INSERT INTO sandbox_desired (id, owner, services) VALUES ('h', repeat('o', 201), '{postgres}')",
        &["at most 200 characters"],
    ),
    (
        "an attach name starting with a dash",
        "INSERT INTO sandbox_desired (id, services, attach) VALUES ('h', '{postgres}', '{-agent}')",
        &["invalid container name '-agent'", "starting with a letter or digit"],
    ),
    (
        "an attach name with a slash",
        "INSERT INTO sandbox_desired (id, services, attach) VALUES ('h', '{postgres}', '{a/b}')",
        &["invalid container name 'a/b'"],
    ),
    (
        "an attach name with an escape sequence",
        r"INSERT INTO sandbox_desired (id, services, attach) VALUES ('h', '{postgres}', ARRAY[E'a\x1b[2J'])",
        // Shown escaped, never raw.
        &[r#"invalid container name "a\u001b[2J""#],
    ),
    (
        "an attach name of 129 characters",
        "INSERT INTO sandbox_desired (id, services, attach) VALUES ('h', '{postgres}', ARRAY[repeat('a', 129)])",
        &["1 to 128 characters"],
    ),
    (
        "an empty attach name",
        "INSERT INTO sandbox_desired (id, services, attach) VALUES ('h', '{postgres}', '{\"\"}')",
        &["invalid container name ''"],
    ),
    (
        "a NULL attach name",
        "INSERT INTO sandbox_desired (id, services, attach) VALUES ('h', '{postgres}', '{agent,NULL}')",
        &["invalid container name NULL"],
    ),
    (
        "an attach name twice",
        "INSERT INTO sandbox_desired (id, services, attach) VALUES ('h', '{postgres}', '{agent,agent}')",
        &["names a container twice"],
    ),
    (
        "17 attach names",
        "INSERT INTO sandbox_desired (id, services, attach) VALUES ('h', '{postgres}',
           (SELECT array_agg('agent-' || i) FROM generate_series(1, 17) i))",
        &["lists 17 containers: at most 16 are allowed"],
    ),
    (
        "a two-dimensional attach array",
        "INSERT INTO sandbox_desired (id, services, attach) VALUES ('h', '{postgres}', '{{a},{b}}')",
        &["attach of sandbox h must be a one-dimensional list"],
    ),
    (
        "an id with an escape sequence",
        r"INSERT INTO sandbox_desired (id, services) VALUES (E'x\x1b[31m', '{postgres}')",
        &[r#"invalid sandbox id "x\u001b[31m""#],
    ),
];

#[tokio::test]
async fn hostile_shapes_are_rejected_with_a_message_naming_what_is_allowed() {
    let env = TestEnv::new().await;
    for (what, sql, fragments) in HOSTILE_ROWS {
        let err = sqlx::query(sql)
            .execute(&env.pool)
            .await
            .expect_err(&format!("{what} must be rejected"));
        let db = err.as_database_error().expect("a database error");
        assert_eq!(db.code().as_deref(), Some("23514"), "{what}: {db}");
        let message = db.message();
        assert!(
            !message.contains('\u{1b}') && !message.contains('\n'),
            "{what}: the message carries a control character: {message:?}"
        );
        for fragment in *fragments {
            assert!(
                message.contains(fragment),
                "{what}: message {message:?} lacks {fragment:?}"
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
async fn a_two_million_element_feature_array_is_refused() {
    let env = TestEnv::new().await;
    // The size is checked before any element is looked at (the trigger
    // once spent 24 s of CPU on this); timing is not asserted here.
    let err = sqlx::query(
        "INSERT INTO sandbox_desired (id, services, features)
         SELECT 'huge', '{postgres}', jsonb_build_object('postgres', jsonb_agg(to_jsonb('pg_trgm'::text)))
         FROM generate_series(1, 2000000)",
    )
    .execute(&env.pool)
    .await
    .expect_err("a 2,000,000-element feature array must be refused");
    let message = err.as_database_error().unwrap().message().to_owned();
    assert!(
        message.contains("list 2000000 entries: at most 16 features per engine"),
        "{message}"
    );
}

#[tokio::test]
async fn a_temporary_table_cannot_shadow_the_allowlist() {
    let env = TestEnv::new().await;
    // Temporary tables live in the session: one connection for all of it.
    let mut conn = env.pool.acquire().await.unwrap();
    for sql in [
        "CREATE TEMP TABLE sandbox_engine_features (engine text, feature text)",
        "INSERT INTO sandbox_engine_features VALUES ('postgres', 'plpython3u')",
        "CREATE TEMP TABLE sandbox_engines (engine text)",
        "INSERT INTO sandbox_engines VALUES ('oracle')",
    ] {
        sqlx::query(sql).execute(&mut *conn).await.unwrap();
    }
    let err = sqlx::query(
        r#"INSERT INTO sandbox_desired (id, services, features) VALUES ('t', '{postgres}', '{"postgres":["plpython3u"]}')"#,
    )
    .execute(&mut *conn)
    .await
    .expect_err("the temporary allowlist must not be consulted");
    let message = err.as_database_error().unwrap().message().to_owned();
    assert!(
        message.contains("feature 'plpython3u' is not allowed for engine 'postgres'")
            && message.contains("citext, pg_trgm, postgis, uuid-ossp, vector"),
        "{message}"
    );
    let err = sqlx::query("INSERT INTO sandbox_desired (id, services) VALUES ('t', '{oracle}')")
        .execute(&mut *conn)
        .await
        .expect_err("the temporary engine list must not be consulted");
    assert!(err.to_string().contains("unknown engine 'oracle'"), "{err}");
}

#[tokio::test]
async fn every_function_pins_its_search_path_with_pg_temp_last() {
    let env = TestEnv::new().await;
    let functions: Vec<(String, Option<Vec<String>>)> = sqlx::query_as(
        "SELECT p.proname::text, p.proconfig FROM pg_proc p
         WHERE p.pronamespace = 'public'::regnamespace ORDER BY 1",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert!(functions.len() >= 9, "{functions:?}");
    for (name, config) in functions {
        assert_eq!(
            config,
            Some(vec!["search_path=pg_catalog, public, pg_temp".to_owned()]),
            "{name}"
        );
    }
}

#[tokio::test]
async fn attach_is_part_of_the_generation_and_an_omitted_owner_is_the_inserting_role() {
    let env = TestEnv::new().await;
    let (generation, owner, attach): (i64, String, Vec<String>) = sqlx::query_as(
        "INSERT INTO sandbox_desired (id, services) VALUES ('a', '{redis}')
         RETURNING generation, owner, attach",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!((generation, owner.as_str()), (1, "sandboxd"));
    assert!(attach.is_empty());
    let generation: i64 = sqlx::query_scalar(
        "UPDATE sandbox_desired SET attach = '{agent-7,Agent_8.x}' WHERE id = 'a' RETURNING generation",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(generation, 2);
    let generation: i64 = sqlx::query_scalar(
        "UPDATE sandbox_desired SET attach = NULL, features = NULL WHERE id = 'a' RETURNING generation",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(generation, 3, "NULL attach means none");
}

#[test]
fn no_engine_allows_more_features_than_the_database_accepts_per_engine() {
    // The trigger refuses more than 16 features per engine (README).
    for engine in sandboxd::engine::REGISTRY.iter() {
        assert!(
            engine.allowed_features().len() <= 16,
            "{} allows {} features; raise the limit in a migration",
            engine.name(),
            engine.allowed_features().len()
        );
    }
}
