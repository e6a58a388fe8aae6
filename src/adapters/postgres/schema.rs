//! The state database's objects that hold no data — functions, triggers,
//! row-level security policies and grants — applied from `sql/` after
//! every migration, and the adoption of a database made by the migrations
//! that came before the baseline.
//!
//! Migrations (`migrations/`) change tables and rows, once each, in order.
//! Everything else is defined in `sql/`, one object per file, and applied
//! whole: a function is changed by editing its one file, and the next start
//! replaces it. [`apply`] runs in one transaction under an advisory lock
//! (replicas starting together take turns), in [`objects`]' order:
//! functions, then the triggers and policies that call them, then the
//! database's session settings, then grants.
//!
//! The rules every function gets here, so that no file repeats them:
//! `search_path` is pinned to `pg_catalog, <the tables' schema>, pg_temp`
//! (pg_temp last: a session's temporary table cannot shadow a table the
//! function reads), and PUBLIC may not execute it (who may is in
//! `sql/grants/`). A function file defines one function, named as the
//! file; when its signature changes, the old one is dropped.
//!
//! A digest of the migrations and the objects is kept in
//! `_sandboxd_sql_objects` (as sqlx keeps `_sqlx_migrations`): when it is
//! unchanged, a start takes no lock on any table.

use super::MIGRATOR;
use sha2::{Digest, Sha256};
use sqlx::{Executor, PgConnection, PgPool, Postgres, Transaction};
use std::borrow::Cow;

/// One file of `sql/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlObject {
    /// Its path under `sql/`, e.g. `functions/sandbox_touch.sql`.
    pub path: &'static str,
    /// Its SQL, applied as it is (several statements at most).
    pub sql: Cow<'static, str>,
}

impl SqlObject {
    /// The function a file of `sql/functions/` defines: its file name.
    fn function(&self) -> Option<&'static str> {
        self.path.strip_prefix("functions/")?.strip_suffix(".sql")
    }
}

macro_rules! sql_objects {
    ($($dir:literal: [$($name:literal),* $(,)?]),* $(,)?) => {
        &[$($(
            (
                concat!($dir, "/", $name, ".sql"),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/", $dir, "/", $name, ".sql")),
            ),
        )*)*]
    };
}

