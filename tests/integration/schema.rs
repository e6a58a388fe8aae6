//! The database itself enforces the orchestrator contract.

use crate::common;

use chrono::{DateTime, Utc};
use common::{hold_lease, TestEnv};
use sqlx::postgres::PgListener;
use std::collections::BTreeSet;
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
        assert_mentions(&format!("row {id:?}"), &message, fragments);
    }
    assert_no_desired_rows(&env.pool).await;
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
async fn changes_to_desired_rows_notify_listeners_with_the_incarnation_never_the_id() {
    let env = TestEnv::new().await;
    let mut listener = PgListener::connect_with(&env.pool).await.unwrap();
    listener.listen("sandbox_desired").await.unwrap();
    let incarnation: String = sqlx::query_scalar(
        "INSERT INTO sandbox_desired (id, services) VALUES ('notify-me', '{redis}')
         RETURNING incarnation::text",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a NOTIFY within 5s")
        .unwrap();
    assert_eq!(n.payload(), incarnation);
    sqlx::query("DELETE FROM sandbox_desired WHERE id = 'notify-me'")
        .execute(&env.pool)
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a NOTIFY for the delete")
        .unwrap();
    assert_eq!(n.payload(), incarnation);
    // The deleted row's tombstone keeps it: the controller finds the id there.
    assert_eq!(
        scalar::<String>(
            &env.pool,
            &format!("SELECT id FROM sandbox_released WHERE incarnation = '{incarnation}'")
        )
        .await,
        "notify-me"
    );
}

#[tokio::test]
async fn a_truncate_of_either_table_notifies_its_channel_with_a_payload_that_is_no_id() {
    let env = TestEnv::new().await;
    let mut listener = PgListener::connect_with(&env.pool).await.unwrap();
    listener
        .listen_all(["sandbox_desired", "sandbox_status"])
        .await
        .unwrap();
    for table in ["sandbox_desired", "sandbox_status"] {
        sqlx::query(&format!("TRUNCATE {table}"))
            .execute(&env.pool)
            .await
            .unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
            .await
            .unwrap_or_else(|_| panic!("a NOTIFY for TRUNCATE {table} within 5s"))
            .unwrap();
        assert_eq!((n.channel(), n.payload()), (table, "*"));
    }
    assert!(sandboxd::domain::SandboxId::parse("*").is_err());
    let public_may_execute: bool = sqlx::query_scalar(
        "SELECT has_function_privilege('public', 'sandbox_notify_truncate()', 'EXECUTE')",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(!public_may_execute, "EXECUTE is revoked from PUBLIC");
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
        assert_mentions(what, message, fragments);
    }
    assert_no_desired_rows(&env.pool).await;
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
    // The trigger refuses more than 16 features per engine (docs/contract.md).
    for engine in sandboxd::engine::REGISTRY.iter() {
        assert!(
            engine.allowed_features().len() <= 16,
            "{} allows {} features; raise max_features in sql/functions/sandbox_desired_validate.sql and sandbox_request.sql",
            engine.name(),
            engine.allowed_features().len()
        );
    }
}

// The lifecycle columns, the request verb, touch and release
// (sql/functions/sandbox_desired_validate_lifecycle.sql, sandbox_request.sql,
// sandbox_touch.sql, sandbox_release.sql).

/// Runs `sql` as `pool` and returns the error's SQLSTATE and message.
async fn refusal(pool: &sqlx::PgPool, sql: &str) -> (String, String) {
    let err = sqlx::query(sql)
        .execute(pool)
        .await
        .expect_err(&format!("{sql} must be refused"));
    let db = err.as_database_error().expect("a database error");
    (
        db.code().map(|c| c.into_owned()).unwrap_or_default(),
        db.message().to_owned(),
    )
}

