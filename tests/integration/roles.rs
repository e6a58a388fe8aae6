//! Least privilege in the state database: the controller runs as an
//! ordinary role that owns the tables; orchestrators are other roles,
//! registered through `sandbox_grant_orchestrator` (or `sandboxd
//! grant-orchestrator`), that write desired rows and read statuses and can
//! do nothing else, optionally only for rows they own.

use crate::common;

use common::{hold_lease, TestEnv, BIN};
use sqlx::PgPool;
use std::process::{Command, Output};

/// Runs `sql` and returns the SQLSTATE it failed with.
async fn sqlstate(pool: &PgPool, sql: &str) -> String {
    let err = sqlx::query(sql)
        .execute(pool)
        .await
        .expect_err(&format!("{sql} must be refused"));
    err.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
        .unwrap_or_else(|| panic!("{sql}: not a database error: {err}"))
}

async fn grant(env: &TestEnv, role: &str, own_rows_only: bool) {
    sqlx::query("SELECT sandbox_grant_orchestrator($1, $2)")
        .bind(role)
        .bind(own_rows_only)
        .execute(&env.pool)
        .await
        .unwrap_or_else(|e| panic!("grant {role}: {e}"));
}

/// As the controller: a desired row and a status row of its incarnation
/// for each `(id, owner)`.
async fn seed(env: &TestEnv, rows: &[(&str, &str)]) {
    let term = hold_lease(&env.pool).await;
    for (id, owner) in rows {
        sqlx::query("INSERT INTO sandbox_desired (id, owner, services) VALUES ($1, $2, '{redis}')")
            .bind(id)
            .bind(owner)
            .execute(&env.pool)
            .await
            .unwrap();
        common::ready_status(&env.pool, id, term).await;
    }
}

async fn ids(pool: &PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar(&format!("SELECT id FROM {table} ORDER BY id"))
        .fetch_all(pool)
        .await
        .unwrap_or_else(|e| panic!("read {table}: {e}"))
}