/// Every file of `sql/`, in the order it is applied (a test checks that
/// none is missing). Functions first: a plpgsql body is not resolved when
/// it is created, and a SQL one reads only tables. Triggers and policies
/// name functions; grants name all of them.
const FILES: &[(&str, &str)] = sql_objects! {
    "functions": [
        "sandbox_allowed_engines",
        "sandbox_allowed_features",
        "sandbox_apply_orchestrator_privileges",
        "sandbox_array_union",
        "sandbox_caller_may_access",
        "sandbox_caller_may_see_status",
        "sandbox_checkpoint",
        "sandbox_checkpoint_target",
        "sandbox_checkpoints_forget",
        "sandbox_checkpoints_validate",
        "sandbox_desired_incarnation",
        "sandbox_desired_seeds_named",
        "sandbox_desired_tombstone",
        "sandbox_desired_validate",
        "sandbox_desired_validate_idle_action",
        "sandbox_desired_validate_lifecycle",
        "sandbox_features_union",
        "sandbox_fork",
        "sandbox_grant_orchestrator",
        "sandbox_identity_immutable",
        "sandbox_lease_acquire",
        "sandbox_lease_fence",
        "sandbox_lease_release",
        "sandbox_lease_renew",
        "sandbox_lease_valid",
        "sandbox_notify",
        "sandbox_notify_send",
        "sandbox_notify_truncate",
        "sandbox_orchestrator_privileges_validate",
        "sandbox_pause_reaping",
        "sandbox_pool_claims_fence",
        "sandbox_quota_for",
        "sandbox_quote",
        "sandbox_record_events",
        "sandbox_release",
        "sandbox_request",
        "sandbox_reset",
        "sandbox_resume_reaping",
        "sandbox_revoke_orchestrator",
        "sandbox_seed_delete",
        "sandbox_seed_engine",
        "sandbox_seed_put",
        "sandbox_seeds_prune",
        "sandbox_status_credentials",
        "sandbox_status_fence",
        "sandbox_status_forget_credentials",
        "sandbox_status_without_credentials",
        "sandbox_touch",
    ],
    "triggers": [
        "sandbox_checkpoints_validate",
        "sandbox_desired_forget_checkpoints",
        "sandbox_desired_forget_credentials",
        "sandbox_desired_incarnation",
        "sandbox_desired_notify",
        "sandbox_desired_notify_generation",
        "sandbox_desired_notify_truncate",
        "sandbox_desired_seeds_named",
        "sandbox_desired_tombstone",
        "sandbox_desired_truncate_checkpoints",
        "sandbox_desired_validate",
        "sandbox_desired_validate_idle_action",
        "sandbox_desired_validate_lifecycle",
        "sandbox_identity_immutable",
        "sandbox_identity_no_truncate",
        "sandbox_orchestrator_privileges_validate",
        "sandbox_pool_claims_fence",
        "sandbox_resets_validate",
        "sandbox_status_credentials",
        "sandbox_status_fence",
        "sandbox_status_notify",
        "sandbox_status_notify_truncate",
    ],
    "policies": [
        "sandbox_checkpoints_orchestrators",
        "sandbox_desired_orchestrators",
        "sandbox_events_orchestrators",
        "sandbox_quotas_orchestrators",
        "sandbox_resets_orchestrators",
        "sandbox_status_orchestrators",
    ],
    // The sessions' bounds: names nothing above.
    "settings": [
        "database",
    ],
    "grants": [
        "sandbox_checkpoint_requests",
        "sandbox_checkpoint_settings",
        "sandbox_checkpoints",
        "sandbox_events",
        "sandbox_orchestrator_privileges",
        "sandbox_pool_claims",
        "sandbox_quotas",
        "sandbox_resets",
        // Last: it names functions, tables and the sequence.
        "orchestrator_privileges",
    ],
};

/// The objects of `sql/` this binary was built with, in the order they are
/// applied.
pub fn objects() -> Vec<SqlObject> {
    FILES
        .iter()
        .map(|&(path, sql)| SqlObject {
            path,
            sql: Cow::Borrowed(sql),
        })
        .collect()
}