/// (what, statement, expected message fragments): values of the lifecycle
/// columns that are refused.
const BAD_LIFECYCLE_VALUES: &[(&str, &str, &[&str])] = &[
    (
        "an owner_container starting with a dash",
        "INSERT INTO sandbox_desired (id, services, owner_container) VALUES ('l', '{redis}', '-agent')",
        &["invalid owner_container '-agent' of sandbox l", "or NULL for none"],
    ),
    (
        "an empty owner_container",
        "INSERT INTO sandbox_desired (id, services, owner_container) VALUES ('l', '{redis}', '')",
        &["invalid owner_container ''"],
    ),
    (
        "an owner_container with a slash",
        "INSERT INTO sandbox_desired (id, services, owner_container) VALUES ('l', '{redis}', 'a/b')",
        &["invalid owner_container 'a/b'"],
    ),
    (
        "an owner_container with an escape sequence",
        r"INSERT INTO sandbox_desired (id, services, owner_container) VALUES ('l', '{redis}', E'a\x1b[2J')",
        &[r#"invalid owner_container "a\u001b[2J""#],
    ),
    (
        "an owner_container of 129 characters",
        "INSERT INTO sandbox_desired (id, services, owner_container) VALUES ('l', '{redis}', repeat('a', 129))",
        &["1 to 128 characters"],
    ),
    (
        "a negative idle_timeout",
        "INSERT INTO sandbox_desired (id, services, idle_timeout) VALUES ('l', '{redis}', '-1 second')",
        &["idle_timeout of sandbox l is -00:00:01", "from 0 (never idle-released) to 365 days"],
    ),
    (
        "an idle_timeout that is negative only once months are counted",
        "INSERT INTO sandbox_desired (id, services, idle_timeout) VALUES ('l', '{redis}', '1 day -1 mon')",
        &["from 0 (never idle-released) to 365 days"],
    ),
    (
        "an idle_timeout of 366 days",
        "INSERT INTO sandbox_desired (id, services, idle_timeout) VALUES ('l', '{redis}', '366 days')",
        &["idle_timeout of sandbox l is 366 days", "or NULL for the controller's default (--idle-timeout)"],
    ),
    (
        "an idle_timeout of 13 months",
        "INSERT INTO sandbox_desired (id, services, idle_timeout) VALUES ('l', '{redis}', '13 mons')",
        &["to 365 days"],
    ),
    (
        "a NULL persistent",
        "INSERT INTO sandbox_desired (id, services, persistent) VALUES ('l', '{redis}', NULL)",
        &["persistent of sandbox l is NULL: use true"],
    ),
];

#[tokio::test]
async fn lifecycle_values_that_cannot_work_are_refused_with_messages_that_say_what_to_do() {
    let env = TestEnv::new().await;
    let mut cases: Vec<(&str, String, Vec<&str>)> = BAD_LIFECYCLE_VALUES
        .iter()
        .map(|(what, sql, fragments)| (*what, (*sql).to_owned(), fragments.to_vec()))
        .collect();
    // Infinite intervals exist from Postgres 17 on.
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    if version >= 170000 {
        for value in ["infinity", "-infinity"] {
            cases.push((
                "an infinite idle_timeout",
                format!("INSERT INTO sandbox_desired (id, services, idle_timeout) VALUES ('l', '{{redis}}', '{value}')"),
                vec!["to 365 days"],
            ));
        }
    }
    for (what, sql, fragments) in cases {
        let (code, message) = refusal(&env.pool, &sql).await;
        assert_eq!(code, "23514", "{what}: {message}");
        assert_mentions(what, &message, &fragments);
    }
    assert_no_desired_rows(&env.pool).await;
}

#[tokio::test]
async fn idle_timeouts_from_zero_to_a_year_are_stored_as_plain_durations() {
    let env = TestEnv::new().await;
    for (given, stored) in [
        ("0", "00:00:00"),
        ("30 minutes", "00:30:00"),
        ("1 day", "24:00:00"),
        ("1 mon", "720:00:00"),
        ("365 days", "8760:00:00"),
        ("1.5 seconds", "00:00:01.5"),
    ] {
        let text: String = sqlx::query_scalar(
            "INSERT INTO sandbox_desired (id, services, idle_timeout) VALUES ('i', '{redis}', $1::interval)
             RETURNING idle_timeout::text",
        )
        .bind(given)
        .fetch_one(&env.pool)
        .await
        .unwrap_or_else(|e| panic!("idle_timeout {given}: {e}"));
        assert_eq!(text, stored, "{given}");
        sqlx::query("DELETE FROM sandbox_desired")
            .execute(&env.pool)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn persistent_and_the_id_cannot_change_and_the_message_says_to_release_and_request_again() {
    let env = TestEnv::new().await;
    sqlx::query(
        "INSERT INTO sandbox_desired (id, services, persistent) VALUES ('p', '{redis}', true)",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let (code, message) = refusal(
        &env.pool,
        "UPDATE sandbox_desired SET persistent = false WHERE id = 'p'",
    )
    .await;
    assert_eq!(code, "23514");
    assert!(
        message.contains("persistent of sandbox p cannot change (it is true)")
            && message.contains("release the sandbox")
            && message.contains("request it again with persistent = false"),
        "{message}"
    );
    let (code, message) = refusal(&env.pool, "UPDATE sandbox_desired SET id = 'q'").await;
    assert_eq!(code, "23514");
    assert!(
        message.contains("the id of sandbox p cannot change"),
        "{message}"
    );
    // Writing the same value is no change.
    let generation: i64 = sqlx::query_scalar(
        "UPDATE sandbox_desired SET persistent = true WHERE id = 'p' RETURNING generation",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(generation, 1);
}

/// The row's generation, last_used_at and updated_at.
async fn clock_of(pool: &sqlx::PgPool, id: &str) -> (i64, DateTime<Utc>, DateTime<Utc>) {
    sqlx::query_as("SELECT generation, last_used_at, updated_at FROM sandbox_desired WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn scalar<T>(pool: &sqlx::PgPool, sql: &str) -> T
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

#[tokio::test]
async fn a_touch_keeps_the_generation_a_request_always_bumps_it_and_an_unchanged_upsert_does_not() {
    let env = TestEnv::new().await;
    let pool = &env.pool;
    assert_eq!(
        scalar::<i64>(pool, "SELECT sandbox_request('g', NULL, '{redis}')").await,
        1
    );
    let (generation, used, updated) = clock_of(pool, "g").await;
    assert_eq!(generation, 1);

    // Touch: last_used_at moves, nothing else.
    assert!(scalar::<bool>(pool, "SELECT sandbox_touch('g')").await);
    let (generation, touched, updated_after_touch) = clock_of(pool, "g").await;
    assert_eq!(generation, 1);
    assert!(touched > used, "{touched} > {used}");
    assert_eq!(updated_after_touch, updated);
    assert!(!scalar::<bool>(pool, "SELECT sandbox_touch('nosuch')").await);

    // A request always makes a new generation, even for what the row has.
    assert_eq!(
        scalar::<i64>(pool, "SELECT sandbox_request('g', NULL, '{redis}')").await,
        2
    );
    assert_eq!(
        scalar::<i64>(pool, "SELECT sandbox_request('g', NULL, NULL)").await,
        3
    );
    let (_, requested, _) = clock_of(pool, "g").await;
    assert!(requested > touched, "a request is a use");

    // The declarative upsert of what the row already asks changes nothing.
    let upsert =
        "INSERT INTO sandbox_desired (id, services, idle_timeout, persistent, owner_container)
                  VALUES ('g', '{redis}', NULL, false, NULL)
                  ON CONFLICT (id) DO UPDATE SET services = EXCLUDED.services,
                      idle_timeout = EXCLUDED.idle_timeout, persistent = EXCLUDED.persistent,
                      owner_container = EXCLUDED.owner_container
                  RETURNING generation";
    assert_eq!(scalar::<i64>(pool, upsert).await, 3);

    // idle_timeout, owner_container and requested_at are part of the generation.
    for (sql, expected) in [
        ("UPDATE sandbox_desired SET idle_timeout = '30 min' RETURNING generation", 4),
        ("UPDATE sandbox_desired SET idle_timeout = '1800 s' RETURNING generation", 4),
        ("UPDATE sandbox_desired SET owner_container = 'agent-7' RETURNING generation", 5),
        ("UPDATE sandbox_desired SET owner_container = 'agent-7' RETURNING generation", 5),
        ("UPDATE sandbox_desired SET requested_at = '2000-01-01' RETURNING generation", 6),
        // Several columns at once: one bump.
        ("UPDATE sandbox_desired SET services = '{redis,postgres}', idle_timeout = NULL RETURNING generation", 7),
    ] {
        assert_eq!(scalar::<i64>(pool, sql).await, expected, "{sql}");
    }
    // requested_at only moves forward, to the time of the write.
    assert!(
        scalar::<bool>(
            pool,
            "SELECT requested_at > now() - interval '1 minute' FROM sandbox_desired"
        )
        .await,
        "a requested_at in the past is replaced by the time of the write"
    );

    // last_used_at: never in the future, never backwards.
    let (_, before, _) = clock_of(pool, "g").await;
    assert!(
        scalar::<bool>(
            pool,
            "UPDATE sandbox_desired SET last_used_at = now() + interval '1 day' RETURNING last_used_at <= now()"
        )
        .await
    );
    let (generation, clamped, _) = clock_of(pool, "g").await;
    assert_eq!(generation, 7, "last_used_at is not part of the generation");
    assert!(clamped >= before);
    sqlx::query("UPDATE sandbox_desired SET last_used_at = '2000-01-01'")
        .execute(pool)
        .await
        .unwrap();
    let (_, after, _) = clock_of(pool, "g").await;
    assert_eq!(after, clamped, "last_used_at never goes backwards");
    // An insert's last_used_at is the time of the insert.
    assert!(
        scalar::<bool>(
            pool,
            "INSERT INTO sandbox_desired (id, services, last_used_at) VALUES ('h', '{redis}', '2000-01-01')
             RETURNING last_used_at = now()"
        )
        .await
    );
}

#[tokio::test]
async fn desired_notifications_fire_on_insert_delete_and_a_new_generation_only() {
    let env = TestEnv::new().await;
    let pool = &env.pool;
    let mut listener = PgListener::connect_with(pool).await.unwrap();
    listener.listen("sandbox_desired").await.unwrap();
    async fn next(listener: &mut PgListener, within: Duration) -> Option<String> {
        tokio::time::timeout(within, listener.recv())
            .await
            .ok()
            .map(|n| n.unwrap().payload().to_owned())
    }
    let quiet = Duration::from_millis(700);
    let loud = Duration::from_secs(5);

    scalar::<i64>(pool, "SELECT sandbox_request('n', NULL, '{redis}')").await;
    let n = scalar::<String>(
        pool,
        "SELECT incarnation::text FROM sandbox_desired WHERE id = 'n'",
    )
    .await;
    assert_eq!(
        next(&mut listener, loud).await.as_deref(),
        Some(n.as_str()),
        "insert"
    );
    for sql in [
        "SELECT sandbox_touch('n')",
        "UPDATE sandbox_desired SET last_used_at = now()",
        "UPDATE sandbox_desired SET services = services, idle_timeout = idle_timeout",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
        assert_eq!(
            next(&mut listener, quiet).await,
            None,
            "{sql} must not notify"
        );
    }
    for sql in [
        "UPDATE sandbox_desired SET idle_timeout = '1 hour'",
        "SELECT sandbox_request('n', NULL, NULL)",
        "SELECT sandbox_release('n')",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
        assert_eq!(
            next(&mut listener, loud).await.as_deref(),
            Some(n.as_str()),
            "{sql}"
        );
    }
    assert_eq!(
        next(&mut listener, quiet).await,
        None,
        "one notification each"
    );
}

#[tokio::test]
async fn the_relists_status_listing_carries_no_password_url_or_environment_and_everything_else_unchanged(
) {
    use sandboxd::adapters::PgStore;
    use sandboxd::ports::store::Store;
    let env = TestEnv::new().await;
    let term = hold_lease(&env.pool).await;
    let entry = |engine: &str| {
        serde_json::json!({
            "host": engine, "port": 5432, "host_port": 40000, "user": "sandbox",
            "password": format!("{engine}-hunter2-secret"), "database": "sandbox",
            "url": format!("postgres://sandbox:{engine}-hunter2-secret@{engine}:5432/sandbox"),
            "env": {"SANDBOX_PG_PASSWORD": format!("{engine}-hunter2-secret")},
            "available_extensions": ["citext"], "instance": "abc", "heals": 2
        })
    };
    let services = serde_json::json!({"postgres": entry("postgres"), "redis": entry("redis")});
    for (id, services) in [("two", services), ("none", serde_json::json!({}))] {
        // A status holds credentials only for its row's incarnation.
        sqlx::query("INSERT INTO sandbox_desired (id, services) VALUES ($1, '{postgres,redis}')")
            .bind(id)
            .execute(&env.pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO sandbox_status (id, phase, services, network, incarnation, leader_term)
             VALUES ($1, 'ready', $2, 'net', (SELECT incarnation FROM sandbox_desired WHERE id = $1), $3)",
        )
        .bind(id)
        .bind(services)
        .bind(term)
        .execute(&env.pool)
        .await
        .unwrap();
    }
    let store = PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY);
    let whole = store.list_status().await.unwrap();
    let redacted = store.list_status_redacted().await.unwrap();
    assert_eq!(redacted.len(), 2);
    assert!(
        !format!(
            "{:?}",
            redacted
                .iter()
                .map(|s| serde_json::to_string(&s.services).unwrap())
                .collect::<Vec<_>>()
        )
        .contains("hunter2"),
        "the redacted listing carries a secret: {redacted:?}"
    );
    for (whole, redacted) in whole.iter().zip(&redacted) {
        assert_eq!(&whole.redacted(), redacted);
    }
    let two = &whole[1];
    assert_eq!(two.id.as_str(), "two");
    assert_eq!(
        two.services["redis"].password.expose(),
        "redis-hunter2-secret"
    );
    assert_eq!(redacted[1].services["redis"].heals, 2);
}

#[tokio::test]
async fn the_healing_phase_is_accepted_in_statuses_and_an_unknown_phase_is_not() {
    let env = TestEnv::new().await;
    let term = hold_lease(&env.pool).await;
    for phase in [
        "pending",
        "provisioning",
        "healing",
        "ready",
        "failed",
        "terminating",
    ] {
        sqlx::query("INSERT INTO sandbox_status (id, phase, leader_term) VALUES ($1, $1, $2)")
            .bind(phase)
            .bind(term)
            .execute(&env.pool)
            .await
            .unwrap_or_else(|e| panic!("phase {phase}: {e}"));
    }
    let (code, _) = refusal(
        &env.pool,
        "INSERT INTO sandbox_status (id, phase, leader_term) VALUES ('x', 'sleeping', (SELECT term FROM sandbox_leader))",
    )
    .await;
    assert_eq!(code, "23514");
}

#[tokio::test]
async fn a_request_adds_services_features_and_attach_and_never_removes_any() {
    let env = TestEnv::new().await;
    let pool = &env.pool;
    for sql in [
        r#"SELECT sandbox_request('u', 'me', '{postgres}', '{"postgres":["pg_trgm"]}')"#,
        r#"SELECT sandbox_request('u', 'me', '{redis,postgres}', '{"postgres":["pg_trgm","citext"],"redis":["search"]}',
                                 p_attach => '{agent-b,agent-a}')"#,
        r#"SELECT sandbox_request('u', NULL, '{valkey}', p_attach => '{agent-a,agent-c}',
                                 p_idle_timeout => '10 min', p_owner_container => 'agent-a')"#,
        // Nothing new: everything stays.
        "SELECT sandbox_request('u', NULL, '{redis}')",
    ] {
        sqlx::query(sql)
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    type Row = (
        String,
        Vec<String>,
        serde_json::Value,
        Vec<String>,
        Option<String>,
        Option<String>,
        bool,
        i64,
    );
    let row: Row = sqlx::query_as(
        "SELECT owner, services, features, attach, idle_timeout::text, owner_container, persistent, generation
         FROM sandbox_desired WHERE id = 'u'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        row,
        (
            "me".to_owned(),
            vec!["postgres".to_owned(), "redis".into(), "valkey".into()],
            serde_json::json!({"postgres": ["citext", "pg_trgm"], "redis": ["search"]}),
            vec!["agent-b".to_owned(), "agent-a".into(), "agent-c".into()],
            Some("00:10:00".to_owned()),
            Some("agent-a".to_owned()),
            false,
            4,
        )
    );
    // An owner of its own, by default the calling role.
    let owner: String = scalar(pool, "SELECT owner FROM sandbox_desired WHERE id = 'u'").await;
    assert_eq!(owner, "me");
    scalar::<i64>(pool, "SELECT sandbox_request('v', NULL, '{redis}')").await;
    let owner: String = scalar(pool, "SELECT owner FROM sandbox_desired WHERE id = 'v'").await;
    assert_eq!(owner, "sandboxd");
}

/// (what, statement, SQLSTATE, expected message fragments): requests that
/// are refused, against the row `r` (redis, owner `me`, not persistent)
/// and the expired row `x`.
const BAD_REQUESTS: &[(&str, &str, &str, &[&str])] = &[
    (
        "another owner",
        "SELECT sandbox_request('r', 'someone-else', '{redis}')",
        "42501",
        &["sandbox r belongs to another owner", "without an owner"],
    ),
    (
        "another persistence",
        "SELECT sandbox_request('r', NULL, '{redis}', p_persistent => true)",
        "23514",
        &["sandbox r is not persistent and persistent cannot change", "release it"],
    ),
    (
        "an expired row",
        "SELECT sandbox_request('x', NULL, '{redis}')",
        "23514",
        &["sandbox x expired at", "set a later expires_at", "release it"],
    ),
    (
        "an unknown engine",
        "SELECT sandbox_request('r', NULL, '{oracle}')",
        "23514",
        &["unknown engine 'oracle'", "allowed engines are mongo, postgres, redis, valkey"],
    ),
    (
        "a feature outside the allowlist",
        r#"SELECT sandbox_request('r', NULL, '{postgres}', '{"postgres":["plpython3u"]}')"#,
        "23514",
        &["feature 'plpython3u' is not allowed for engine 'postgres'"],
    ),
    (
        "a feature for an engine the row does not request",
        r#"SELECT sandbox_request('r', NULL, NULL, '{"postgres":["pg_trgm"]}')"#,
        "23514",
        &["which its services (redis) do not request"],
    ),
    (
        "a new row without services",
        "SELECT sandbox_request('new', NULL, '{}')",
        "23514",
        &["sandbox new requests no services"],
    ),
    (
        "an invalid id",
        r"SELECT sandbox_request(E'x\x1b[31m', NULL, '{redis}')",
        "23514",
        &[r#"invalid sandbox id "x\u001b[31m""#],
    ),
    (
        "a two-dimensional services array",
        "SELECT sandbox_request('r', NULL, '{{postgres}}')",
        "23514",
        &["must be a one-dimensional list starting at index 1"],
    ),
    (
        "more services than there are engines",
        "SELECT sandbox_request('r', NULL, '{redis,redis,redis,redis,redis}')",
        "23514",
        &["list 5 entries, but there are only 4 engines"],
    ),
    (
        "a NULL service",
        "SELECT sandbox_request('r', NULL, '{postgres,NULL}')",
        "23514",
        &["contain NULL"],
    ),
    (
        "features that are not an object",
        r#"SELECT sandbox_request('r', NULL, '{redis}', '["search"]')"#,
        "23514",
        &["must be a JSON object mapping engine to an array of feature names"],
    ),
    (
        "features that are not strings",
        r#"SELECT sandbox_request('r', NULL, '{redis}', '{"redis":[1]}')"#,
        "23514",
        &["must be strings"],
    ),
    (
        "17 features for one engine",
        r#"SELECT sandbox_request('r', NULL, '{redis}',
               jsonb_build_object('redis', (SELECT jsonb_agg(to_jsonb('search'::text)) FROM generate_series(1, 17))))"#,
        "23514",
        &["list 17 entries: at most 16 features per engine"],
    ),
    (
        "17 containers to attach",
        "SELECT sandbox_request('r', NULL, NULL, p_attach => (SELECT array_agg('agent-' || i) FROM generate_series(1, 17) i))",
        "23514",
        &["lists 17 containers: at most 16 are allowed"],
    ),
    (
        "a NULL container to attach",
        "SELECT sandbox_request('r', NULL, NULL, p_attach => '{agent,NULL}')",
        "23514",
        &["invalid container name NULL"],
    ),
    (
        "a negative idle timeout",
        "SELECT sandbox_request('r', NULL, NULL, p_idle_timeout => '-5 min')",
        "23514",
        &["idle_timeout of sandbox r is -00:05:00"],
    ),
    (
        "an invalid owner container",
        "SELECT sandbox_request('r', NULL, NULL, p_owner_container => 'no spaces')",
        "23514",
        &["invalid owner_container 'no spaces'"],
    ),
];

#[tokio::test]
async fn requests_that_cannot_be_served_are_refused_and_change_nothing() {
    let env = TestEnv::new().await;
    let pool = &env.pool;
    scalar::<i64>(pool, "SELECT sandbox_request('r', 'me', '{redis}')").await;
    scalar::<i64>(pool, "SELECT sandbox_request('x', 'me', '{redis}')").await;
    sqlx::query(
        "UPDATE sandbox_desired SET expires_at = now() - interval '1 minute' WHERE id = 'x'",
    )
    .execute(pool)
    .await
    .unwrap();
    let before: Vec<(String, i64)> =
        sqlx::query_as("SELECT id, generation FROM sandbox_desired ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    for (what, sql, sqlstate, fragments) in BAD_REQUESTS {
        let (code, message) = refusal(pool, sql).await;
        assert_eq!(&code, sqlstate, "{what}: {message}");
        assert_mentions(what, &message, fragments);
    }
    let after: Vec<(String, i64)> =
        sqlx::query_as("SELECT id, generation FROM sandbox_desired ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(after, before);
    // The expired row may be touched no more either.
    assert!(!scalar::<bool>(pool, "SELECT sandbox_touch('x')").await);
}

#[tokio::test]
async fn concurrent_first_requests_for_one_id_are_merged_not_refused() {
    let env = TestEnv::new().await;
    for round in 0..5 {
        let id = format!("race-{round}");
        let calls = ["postgres", "redis", "valkey", "mongo"].map(|engine| {
            let pool = env.pool.clone();
            let id = id.clone();
            tokio::spawn(async move {
                sqlx::query_scalar::<_, i64>("SELECT sandbox_request($1, NULL, ARRAY[$2])")
                    .bind(id)
                    .bind(engine)
                    .fetch_one(&pool)
                    .await
                    .unwrap_or_else(|e| panic!("request {engine}: {e}"))
            })
        });
        let mut generations = Vec::new();
        for call in calls {
            generations.push(call.await.unwrap());
        }
        generations.sort();
        assert_eq!(generations, [1, 2, 3, 4], "round {round}");
        let mut services: Vec<String> =
            sqlx::query_scalar("SELECT services FROM sandbox_desired WHERE id = $1")
                .bind(&id)
                .fetch_one(&env.pool)
                .await
                .unwrap();
        services.sort();
        assert_eq!(services, ["mongo", "postgres", "redis", "valkey"]);
    }
}

#[tokio::test]
async fn a_touch_of_a_sandbox_being_released_changes_nothing_and_says_so() {
    let env = TestEnv::new().await;
    let pool = &env.pool;
    scalar::<i64>(pool, "SELECT sandbox_request('t', NULL, '{redis}')").await;
    let term = hold_lease(pool).await;
    sqlx::query("INSERT INTO sandbox_status (id, phase, observed_generation, incarnation, leader_term)
                 VALUES ('t', 'terminating', 1, (SELECT incarnation FROM sandbox_desired WHERE id = 't'), $1)")
        .bind(term)
        .execute(pool)
        .await
        .unwrap();
    let (_, before, _) = clock_of(pool, "t").await;
    assert!(!scalar::<bool>(pool, "SELECT sandbox_touch('t')").await);
    let (_, after, _) = clock_of(pool, "t").await;
    assert_eq!(after, before);
    // Requesting it again is how it comes back.
    assert_eq!(
        scalar::<i64>(pool, "SELECT sandbox_request('t', NULL, NULL)").await,
        2
    );
    assert!(scalar::<bool>(pool, "SELECT sandbox_release('t')").await);
    assert!(!scalar::<bool>(pool, "SELECT sandbox_release('t')").await);
}

#[tokio::test]
async fn a_persistent_sandbox_past_its_expires_at_can_still_be_touched_and_requested() {
    let env = TestEnv::new().await;
    let pool = &env.pool;
    scalar::<i64>(
        pool,
        "SELECT sandbox_request('p', NULL, '{redis}', p_persistent => true)",
    )
    .await;
    scalar::<i64>(pool, "SELECT sandbox_request('e', NULL, '{redis}')").await;
    sqlx::query("UPDATE sandbox_desired SET expires_at = now() - interval '1 minute'")
        .execute(pool)
        .await
        .unwrap();
    // A persistent sandbox never expires; an ordinary one has.
    assert!(scalar::<bool>(pool, "SELECT sandbox_touch('p')").await);
    assert!(!scalar::<bool>(pool, "SELECT sandbox_touch('e')").await);
    scalar::<i64>(pool, "SELECT sandbox_request('p', NULL, '{postgres}')").await;
    let err = sqlx::query("SELECT sandbox_request('e', NULL, '{postgres}')")
        .execute(pool)
        .await
        .expect_err("an expired sandbox is refused");
    assert!(err.to_string().contains("expired"), "{err}");
}

/// Fails unless `message` (about `what`) contains every fragment and no
/// control character (an escape sequence, a newline).
fn assert_mentions(what: &str, message: &str, fragments: &[&str]) {
    assert!(
        !message.contains('\u{1b}') && !message.contains('\n'),
        "{what}: the message carries a control character: {message:?}"
    );
    for fragment in fragments {
        assert!(
            message.contains(fragment),
            "{what}: message {message:?} lacks {fragment:?}"
        );
    }
}

/// Fails unless `sandbox_desired` is empty: every refused row left nothing.
async fn assert_no_desired_rows(pool: &sqlx::PgPool) {
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM sandbox_desired")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(count, 0);
}

#[tokio::test]
async fn pool_claims_are_written_only_by_the_current_leader_s_term() {
    let env = TestEnv::new().await;
    let term = hold_lease(&env.pool).await;
    let insert = "INSERT INTO sandbox_pool_claims (container, sandbox_id, engine, generation, instance, leader_term)
                  VALUES ('c1', 'agent-1', 'postgres', 1, 'tok', $1)";
    sqlx::query(insert)
        .bind(term)
        .execute(&env.pool)
        .await
        .expect("the leader records a claim");
    let err = sqlx::query(insert)
        .bind(term + 1)
        .execute(&env.pool)
        .await
        .expect_err("another term's claim is refused");
    assert_eq!(
        err.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("SX001")
    );
    let (code, _) = refusal(
        &env.pool,
        "UPDATE sandbox_pool_claims SET sandbox_id = 'agent-2', leader_term = NULL",
    )
    .await;
    assert_eq!(code, "SX001");
}

#[tokio::test]
async fn replicas_starting_at_once_all_sync_the_engine_allowlist_without_colliding() {
    let env = TestEnv::new().await;
    let before: Vec<(String, String)> =
        sqlx::query_as("SELECT engine, feature FROM sandbox_engine_features ORDER BY 1, 2")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    assert!(!before.is_empty(), "the allowlist is filled");
    // Each start migrates and rewrites the allowlist; eight at once, as
    // replicas of a rollout do.
    let starts = (0..8).map(|_| {
        let url = env.url.clone();
        tokio::spawn(async move {
            let store =
                sandboxd::adapters::postgres::PgStore::connect(&url, 2, sandboxd::engine::REGISTRY)
                    .await
                    .expect("connect");
            store.migrate().await
        })
    });
    for result in futures::future::join_all(starts).await {
        result.unwrap().expect("every replica starts");
    }
    let after: Vec<(String, String)> =
        sqlx::query_as("SELECT engine, feature FROM sandbox_engine_features ORDER BY 1, 2")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    assert_eq!(after, before, "the same allowlist, once");
}

/// One privilege on one object, as `(kind, object, privilege)`, in the form
/// `sandbox_orchestrator_privileges` and `::regclass` / `::regprocedure` print.
type Privilege = (String, String, String);

/// Every privilege `role` holds on the objects of the tables' schema (and
/// on the schema), whether granted to it or to PUBLIC.
async fn privileges_held(pool: &sqlx::PgPool, role: &str) -> BTreeSet<Privilege> {
    sqlx::query_as::<_, Privilege>(
        "SELECT 'table', c.oid::regclass::text, p FROM pg_class c,
                unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) p
          WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
            AND has_table_privilege($1::name, c.oid, p)
         UNION ALL
         SELECT 'sequence', c.oid::regclass::text, p FROM pg_class c,
                unnest(ARRAY['USAGE', 'SELECT', 'UPDATE']) p
          WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'S'
            AND has_sequence_privilege($1::name, c.oid, p)
         UNION ALL
         SELECT 'function', f.oid::regprocedure::text, 'EXECUTE' FROM pg_proc f
          WHERE f.pronamespace = 'public'::regnamespace
            AND has_function_privilege($1::name, f.oid, 'EXECUTE')
         UNION ALL
         SELECT 'schema', 'public', 'USAGE' WHERE has_schema_privilege($1::name, 'public', 'USAGE')",
    )
    .bind(role)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// The list's rows: what is granted, and the objects never granted.
async fn privilege_list(pool: &sqlx::PgPool) -> (BTreeSet<Privilege>, BTreeSet<(String, String)>) {
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT object_kind, object, privilege FROM sandbox_orchestrator_privileges",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut granted = BTreeSet::new();
    let mut never = BTreeSet::new();
    for (kind, object, privilege) in rows {
        match privilege {
            Some(p) => granted.insert((kind, object, p)),
            None => never.insert((kind, object)),
        };
    }
    (granted, never)
}

#[tokio::test]
async fn a_registered_orchestrator_holds_exactly_the_listed_privileges_and_a_revoked_one_none() {
    let env = TestEnv::new().await;
    let (listed, _) = env.create_login_role("listed").await;
    env.create_login_role("bystander").await;
    let (granted, never) = privilege_list(&env.pool).await;
    // What sql/grants/orchestrator_privileges.sql grants, in one list.
    assert_eq!(granted.len(), 28, "{granted:#?}");
    for expected in [
        ("schema", "public", "USAGE"),
        ("table", "sandbox_desired", "DELETE"),
        ("table", "sandbox_events", "SELECT"),
        ("table", "sandbox_resets", "SELECT"),
        (
            "function",
            "sandbox_request(text,text,text[],jsonb,interval,boolean,text,text[],text,text,jsonb)",
            "EXECUTE",
        ),
        ("function", "sandbox_checkpoint(text,text)", "EXECUTE"),
        ("function", "sandbox_seed_put(text,bytea,text)", "EXECUTE"),
        ("function", "sandbox_seed_delete(text,text)", "EXECUTE"),
        ("function", "sandbox_touch(text)", "EXECUTE"),
        ("function", "sandbox_notify_send(text,text)", "EXECUTE"),
    ] {
        let expected = (expected.0.into(), expected.1.into(), expected.2.into());
        assert!(granted.contains(&expected), "{expected:?} in {granted:#?}");
    }
    for expected in [
        ("table", "sandbox_orchestrators"),
        ("table", "sandbox_orchestrator_privileges"),
        ("table", "sandbox_checkpoint_settings"),
        ("sequence", "sandbox_checkpoint_requests"),
        (
            "function",
            "sandbox_record_events(bigint,text,uuid,text,jsonb,integer)",
        ),
        ("function", "sandbox_grant_orchestrator(name,boolean)"),
        ("function", "sandbox_desired_validate_idle_action()"),
    ] {
        let expected = (expected.0.into(), expected.1.into());
        assert!(never.contains(&expected), "{expected:?} in {never:#?}");
    }

    // What PUBLIC holds, seen through a role that was never registered.
    let public = privileges_held(&env.pool, "bystander").await;
    assert!(
        public
            .iter()
            .all(|(kind, object, _)| !never.contains(&(kind.clone(), object.clone()))),
        "PUBLIC holds a privilege on an object orchestrators never get: {public:#?}"
    );

    // Privileges granted by hand beforehand are replaced by exactly the list.
    sqlx::raw_sql(
        "GRANT EXECUTE ON FUNCTION sandbox_record_events(bigint, text, uuid, text, jsonb, integer) TO listed;
         GRANT SELECT ON sandbox_checkpoint_settings, sandbox_orchestrators TO listed;
         GRANT INSERT ON sandbox_status TO listed",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    sqlx::query("SELECT sandbox_grant_orchestrator('listed', true)")
        .execute(&env.pool)
        .await
        .unwrap();
    let held = privileges_held(&env.pool, "listed").await;
    let expected: BTreeSet<Privilege> = granted.union(&public).cloned().collect();
    assert_eq!(
        held, expected,
        "a registered orchestrator holds the list and what PUBLIC holds"
    );

    // The list itself is the owner's: an orchestrator may neither read nor write it.
    for sql in [
        "SELECT * FROM sandbox_orchestrator_privileges",
        "INSERT INTO sandbox_orchestrator_privileges VALUES ('table', 'sandbox_status', 'UPDATE')",
    ] {
        let err = sqlx::query(sql).execute(&listed).await.expect_err(sql);
        assert_eq!(
            err.as_database_error().and_then(|d| d.code()).as_deref(),
            Some("42501"),
            "{sql}: {err}"
        );
    }

    let was: bool = sqlx::query_scalar("SELECT sandbox_revoke_orchestrator('listed')")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(was);
    assert_eq!(
        privileges_held(&env.pool, "listed").await,
        public,
        "a revoked orchestrator holds only what PUBLIC holds"
    );
}

#[tokio::test]
async fn a_row_added_to_the_list_reaches_registered_orchestrators_and_a_revoke_takes_it_back() {
    let env = TestEnv::new().await;
    env.create_login_role("early").await;
    env.create_login_role("late").await;
    sqlx::query("SELECT sandbox_grant_orchestrator('early')")
        .execute(&env.pool)
        .await
        .unwrap();
    // What a later migration does: a new verb, one row, applied to the
    // orchestrators registered already.
    sqlx::raw_sql(
        "CREATE FUNCTION sandbox_new_verb(p_id text) RETURNS text LANGUAGE sql AS $$ SELECT p_id $$;
         REVOKE EXECUTE ON FUNCTION sandbox_new_verb(text) FROM PUBLIC;
         INSERT INTO sandbox_orchestrator_privileges (object_kind, object, privilege)
         VALUES ('function', 'sandbox_new_verb( text )', 'EXECUTE');
         SELECT sandbox_apply_orchestrator_privileges(o.role) FROM sandbox_orchestrators o",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let normalised: String = sqlx::query_scalar(
        "SELECT object FROM sandbox_orchestrator_privileges WHERE object LIKE 'sandbox_new_verb%'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(normalised, "sandbox_new_verb(text)");
    sqlx::query("SELECT sandbox_grant_orchestrator('late')")
        .execute(&env.pool)
        .await
        .unwrap();
    let may = |role: &'static str| {
        let pool = env.pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>(
                "SELECT has_function_privilege($1::name, 'sandbox_new_verb(text)', 'EXECUTE')",
            )
            .bind(role)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert!(may("early").await, "registered before the row");
    assert!(may("late").await, "registered after the row");
    sqlx::query("SELECT sandbox_revoke_orchestrator('early')")
        .execute(&env.pool)
        .await
        .unwrap();
    assert!(!may("early").await, "revoked");
    assert!(may("late").await, "still registered");

    // A row that names nothing is refused with what to write instead.
    let err = sqlx::query(
        "INSERT INTO sandbox_orchestrator_privileges (object_kind, object, privilege)
         VALUES ('function', 'sandbox_no_such_verb(text)', 'EXECUTE')",
    )
    .execute(&env.pool)
    .await
    .expect_err("a missing function is refused");
    assert!(
        err.to_string().contains("there is no such function"),
        "{err}"
    );
    let err = sqlx::query(
        "INSERT INTO sandbox_orchestrator_privileges (object_kind, object, privilege)
         VALUES ('table', 'sandbox_status', 'TRUNCATE')",
    )
    .execute(&env.pool)
    .await
    .expect_err("a privilege outside the fixed set is refused");
    assert_eq!(
        err.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("23514"),
        "{err}"
    );
}

/// Everything about the tables' schema a migration or `sql/` decides, one
/// line per fact, sorted: tables (kind, owner, row-level security, ACL,
/// comment), columns in order with types and defaults, constraints,
/// indexes, sequences, functions (`pg_get_functiondef`, owner, ACL,
/// settings, comment), triggers, policies, the schema's ACL, and the rows
/// of the tables that hold definitions rather than state.
async fn catalog(pool: &sqlx::PgPool) -> Vec<String> {
    // An ACL as a sorted list (its order is that of the grants), or
    // `default` when no grant or revoke ever touched the object.
    const ACL: &str =
        "coalesce((SELECT string_agg(a::text, ' ' ORDER BY a::text) FROM unnest(%s) a), 'default')";
    let acl = |column: &str| ACL.replace("%s", column);
    let sql = format!(
        "SELECT format('relation %s kind=%s owner=%s rls=%s force=%s acl=%s comment=%s',
                       c.relname, c.relkind, pg_get_userbyid(c.relowner), c.relrowsecurity,
                       c.relforcerowsecurity, {relacl}, obj_description(c.oid, 'pg_class'))
           FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
         UNION ALL
         SELECT format('column %s.%s #%s %s notnull=%s default=%s', c.relname, a.attname, a.attnum,
                       format_type(a.atttypid, a.atttypmod), a.attnotnull,
                       pg_get_expr(d.adbin, d.adrelid))
           FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
           LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
          WHERE c.relnamespace = 'public'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
         UNION ALL
         SELECT format('constraint %s on %s: %s', con.conname, con.conrelid::regclass,
                       pg_get_constraintdef(con.oid))
           FROM pg_constraint con WHERE con.connamespace = 'public'::regnamespace
         UNION ALL
         SELECT format('index %s', indexdef) FROM pg_indexes WHERE schemaname = 'public'
         UNION ALL
         SELECT format('sequence %s %s %s %s %s', sequencename, data_type, start_value,
                       increment_by, cycle)
           FROM pg_sequences WHERE schemaname = 'public'
         UNION ALL
         SELECT format('function %s owner=%s acl=%s config=%s comment=%s definition=%s',
                       p.oid::regprocedure, pg_get_userbyid(p.proowner), {proacl}, p.proconfig,
                       obj_description(p.oid, 'pg_proc'), pg_get_functiondef(p.oid))
           FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
         UNION ALL
         SELECT format('trigger %s enabled=%s', pg_get_triggerdef(t.oid), t.tgenabled)
           FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
          WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
         UNION ALL
         SELECT format('policy %s on %s %s permissive=%s roles=%s using=%s check=%s',
                       policyname, tablename, cmd, permissive, roles, qual, with_check)
           FROM pg_policies WHERE schemaname = 'public'
         UNION ALL
         SELECT format('schema public owner=%s acl=%s', pg_get_userbyid(n.nspowner), {nspacl})
           FROM pg_namespace n WHERE n.nspname = 'public'
         UNION ALL
         SELECT format('privilege list %s %s %s', object_kind, object, privilege)
           FROM sandbox_orchestrator_privileges
         UNION ALL
         SELECT format('orchestrator %s own_rows_only=%s', role, own_rows_only)
           FROM sandbox_orchestrators
         UNION ALL
         SELECT format('allowlist %s %s', engine, feature) FROM sandbox_engine_features
         UNION ALL
         SELECT format('checkpoint settings %s', max_per_sandbox) FROM sandbox_checkpoint_settings",
        relacl = acl("c.relacl"),
        proacl = acl("p.proacl"),
        nspacl = acl("n.nspacl"),
    );
    let mut lines: Vec<String> = sqlx::query_scalar(&sql).fetch_all(pool).await.unwrap();
    lines.sort();
    lines
}

/// The lines of `a` that are not in `b`, and those of `b` not in `a`.
fn catalog_difference(a: &[String], b: &[String]) -> (Vec<String>, Vec<String>) {
    let only = |x: &[String], y: &[String]| -> Vec<String> {
        x.iter().filter(|l| !y.contains(l)).cloned().collect()
    };
    (only(a, b), only(b, a))
}

/// The state database's URL for database `name` instead.
fn url_of_database(url: &str, name: &str) -> String {
    let (server, _) = url.rsplit_once('/').unwrap();
    format!("{server}/{name}")
}

#[tokio::test]
async fn a_database_the_fourteen_old_migrations_made_is_adopted_with_its_rows_and_ends_like_a_fresh_one(
) {
    let state = common::StatePostgres::start().await;
    let admin = sqlx::PgPool::connect(&state.admin_url).await.unwrap();
    // Roles are the cluster's (and the state server is shared by the
    // process's tests): one orchestrator role of this test's own, registered
    // in both databases.
    let legacy_name = format!("legacy_{}", common::random_suffix());
    for sql in [
        "DO $$ BEGIN CREATE ROLE legacy_orchestrator; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            .to_owned(),
        format!("CREATE DATABASE {legacy_name} OWNER sandboxd"),
    ] {
        sqlx::raw_sql(&sql).execute(&admin).await.unwrap();
    }

    // A database made by the 14 migrations as they were, with rows in it.
    let legacy_url = url_of_database(&state.url, &legacy_name);
    let legacy = sqlx::PgPool::connect(&legacy_url).await.unwrap();
    let old = sqlx::migrate::Migrator::new(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/legacy-migrations"
    )))
    .await
    .unwrap();
    assert_eq!(old.iter().count(), 14);
    old.run(&legacy).await.expect("the old migrations apply");
    sqlx::raw_sql(
        "SELECT sandbox_grant_orchestrator('legacy_orchestrator', true);
         SELECT sandbox_request('kept', 'agents', '{postgres}', '{\"postgres\":[\"pg_trgm\"]}');
         INSERT INTO sandbox_quotas (owner, max_sandboxes) VALUES ('agents', 3);",
    )
    .execute(&legacy)
    .await
    .unwrap();
    let identity: String = scalar(&legacy, "SELECT state_id::text FROM sandbox_identity").await;
    let made_by_old_files = catalog(&legacy).await;

    let store =
        sandboxd::adapters::postgres::PgStore::connect(&legacy_url, 2, sandboxd::engine::REGISTRY)
            .await
            .unwrap();
    store.migrate().await.expect("migrate adopts the database");
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&legacy)
            .await
            .unwrap();
    // The baseline's record replaces the 14; the migrations after it run.
    let ours: Vec<i64> = sandboxd::adapters::postgres::MIGRATOR
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(versions, ours, "the baseline's record replaces the 14");
    assert_eq!(
        scalar::<String>(&legacy, "SELECT state_id::text FROM sandbox_identity").await,
        identity,
        "the same state database"
    );
    assert_eq!(
        scalar::<String>(
            &legacy,
            "SELECT owner || ' ' || generation || ' ' || features::text FROM sandbox_desired WHERE id = 'kept'"
        )
        .await,
        r#"agents 1 {"postgres": ["pg_trgm"]}"#,
        "rows are kept"
    );
    assert_eq!(
        scalar::<i32>(
            &legacy,
            "SELECT max_sandboxes FROM sandbox_quotas WHERE owner = 'agents'"
        )
        .await,
        3
    );
    store.migrate().await.expect("a second migrate is a no-op");

    // A fresh database, migrated, with the same orchestrator registered.
    let fresh =
        sandboxd::adapters::postgres::PgStore::connect(&state.url, 2, sandboxd::engine::REGISTRY)
            .await
            .unwrap();
    fresh.migrate().await.expect("a fresh database migrates");
    sqlx::query("SELECT sandbox_grant_orchestrator('legacy_orchestrator', true)")
        .execute(fresh.pool())
        .await
        .unwrap();

    let fresh = catalog(fresh.pool()).await;
    assert!(fresh.len() > 300, "{fresh:#?}");
    for kind in [
        "relation",
        "column",
        "constraint",
        "index",
        "sequence",
        "function",
        "trigger",
        "policy",
    ] {
        assert!(
            fresh.iter().any(|l| l.starts_with(kind)),
            "no {kind} in {fresh:#?}"
        );
    }
    let (only_fresh, only_adopted) = catalog_difference(&fresh, &catalog(&legacy).await);
    assert!(
        only_fresh.is_empty() && only_adopted.is_empty(),
        "the schemas differ:\nonly in the fresh database:\n{}\n\nonly in the adopted one:\n{}",
        only_fresh.join("\n"),
        only_adopted.join("\n")
    );
    // And what the old files made is what sql/ makes (bodies, settings,
    // owners, ACLs, triggers, policies), but for the applier's bookkeeping
    // table and the privilege list's comment, which now names its file
    // (and the allowlist, which the old files' database has not yet had
    // synced from the registry).
    let (only_fresh, only_old) = catalog_difference(&fresh, &made_by_old_files);
    // The three writers of sandboxd's own state had each a copy of the
    // lease fence; they now share sandbox_lease_fence (same SQLSTATE,
    // message and hint).
    let fenced = |l: &String| {
        [
            "function sandbox_lease_fence(",
            "function sandbox_status_fence(",
            "function sandbox_pool_claims_fence(",
            "function sandbox_record_events(",
        ]
        .iter()
        .any(|f| l.starts_with(f))
    };
    // What issue 29 (tenant isolation) changed on purpose since the old
    // files: the status's credentials and policy, the checkpoint verbs
    // and their privileges, notifications by incarnation, and the row's
    // isolation level (a column, its check, its validation, and the
    // request verb's new parameter).
    let issue_29 = |l: &String| {
        [
            "sandbox_desired.isolation ",
            "sandbox_desired_isolation_check ",
            "sandbox_desired_validate()",
            "sandbox_request(text",
            "sandbox_checkpoint(text",
            "sandbox_checkpoint_target",
            "sandbox_checkpoints_validate()",
            "sandbox_desired_tombstone()",
            "sandbox_notify()",
            "sandbox_notify_truncate()",
            "sandbox_orchestrator_may_see_status(",
            "sandbox_reset(text",
            "sandbox_resume_reaping()",
            "sandbox_status_credentials",
            "sandbox_status_forget_credentials",
            "sandbox_status_without_credentials",
            "sandbox_touch(text",
            "sandbox_relist_requests",
            "sandbox_released_incarnation",
            "sandbox_released.incarnation",
            "max_pending_per_sandbox",
            "sandbox_checkpoints_orchestrators",
            "sandbox_resets_orchestrators",
            "sandbox_desired_forget_credentials",
            "relation sandbox_checkpoints ",
            "relation sandbox_resets ",
            "relation sandbox_checkpoint_requests ",
            "privilege list sequence sandbox_checkpoint_requests",
            "privilege list table sandbox_checkpoints ",
            "privilege list table sandbox_resets ",
        ]
        .iter()
        .any(|p| l.contains(p))
    };
    // What issue 32 (seeds and forks) added: the table, the row's and the
    // claim's columns, the verbs, the seed lookup and the fork's checks.
    let issue_32 = |l: &String| {
        [
            "sandbox_seeds",
            "sandbox_seed_",
            "sandbox_desired.seeds ",
            "sandbox_pool_claims.seed ",
            "sandbox_desired.fork_of",
            "sandbox_fork(",
            "sandbox_desired_validate_lifecycle()",
        ]
        .iter()
        .any(|p| l.contains(p))
    };
    // What issue 50 changed: the row-level security predicates judge the
    // caller and take no role (the policies, their grants, the verbs that
    // call them); notifications go through one function that skips them
    // while the queue fills, and counts the skips; the seed quota's columns
    // (and the table's comment, and sandbox_quota_for, which reads them)
    // and the trigger that keeps when a seed was last named.
    let issue_50 = |l: &String| {
        [
            "sandbox_caller_may_",
            "sandbox_orchestrator_may_",
            "sandbox_notify_send(",
            "sandbox_notify_skipped",
            "sandbox_quotas.max_seed",
            "sandbox_quotas_max_seed",
            "sandbox_quota_for(",
            "relation sandbox_quotas ",
            "sandbox_desired_seeds_named",
        ]
        .iter()
        .any(|p| l.contains(p))
    };
    let only_fresh: Vec<String> = only_fresh
        .into_iter()
        .filter(|l| {
            !l.starts_with("allowlist ")
                && !fenced(l)
                && !issue_29(l)
                && !issue_32(l)
                && !issue_50(l)
        })
        .collect();
    let only_old: Vec<String> = only_old
        .into_iter()
        .filter(|l| !fenced(l) && !issue_29(l) && !issue_32(l) && !issue_50(l))
        .collect();
    let list = "relation sandbox_orchestrator_privileges ";
    assert!(
        only_fresh
            .iter()
            .all(|l| l.contains("_sandboxd_sql_objects") || l.starts_with(list))
            && only_old.len() == 1
            && only_old[0].starts_with(list),
        "sql/ differs from the old files:\nonly from sql/:\n{}\n\nonly from the old files:\n{}",
        only_fresh.join("\n"),
        only_old.join("\n")
    );
}

#[tokio::test]
async fn a_database_with_only_some_of_the_old_migrations_is_refused_with_what_to_do() {
    let state = common::StatePostgres::start().await;
    let pool = sqlx::PgPool::connect(&state.url).await.unwrap();
    // As a sandboxd of before migration 11 left it: the first 10 files.
    let legacy = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/legacy-migrations"
    ));
    let first_ten = std::env::temp_dir().join(format!("sandboxd-legacy-{}", std::process::id()));
    std::fs::create_dir_all(&first_ten).unwrap();
    let mut files: Vec<_> = std::fs::read_dir(legacy)
        .unwrap()
        .map(|f| f.unwrap().path())
        .collect();
    files.sort();
    for file in &files[..10] {
        std::fs::copy(file, first_ten.join(file.file_name().unwrap())).unwrap();
    }
    let old = sqlx::migrate::Migrator::new(first_ten.as_path())
        .await
        .unwrap();
    std::fs::remove_dir_all(&first_ten).unwrap();
    old.run(&pool).await.unwrap();
    let store =
        sandboxd::adapters::postgres::PgStore::connect(&state.url, 2, sandboxd::engine::REGISTRY)
            .await
            .unwrap();
    let err = store.migrate().await.expect_err("refused").to_string();
    assert_mentions(
        "the refusal",
        &err,
        &[
            "migrations 20261202000011, 20261202000012, 20261202000013, 20261202000014 are not applied",
            "If the sandboxd of commit e6bc0ba (the last with those migrations) migrates it",
            "docker rm -f sandboxd-state && docker volume rm sandboxd-state",
        ],
    );
    let versions: i64 = scalar(&pool, "SELECT count(*) FROM _sqlx_migrations").await;
    assert_eq!(versions, 10, "nothing changed");
}

#[tokio::test]
async fn applying_sql_again_changes_nothing_and_an_edited_function_is_replaced_in_place() {
    use sandboxd::adapters::postgres::schema::{apply, objects, Applied, SqlObject};
    let env = TestEnv::new().await;
    env.create_login_role("agents").await;
    sqlx::query("SELECT sandbox_grant_orchestrator('agents')")
        .execute(&env.pool)
        .await
        .unwrap();
    let before = catalog(&env.pool).await;
    assert_eq!(
        apply(&env.pool, &objects()).await.unwrap(),
        Applied::Unchanged
    );
    // Forget what was applied: everything runs again, and ends the same.
    sqlx::query("DELETE FROM _sandboxd_sql_objects")
        .execute(&env.pool)
        .await
        .unwrap();
    assert_eq!(
        apply(&env.pool, &objects()).await.unwrap(),
        Applied::Applied
    );
    let (gone, added) = catalog_difference(&before, &catalog(&env.pool).await);
    assert!(
        gone.is_empty() && added.is_empty(),
        "a second apply changed\n{}\ninto\n{}",
        gone.join("\n"),
        added.join("\n")
    );

    let edit = |objects: &mut Vec<SqlObject>, path: &str, from: &str, to: &str| {
        let object = objects.iter_mut().find(|o| o.path == path).unwrap();
        assert!(object.sql.contains(from), "{path} holds {from}");
        object.sql = object.sql.replace(from, to).into();
    };
    let mut edited = objects();
    // A body.
    edit(
        &mut edited,
        "functions/sandbox_quote.sql",
        "left(value, 80)",
        "left(value, 40)",
    );
    // A signature (and the grant that names it).
    edit(
        &mut edited,
        "functions/sandbox_release.sql",
        "sandbox_release(p_id text)",
        "sandbox_release(p_id text, p_why text DEFAULT NULL)",
    );
    edit(
        &mut edited,
        "grants/orchestrator_privileges.sql",
        "'sandbox_release(text)'",
        "'sandbox_release(text, text)'",
    );
    // A parameter's name, which CREATE OR REPLACE cannot change.
    edit(
        &mut edited,
        "functions/sandbox_lease_valid.sql",
        "p_term",
        "p_lease_term",
    );
    assert_eq!(apply(&env.pool, &edited).await.unwrap(), Applied::Applied);

    let quote: String = scalar(
        &env.pool,
        "SELECT pg_get_functiondef('sandbox_quote(text)'::regprocedure)",
    )
    .await;
    assert!(quote.contains("left(value, 40)"), "{quote}");
    let releases: Vec<String> = sqlx::query_scalar(
        "SELECT oid::regprocedure::text FROM pg_proc WHERE proname = 'sandbox_release'",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        releases,
        ["sandbox_release(text,text)"],
        "the old signature is dropped"
    );
    let lease: String = scalar(
        &env.pool,
        "SELECT pg_get_functiondef('sandbox_lease_valid(bigint)'::regprocedure)",
    )
    .await;
    assert!(lease.contains("p_lease_term"), "{lease}");
    for function in [
        "sandbox_quote(text)",
        "sandbox_release(text,text)",
        "sandbox_lease_valid(bigint)",
    ] {
        let (config, public): (Vec<String>, bool) = sqlx::query_as(
            "SELECT proconfig, has_function_privilege('public', oid, 'EXECUTE') FROM pg_proc
             WHERE oid = $1::regprocedure",
        )
        .bind(function)
        .fetch_one(&env.pool)
        .await
        .unwrap();
        assert_eq!(
            config,
            ["search_path=pg_catalog, public, pg_temp"],
            "{function}"
        );
        assert!(!public, "{function}: PUBLIC may not execute it");
    }
    let may: bool = scalar(
        &env.pool,
        "SELECT has_function_privilege('agents', 'sandbox_release(text,text)', 'EXECUTE')",
    )
    .await;
    assert!(may, "a registered orchestrator gets the new signature");
    let (code, _) = refusal(
        &env.pool,
        "INSERT INTO sandbox_status (id, phase, leader_term) VALUES ('x', 'pending', 7)",
    )
    .await;
    assert_eq!(code, "SX001", "the fence calls the renamed function");

    // An unchanged apply of the edited files is again a no-op.
    assert_eq!(apply(&env.pool, &edited).await.unwrap(), Applied::Unchanged);
}