#[tokio::test]
async fn the_controller_role_is_not_a_superuser_and_owns_the_tables() {
    let env = TestEnv::new().await;
    let (superuser, bypass, create_role): (bool, bool, bool) = sqlx::query_as(
        "SELECT rolsuper, rolbypassrls, rolcreaterole FROM pg_roles WHERE rolname = current_user",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(!superuser && !bypass && !create_role);
    let owners: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT tableowner::text FROM pg_tables WHERE tablename LIKE 'sandbox\\_%'",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(owners, ["sandboxd"]);
}

#[tokio::test]
async fn an_orchestrator_role_writes_desired_rows_and_reads_statuses() {
    let env = TestEnv::new().await;
    let (orch, _) = env.create_login_role("orchestrator").await;
    grant(&env, "orchestrator", false).await;
    seed(&env, &[("theirs", "someone-else")]).await;

    let (generation, owner): (i64, String) = sqlx::query_as(
        "INSERT INTO sandbox_desired (id, services, attach) VALUES ('mine', '{postgres}', '{agent-7}')
         RETURNING generation, owner",
    )
    .fetch_one(&orch)
    .await
    .unwrap();
    assert_eq!((generation, owner.as_str()), (1, "orchestrator"));
    let generation: i64 = sqlx::query_scalar(
        "UPDATE sandbox_desired SET services = '{postgres,redis}' WHERE id = 'mine' RETURNING generation",
    )
    .fetch_one(&orch)
    .await
    .unwrap();
    assert_eq!(generation, 2);
    assert_eq!(ids(&orch, "sandbox_desired").await, ["mine", "theirs"]);
    assert_eq!(ids(&orch, "sandbox_status").await, ["theirs"]);
    let network: Option<String> =
        sqlx::query_scalar("SELECT network FROM sandbox_status WHERE id = 'theirs'")
            .fetch_one(&orch)
            .await
            .unwrap();
    assert_eq!(network, None);
    let allowed: String = sqlx::query_scalar("SELECT sandbox_allowed_features('redis')")
        .fetch_one(&orch)
        .await
        .unwrap();
    assert_eq!(allowed, "bloom, json, search");
    let deleted = sqlx::query("DELETE FROM sandbox_desired WHERE id IN ('mine', 'theirs')")
        .execute(&orch)
        .await
        .unwrap();
    assert_eq!(deleted.rows_affected(), 2);
}

#[tokio::test]
async fn an_orchestrator_role_cannot_write_statuses() {
    let env = TestEnv::new().await;
    let (orch, _) = env.create_login_role("orchestrator").await;
    grant(&env, "orchestrator", false).await;
    seed(&env, &[("agent-1", "orchestrator")]).await;
    for sql in [
        "INSERT INTO sandbox_status (id, phase) VALUES ('forged', 'ready')",
        "UPDATE sandbox_status SET phase = 'failed', services = '{}'",
        "DELETE FROM sandbox_status",
        "TRUNCATE sandbox_status",
    ] {
        assert_eq!(sqlstate(&orch, sql).await, "42501", "{sql}");
    }
}

#[tokio::test]
async fn an_orchestrator_role_cannot_alter_the_allowlist_disable_the_trigger_or_grant() {
    let env = TestEnv::new().await;
    let (orch, _) = env.create_login_role("orchestrator").await;
    grant(&env, "orchestrator", false).await;
    for sql in [
        "INSERT INTO sandbox_engine_features (engine, feature) VALUES ('postgres', 'plpython3u')",
        "DELETE FROM sandbox_engine_features",
        "INSERT INTO sandbox_engines (engine) VALUES ('oracle')",
        "UPDATE sandbox_engines SET engine = engine",
        "ALTER TABLE sandbox_desired DISABLE TRIGGER sandbox_desired_validate",
        "ALTER TABLE sandbox_desired DISABLE ROW LEVEL SECURITY",
        "DROP POLICY sandbox_desired_orchestrators ON sandbox_desired",
        "SET session_replication_role = replica",
        "SELECT sandbox_grant_orchestrator('orchestrator', false)",
        "SELECT sandbox_revoke_orchestrator('orchestrator')",
        "SELECT * FROM sandbox_orchestrators",
        "INSERT INTO sandbox_orchestrators (role) VALUES ('orchestrator')",
        "CREATE OR REPLACE FUNCTION sandbox_allowed_engines() RETURNS text LANGUAGE sql AS $$ SELECT '' $$",
    ] {
        assert_eq!(sqlstate(&orch, sql).await, "42501", "{sql}");
    }
    // The trigger still refuses what the allowlist does not hold.
    let err = sqlx::query(
        r#"INSERT INTO sandbox_desired (id, services, features) VALUES ('x', '{postgres}', '{"postgres":["plpython3u"]}')"#,
    )
    .execute(&orch)
    .await
    .unwrap_err();
    assert_eq!(err.as_database_error().unwrap().code().unwrap(), "23514");
}

#[tokio::test]
async fn an_own_rows_only_orchestrator_sees_and_writes_only_its_own_rows() {
    let env = TestEnv::new().await;
    let (alice, _) = env.create_login_role("alice").await;
    let (bob, _) = env.create_login_role("bob").await;
    grant(&env, "alice", true).await;
    grant(&env, "bob", false).await;
    seed(
        &env,
        &[
            ("a-1", "alice"),
            ("b-1", "bob"),
            ("c-1", "carol"),
            ("e-1", ""),
        ],
    )
    .await;

    assert_eq!(ids(&alice, "sandbox_desired").await, ["a-1"]);
    assert_eq!(ids(&alice, "sandbox_status").await, ["a-1"]);
    assert_eq!(
        ids(&bob, "sandbox_desired").await,
        ["a-1", "b-1", "c-1", "e-1"]
    );
    assert_eq!(
        ids(&bob, "sandbox_status").await,
        ["a-1", "b-1", "c-1", "e-1"]
    );

    // Rows for another owner (or for none) cannot be written.
    for sql in [
        "INSERT INTO sandbox_desired (id, owner, services) VALUES ('a-2', 'bob', '{redis}')",
        "INSERT INTO sandbox_desired (id, owner, services) VALUES ('a-2', '', '{redis}')",
        "UPDATE sandbox_desired SET owner = 'bob' WHERE id = 'a-1'",
        // Taking over another owner's id through an upsert.
        "INSERT INTO sandbox_desired (id, services) VALUES ('b-1', '{postgres}')
         ON CONFLICT (id) DO UPDATE SET services = EXCLUDED.services",
    ] {
        assert_eq!(sqlstate(&alice, sql).await, "42501", "{sql}");
    }
    // Other owners' rows are invisible to updates and deletes.
    for sql in [
        "UPDATE sandbox_desired SET services = '{postgres}' WHERE id = 'b-1'",
        "DELETE FROM sandbox_desired WHERE id IN ('b-1', 'c-1', 'e-1')",
    ] {
        let done = sqlx::query(sql).execute(&alice).await.unwrap();
        assert_eq!(done.rows_affected(), 0, "{sql}");
    }
    // An insert that names no owner is hers.
    let owner: String = sqlx::query_scalar(
        "INSERT INTO sandbox_desired (id, services) VALUES ('a-2', '{redis}') RETURNING owner",
    )
    .fetch_one(&alice)
    .await
    .unwrap();
    assert_eq!(owner, "alice");
    assert_eq!(ids(&alice, "sandbox_desired").await, ["a-1", "a-2"]);
    let services: Vec<String> =
        sqlx::query_scalar("SELECT services FROM sandbox_desired WHERE id = 'b-1'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(services, ["redis"], "bob's row is untouched");
}

#[tokio::test]
async fn a_role_that_is_not_registered_sees_nothing_and_a_revoked_one_is_refused() {
    let env = TestEnv::new().await;
    let (mallory, _) = env.create_login_role("mallory").await;
    seed(&env, &[("agent-1", "mallory")]).await;
    // Table privileges alone show no row: the policies admit registered roles.
    sqlx::query("GRANT SELECT, INSERT ON sandbox_desired, sandbox_status TO mallory")
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query("GRANT EXECUTE ON FUNCTION sandbox_caller_may_access(text), sandbox_caller_may_see_status(text), sandbox_allowed_engines(), sandbox_allowed_features(text), sandbox_quote(text) TO mallory")
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query("GRANT SELECT ON sandbox_engines, sandbox_engine_features TO mallory")
        .execute(&env.pool)
        .await
        .unwrap();
    assert!(ids(&mallory, "sandbox_desired").await.is_empty());
    assert!(ids(&mallory, "sandbox_status").await.is_empty());
    assert_eq!(
        sqlstate(
            &mallory,
            "INSERT INTO sandbox_desired (id, services) VALUES ('m-1', '{redis}')"
        )
        .await,
        "42501"
    );

    // Granting makes it exactly an orchestrator; revoking takes it all back.
    grant(&env, "mallory", false).await;
    assert_eq!(ids(&mallory, "sandbox_desired").await, ["agent-1"]);
    assert_eq!(
        sqlstate(
            &mallory,
            "INSERT INTO sandbox_status (id, phase) VALUES ('m-1', 'ready')"
        )
        .await,
        "42501",
        "the grant replaced the INSERT on sandbox_status granted by hand"
    );
    let was: bool = sqlx::query_scalar("SELECT sandbox_revoke_orchestrator('mallory')")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(was);
    for table in ["sandbox_desired", "sandbox_status", "sandbox_engines"] {
        assert_eq!(
            sqlstate(&mallory, &format!("SELECT * FROM {table}")).await,
            "42501",
            "{table}"
        );
    }
}

#[tokio::test]
async fn granting_a_role_that_does_not_exist_says_how_to_create_it() {
    let env = TestEnv::new().await;
    let err = sqlx::query("SELECT sandbox_grant_orchestrator('nosuch')")
        .execute(&env.pool)
        .await
        .unwrap_err();
    let db = err.as_database_error().unwrap();
    assert_eq!(db.code().unwrap(), "42704");
    assert!(
        db.message().contains("CREATE ROLE nosuch LOGIN"),
        "{}",
        db.message()
    );
    let err = sqlx::query("SELECT sandbox_grant_orchestrator('sandboxd')")
        .execute(&env.pool)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("create another role"),
        "the controller's own role is refused: {err}"
    );
}

fn sandboxd(url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .expect("run sandboxd")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(out: &Output) -> String {
    assert!(!out.status.success(), "must fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn the_cli_grants_and_revokes_orchestrators_and_says_what_to_do_when_it_cannot() {
    let env = TestEnv::new().await;
    let (alice, alice_url) = env.create_login_role("alice").await;
    seed(&env, &[("b-1", "bob")]).await;

    let out = ok(&sandboxd(
        &env.url,
        &["grant-orchestrator", "alice", "--own-rows-only"],
    ));
    assert!(out.contains("granted \"alice\""), "{out}");
    assert!(out.contains("only rows whose owner is \"alice\""), "{out}");

    // Alice applies through the CLI: the row is hers, with its attach list.
    ok(&sandboxd(
        &alice_url,
        &[
            "apply",
            "--id",
            "a-1",
            "--services",
            "redis",
            "--attach",
            "agent-a",
            "--attach",
            "agent-b.2",
        ],
    ));
    let (owner, attach): (String, Vec<String>) =
        sqlx::query_as("SELECT owner, attach FROM sandbox_desired WHERE id = 'a-1'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(owner, "alice");
    assert_eq!(attach, ["agent-a", "agent-b.2"]);
    let err = refused(&sandboxd(
        &alice_url,
        &[
            "apply",
            "--id",
            "a-2",
            "--services",
            "redis",
            "--attach=-bad",
        ],
    ));
    assert!(err.contains("invalid container name '-bad'"), "{err}");
    assert_eq!(ids(&alice, "sandbox_desired").await, ["a-1"]);

    // What cannot be done says what to do instead.
    let err = refused(&sandboxd(&env.url, &["grant-orchestrator", "nosuch"]));
    assert!(
        err.contains("role \"nosuch\" does not exist") && err.contains("CREATE ROLE"),
        "{err}"
    );
    let err = refused(&sandboxd(&alice_url, &["grant-orchestrator", "alice"]));
    assert!(err.contains("use the controller's DATABASE_URL"), "{err}");
    assert!(
        !err.contains(alice_url.split(['@', ':']).nth(2).unwrap()),
        "no password in {err}"
    );
    let err = refused(&sandboxd(&env.url, &["grant-orchestrator", "pg_monitor"]));
    assert!(err.contains("predefined role"), "{err}");

    let out = ok(&sandboxd(&env.url, &["revoke-orchestrator", "alice"]));
    assert!(out.contains("revoked \"alice\""), "{out}");
    assert_eq!(
        sqlstate(&alice, "SELECT * FROM sandbox_desired").await,
        "42501"
    );
    let out = ok(&sandboxd(&env.url, &["revoke-orchestrator", "alice"]));
    assert!(out.contains("was not registered"), "{out}");
}

#[tokio::test]
async fn an_own_rows_only_orchestrator_requests_touches_and_releases_only_its_own_sandboxes() {
    let env = TestEnv::new().await;
    let (alice, _) = env.create_login_role("alice").await;
    let (bob, _) = env.create_login_role("bob").await;
    grant(&env, "alice", true).await;
    grant(&env, "bob", false).await;
    seed(&env, &[("b-1", "bob")]).await;

    // Her own sandbox: created with her as the owner, added to, touched.
    let generation: i64 = sqlx::query_scalar("SELECT sandbox_request('a-1', NULL, '{redis}')")
        .fetch_one(&alice)
        .await
        .unwrap();
    assert_eq!(generation, 1);
    let generation: i64 =
        sqlx::query_scalar("SELECT sandbox_request('a-1', 'alice', '{postgres}')")
            .fetch_one(&alice)
            .await
            .unwrap();
    assert_eq!(generation, 2);
    let (owner, services): (String, Vec<String>) =
        sqlx::query_as("SELECT owner, services FROM sandbox_desired WHERE id = 'a-1'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(owner, "alice");
    assert_eq!(services, ["redis", "postgres"]);
    let touched: bool = sqlx::query_scalar("SELECT sandbox_touch('a-1')")
        .fetch_one(&alice)
        .await
        .unwrap();
    assert!(touched);

    // Bob's sandbox: invisible to touch and release, refused to request.
    for sql in [
        "SELECT sandbox_touch('b-1')",
        "SELECT sandbox_release('b-1')",
    ] {
        let done: bool = sqlx::query_scalar(sql).fetch_one(&alice).await.unwrap();
        assert!(!done, "{sql}");
    }
    for (sql, fragment) in [
        (
            "SELECT sandbox_request('b-1', NULL, '{postgres}')",
            "sandbox id b-1 is taken by another owner: use another id",
        ),
        (
            "SELECT sandbox_request('a-2', 'bob', '{redis}')",
            "row-level security",
        ),
    ] {
        let err = sqlx::query(sql).execute(&alice).await.unwrap_err();
        let db = err.as_database_error().unwrap();
        assert_eq!(db.code().as_deref(), Some("42501"), "{sql}: {db}");
        assert!(db.message().contains(fragment), "{sql}: {}", db.message());
        assert!(
            !db.message().contains("bob"),
            "no other owner named: {}",
            db.message()
        );
    }
    let services: Vec<String> =
        sqlx::query_scalar("SELECT services FROM sandbox_desired WHERE id = 'b-1'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(services, ["redis"], "bob's row is untouched");

    // Bob sees every row, but asking for one as another owner is refused.
    let err = sqlx::query("SELECT sandbox_request('a-1', 'carol', '{redis}')")
        .execute(&bob)
        .await
        .unwrap_err();
    assert_eq!(err.as_database_error().unwrap().code().unwrap(), "42501");
    assert!(
        err.to_string()
            .contains("sandbox a-1 belongs to another owner"),
        "{err}"
    );

    let released: bool = sqlx::query_scalar("SELECT sandbox_release('a-1')")
        .fetch_one(&alice)
        .await
        .unwrap();
    assert!(released);
    assert_eq!(ids(&env.pool, "sandbox_desired").await, ["b-1"]);
}

#[tokio::test]
async fn the_request_functions_are_not_callable_by_a_role_that_is_not_registered() {
    let env = TestEnv::new().await;
    let (mallory, _) = env.create_login_role("mallory").await;
    seed(&env, &[("agent-1", "mallory")]).await;
    // Even with table privileges granted by hand.
    sqlx::query("GRANT SELECT, INSERT, UPDATE, DELETE ON sandbox_desired TO mallory")
        .execute(&env.pool)
        .await
        .unwrap();
    let calls = [
        "SELECT sandbox_request('agent-1', NULL, '{redis}')",
        "SELECT sandbox_request('m-1', NULL, '{redis}')",
        "SELECT sandbox_touch('agent-1')",
        "SELECT sandbox_release('agent-1')",
    ];
    for sql in calls {
        assert_eq!(sqlstate(&mallory, sql).await, "42501", "{sql}");
    }
    // Registered, it may; revoked, it may not again.
    grant(&env, "mallory", false).await;
    for sql in calls {
        sqlx::query(sql)
            .execute(&mallory)
            .await
            .unwrap_or_else(|e| panic!("{sql} as a registered orchestrator: {e}"));
    }
    let was: bool = sqlx::query_scalar("SELECT sandbox_revoke_orchestrator('mallory')")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(was);
    for sql in calls {
        assert_eq!(sqlstate(&mallory, sql).await, "42501", "{sql}");
    }
}

#[tokio::test]
async fn an_orchestrator_role_cannot_read_or_write_pool_claims() {
    let env = TestEnv::new().await;
    let (orch, _) = env.create_login_role("orchestrator").await;
    grant(&env, "orchestrator", false).await;
    for sql in [
        "SELECT * FROM sandbox_pool_claims",
        "INSERT INTO sandbox_pool_claims (container, sandbox_id, engine, generation, instance) VALUES ('c', 'x', 'postgres', 1, 't')",
        "DELETE FROM sandbox_pool_claims",
        "TRUNCATE sandbox_pool_claims",
    ] {
        assert_eq!(sqlstate(&orch, sql).await, "42501", "{sql}");
    }
}