/// Failures of applying `sql/` or of adopting a database.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A statement of the applier itself failed.
    #[error("{op} failed: {source}")]
    Query {
        /// What was being done.
        op: &'static str,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// A file of `sql/` failed.
    #[error("applying sql/{path} failed: {source}; fix that file (the state database is unchanged: the whole apply rolled back)")]
    Apply {
        /// The file.
        path: &'static str,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// A function file defines no function of its name.
    #[error("sql/{path} defines no function named {name}: a file of sql/functions/ defines the one function it is named after")]
    Unnamed {
        /// The file.
        path: &'static str,
        /// The function it should define.
        name: &'static str,
    },
    /// Several overloads of one name exist, and the file replaced one.
    #[error("there are several functions named {name} ({found}) and sql/{path} defines one of them: sandboxd keeps one function per name; drop the others (DROP FUNCTION …) and start again")]
    Overloaded {
        /// The file.
        path: &'static str,
        /// The function's name.
        name: &'static str,
        /// The overloads, with their argument types.
        found: String,
    },
    /// A database made by the migrations before the baseline that cannot be
    /// adopted.
    #[error("this state database was made by sandboxd's migrations from before the baseline, but {problem}; \
             this sandboxd adopts such a database, keeping its rows, only when all 14 are applied as last written. \
             If the sandboxd of commit e6bc0ba (the last with those migrations) migrates it, run `sandboxd migrate` \
             of that sandboxd against it, then this one again. Otherwise start from an empty database and move the \
             rows: for the one scripts/run.sh starts (named by SANDBOXD_STATE_CONTAINER, default sandboxd-state), \
             docker exec sandboxd-state pg_dump -U sandboxd --data-only -t sandbox_desired sandboxd >desired.sql, \
             docker rm -f sandboxd-state && docker volume rm sandboxd-state, start again, \
             then docker exec -i sandboxd-state psql -U sandboxd -d sandboxd <desired.sql")]
    Legacy {
        /// What is wrong with its `_sqlx_migrations`.
        problem: String,
    },
}

fn query(op: &'static str) -> impl FnOnce(sqlx::Error) -> SchemaError {
    move |source| SchemaError::Query { op, source }
}

/// The key of the advisory lock that adoption and [`apply`] hold.
const LOCK: i64 = 0x5341_4e44_424f_5853; // "SANDBOXS"

/// The migrations the baseline folds, with the SHA-384 sqlx recorded for
/// each (their text is kept, as history, in tests/fixtures/legacy-migrations/).
const LEGACY: [(i64, &str); 14] = [
    (20261130000001, "0f9814c46ff93e0093a736df2745f54d4a632a7e2e1490463e1b84557f8f97343129ae682347f18656ce6a9ff76705ad"),
    (20261130000002, "04712dd022ba19862f7a445fc1dc2484bb09b2ec6c71e4f7a7ee119b469e257840ab11f103e1b4329e8ddedb7eb98c89"),
    (20261130000003, "6d0bc570b319fc825e7d21c017315a290a67a1cb7dd0bbe136a2be937f13baaa6cd12cad868f5c12306d224bebb944dc"),
    (20261130000004, "d882228a20f4cbd320637aadf08852b9ef5b1cf9769d7c88ee6276b2b89e055674ce7d0735b4a7e9afe24855143f1a00"),
    (20261130000005, "283e0ef0f521a9dd9bfc4a7f83c0a401ffb9a95e7c24736eec0c39aa5400a51799175853698ce2c81068d6a96483458b"),
    (20261130000006, "e514cec51c59fd2d4dddf7c6bdbff082ed6e45bf676234042edf46f9e4311d7b7819c2eeebdfe936829a5dafe6de6a78"),
    (20261130000007, "b791d3d32f2dd0f343c3c94a4f1ea22ac87e8e2a34b7fd84fb4903e6195fe1b41fe45af5ec0297031fb601798ce1c1eb"),
    (20261130000008, "ad120195adb5ff7cc098616eb4cb4688aade22919e00e534d462d45c7193abcfd4337defa5a115d0e5d010d7de7daf5e"),
    (20261201000009, "841a5da5c8417629deb46df715634421135c73aca77d7b29b0c6a9222d39bcf490ff36f3847b9fd8f69f044fa1007b0c"),
    (20261202000010, "d0ab1ea2311a314e69534b579cad272b935d48214f63eeb7b05041db3d3472c549798ce8d9cc9bdaa395fc23fcb7ff8b"),
    (20261202000011, "211f2300f595838538011d8733e784b4eac4c3627e8d3399652acbadd417e7576b8d0e267ec357e1433ee3781451f34f"),
    (20261202000012, "c3128e487371ffb9d481d22f4ae95cfbed508305274d385fc822da58b7484bcf1a993def6100d69f5ee2edad71861683"),
    (20261202000013, "c1a61f4a43fe29a81305fac959d372deaff22182ebcc3bc3197ee8d0f45542cf9dad42ea6062d78495c047f884604110"),
    (20261202000014, "bda3a64524a302202a47ce31c2c2ea689e1a583db7108a8a13c48d3e461305d0e12f0fac81f38b2b940676cc205090ea"),
];

/// What [`adopt_legacy`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adoption {
    /// No migration from before the baseline is recorded (a new database,
    /// or one made from the baseline).
    NotLegacy,
    /// All 14 were; their records are now the baseline's, and `sql/` is
    /// applied.
    Adopted,
}

/// Adopts a database that the 14 migrations before the baseline made: in
/// one transaction, their records in `_sqlx_migrations` become the
/// baseline's (whose tables they made) and `sql/` is applied; every row is
/// kept. Refuses ([`SchemaError::Legacy`]) a database with only some of
/// them, or with one whose recorded checksum is not its last text's.
pub async fn adopt_legacy(pool: &PgPool) -> Result<Adoption, SchemaError> {
    let recorded: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
            .fetch_one(pool)
            .await
            .map_err(query("looking for _sqlx_migrations"))?;
    if recorded.is_none() {
        return Ok(Adoption::NotLegacy);
    }
    let mut tx = locked(pool).await?;
    let rows: Vec<(i64, bool, String)> = sqlx::query_as(
        "SELECT version, success, encode(checksum, 'hex') FROM _sqlx_migrations ORDER BY version",
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(query("reading _sqlx_migrations"))?;
    if !rows
        .iter()
        .any(|(v, ..)| LEGACY.iter().any(|(l, _)| l == v))
    {
        return Ok(Adoption::NotLegacy);
    }
    if let Some(problem) = legacy_problem(&rows) {
        return Err(SchemaError::Legacy { problem });
    }
    let baseline = MIGRATOR
        .iter()
        .next()
        .expect("migrations/ holds the baseline");
    let versions: Vec<i64> = LEGACY.iter().map(|(v, _)| *v).collect();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = ANY ($1)")
        .bind(&versions)
        .execute(&mut *tx)
        .await
        .map_err(query(
            "removing the records of the migrations before the baseline",
        ))?;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES ($1, $2, true, $3, 0)",
    )
    .bind(baseline.version)
    .bind(&*baseline.description)
    .bind(&*baseline.checksum)
    .execute(&mut *tx)
    .await
    .map_err(query("recording the baseline"))?;
    apply_locked(&mut tx, &objects()).await?;
    tx.commit()
        .await
        .map_err(query("committing the adoption"))?;
    Ok(Adoption::Adopted)
}

/// Why `rows` (version, success, hex checksum) are not exactly the 14
/// migrations before the baseline, all applied as last written.
fn legacy_problem(rows: &[(i64, bool, String)]) -> Option<String> {
    let missing: Vec<String> = LEGACY
        .iter()
        .filter(|(v, _)| !rows.iter().any(|(r, ..)| r == v))
        .map(|(v, _)| v.to_string())
        .collect();
    if !missing.is_empty() {
        return Some(format!("migrations {} are not applied", missing.join(", ")));
    }
    if let Some((v, ..)) = rows.iter().find(|(_, ok, _)| !ok) {
        return Some(format!("migration {v} failed part-way"));
    }
    if let Some((v, ..)) = rows
        .iter()
        .find(|(v, _, sum)| LEGACY.iter().any(|(l, s)| l == v && s != sum))
    {
        return Some(format!(
            "migration {v} was applied from an earlier text of it than its last"
        ));
    }
    if let Some((v, ..)) = rows
        .iter()
        .find(|(v, ..)| !LEGACY.iter().any(|(l, _)| l == v))
    {
        return Some(format!(
            "migration {v}, which is none of those 14, is recorded too"
        ));
    }
    None
}

/// A transaction holding the advisory lock of adoption and [`apply`].
async fn locked(pool: &PgPool) -> Result<Transaction<'static, Postgres>, SchemaError> {
    let mut tx = pool.begin().await.map_err(query("beginning the apply"))?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(LOCK)
        .execute(&mut *tx)
        .await
        .map_err(query("waiting for another sandboxd's apply"))?;
    Ok(tx)
}

/// Whether [`apply`] changed anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The objects and migrations were those applied last: nothing ran.
    Unchanged,
    /// Every object was applied.
    Applied,
}

/// Applies `objects` (normally [`objects`]) in one transaction under the
/// advisory lock, unless the migrations and objects are those applied last.
pub async fn apply(pool: &PgPool, objects: &[SqlObject]) -> Result<Applied, SchemaError> {
    let mut tx = locked(pool).await?;
    let applied = apply_locked(&mut tx, objects).await?;
    tx.commit().await.map_err(query("committing the apply"))?;
    Ok(applied)
}

async fn apply_locked(
    conn: &mut PgConnection,
    objects: &[SqlObject],
) -> Result<Applied, SchemaError> {
    conn.execute(sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS _sandboxd_sql_objects (
             singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
             digest     text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now())",
    ))
    .await
    .map_err(query("creating _sandboxd_sql_objects"))?;
    let wanted = digest(objects);
    let last: Option<String> = sqlx::query_scalar("SELECT digest FROM _sandboxd_sql_objects")
        .fetch_optional(&mut *conn)
        .await
        .map_err(query("reading _sandboxd_sql_objects"))?;
    if last.as_deref() == Some(wanted.as_str()) {
        return Ok(Applied::Unchanged);
    }
    let schema: String = sqlx::query_scalar(
        "SELECT quote_ident(n.nspname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = 'sandbox_desired'::regclass",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(query("finding the schema of sandbox_desired"))?;
    for object in objects {
        match object.function() {
            Some(name) => apply_function(conn, object, name, &schema).await?,
            None => run(conn, object.path, &object.sql).await?,
        }
    }
    sqlx::query(
        "INSERT INTO _sandboxd_sql_objects (digest) VALUES ($1)
         ON CONFLICT (singleton) DO UPDATE SET digest = EXCLUDED.digest, applied_at = now()",
    )
    .bind(&wanted)
    .execute(&mut *conn)
    .await
    .map_err(query("recording the apply"))?;
    Ok(Applied::Applied)
}

/// Runs `sql` (from the file `path`, or what the applier does for it), as
/// a simple query: several statements, no parameters.
async fn run(conn: &mut PgConnection, path: &'static str, sql: &str) -> Result<(), SchemaError> {
    conn.execute(sqlx::raw_sql(sql))
        .await
        .map(drop)
        .map_err(|source| SchemaError::Apply { path, source })
}

/// The overloads of `name` in the tables' schema, as `name(argtypes)`.
async fn overloads(conn: &mut PgConnection, name: &str) -> Result<Vec<String>, SchemaError> {
    sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p
         WHERE p.proname = $1
           AND p.pronamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'sandbox_desired'::regclass)
         ORDER BY 1",
    )
    .bind(name)
    .fetch_all(&mut *conn)
    .await
    .map_err(query("listing a function's overloads"))
}

/// Creates or replaces the function of `object`, drops what its signature
/// was before, pins its search_path and takes EXECUTE from PUBLIC.
async fn apply_function(
    conn: &mut PgConnection,
    object: &SqlObject,
    name: &'static str,
    schema: &str,
) -> Result<(), SchemaError> {
    let path = object.path;
    let before = overloads(conn, name).await?;
    // CREATE OR REPLACE cannot change a function's result type or its
    // parameters' names (SQLSTATE 42P13): then the old one goes first. The
    // attempt runs in a savepoint, so that its failure leaves the
    // transaction usable.
    run(conn, path, "SAVEPOINT sandboxd_function").await?;
    let attempt = conn.execute(sqlx::raw_sql(&object.sql)).await;
    match attempt {
        Ok(_) => run(conn, path, "RELEASE SAVEPOINT sandboxd_function").await?,
        Err(e) if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("42P13") => {
            run(conn, path, "ROLLBACK TO SAVEPOINT sandboxd_function").await?;
            for old in &before {
                run(conn, path, &format!("DROP FUNCTION {old}")).await?;
            }
            run(conn, path, &object.sql).await?;
        }
        Err(source) => return Err(SchemaError::Apply { path, source }),
    }
    let mut after = overloads(conn, name).await?;
    if after.len() > 1 {
        // A new signature: the file made one overload, the others are what
        // it replaces.
        let (stale, kept): (Vec<String>, Vec<String>) =
            after.into_iter().partition(|f| before.contains(f));
        if kept.is_empty() {
            return Err(SchemaError::Overloaded {
                path,
                name,
                found: stale.join(", "),
            });
        }
        for old in stale {
            run(conn, path, &format!("DROP FUNCTION {old}")).await?;
        }
        after = kept;
    }
    let Some(function) = after.first() else {
        return Err(SchemaError::Unnamed { path, name });
    };
    let rules = format!(
        "ALTER FUNCTION {function} SET search_path = pg_catalog, {schema}, pg_temp;
         REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC"
    );
    run(conn, path, &rules).await
}

/// What an apply is of: every migration (version and checksum) and every
/// object (path and text).
fn digest(objects: &[SqlObject]) -> String {
    let mut hash = Sha256::new();
    for m in MIGRATOR.iter() {
        hash.update(m.version.to_be_bytes());
        hash.update(&*m.checksum);
    }
    for o in objects {
        for part in [o.path, &*o.sql] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part.as_bytes());
        }
    }
    format!("{:x}", hash.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::Path;

    #[test]
    fn every_file_of_sql_is_applied_once() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql");
        let mut on_disk = BTreeSet::new();
        for dir in std::fs::read_dir(&root).unwrap() {
            let dir = dir.unwrap().path();
            if !dir.is_dir() {
                continue;
            }
            for file in std::fs::read_dir(&dir).unwrap() {
                let file = file.unwrap().path();
                let rel = file
                    .strip_prefix(&root)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_owned();
                on_disk.insert(rel);
            }
        }
        let listed: Vec<String> = objects().iter().map(|o| o.path.to_owned()).collect();
        let once: BTreeSet<String> = listed.iter().cloned().collect();
        assert_eq!(
            once.len(),
            listed.len(),
            "a file is listed twice: {listed:?}"
        );
        assert_eq!(once, on_disk, "FILES and sql/ differ");
    }

    #[test]
    fn functions_come_before_what_calls_them_and_grants_last() {
        let kinds: Vec<&str> = objects()
            .iter()
            .map(|o| o.path.split('/').next().unwrap())
            .collect();
        let mut order = kinds.clone();
        order.dedup();
        assert_eq!(
            order,
            ["functions", "triggers", "policies", "settings", "grants"]
        );
        assert_eq!(
            objects().last().unwrap().path,
            "grants/orchestrator_privileges.sql"
        );
    }

    #[test]
    fn a_function_file_names_its_function() {
        for o in objects() {
            if let Some(name) = o.function() {
                assert!(
                    o.sql
                        .contains(&format!("CREATE OR REPLACE FUNCTION {name}(")),
                    "{} must CREATE OR REPLACE FUNCTION {name}",
                    o.path
                );
            }
        }
    }

    fn complete() -> Vec<(i64, bool, String)> {
        LEGACY
            .iter()
            .map(|(v, s)| (*v, true, (*s).to_owned()))
            .collect()
    }

    #[test]
    fn only_all_fourteen_legacy_migrations_as_last_written_are_adopted() {
        assert_eq!(legacy_problem(&complete()), None);
        let mut partial = complete();
        partial.truncate(10);
        assert_eq!(
            legacy_problem(&partial).as_deref(),
            Some("migrations 20261202000011, 20261202000012, 20261202000013, 20261202000014 are not applied")
        );
        let mut edited = complete();
        edited[12].2 = "00".into();
        assert!(legacy_problem(&edited)
            .unwrap()
            .contains("migration 20261202000013 was applied from an earlier text"));
        let mut failed = complete();
        failed[13].1 = false;
        assert!(legacy_problem(&failed).unwrap().contains("failed part-way"));
        let mut more = complete();
        more.push((20261203000099, true, "00".into()));
        assert!(legacy_problem(&more).unwrap().contains("20261203000099"));
    }

    #[test]
    fn the_digest_changes_with_any_object() {
        let objects = objects();
        let mut changed = objects.clone();
        changed[0].sql.to_mut().push('\n');
        assert_ne!(digest(&objects), digest(&changed));
        assert_eq!(digest(&objects), digest(&objects.clone()));
    }
}
