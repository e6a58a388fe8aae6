//! PostgreSQL. The agent's role owns its database and its `public` schema
//! and may create databases and trusted extensions, but is no superuser.
//! The image's sandbox mode installs the requested extensions as the
//! bootstrap superuser `postgres`, which has no password and exists only on
//! the Unix socket inside the container, before the server listens on TCP.

use super::{
    postgres_seed, require_all, script, Credentials, Engine, EngineError, ForkCopy, SeedBytes,
    Target,
};
use crate::domain::checkpoint::CheckpointName;
use crate::domain::id::EngineName;
use crate::domain::secret::Secret;
use crate::domain::seed;
use async_trait::async_trait;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};
use std::collections::BTreeSet;
use std::time::Duration;

/// The PostgreSQL engine.
#[derive(Debug, Clone, Copy)]
pub struct Postgres;

const NAME: EngineName = EngineName::of_engine("postgres");
const USER: &str = "sandbox";
const DATABASE: &str = "sandbox";

/// Checkpoints are template databases inside the sandbox's own cluster
/// (`CREATE DATABASE ... TEMPLATE ... STRATEGY FILE_COPY`: a 136 MB
/// database is copied in about 0.1 s on tmpfs), made and used by the
/// bootstrap superuser on the Unix socket; the baseline is the database
/// made again as provisioning made it (its features are in the container's
/// environment). See the script.
const CHECKPOINTS: &str = include_str!("checkpoint/postgres.sh");

/// A fork copies the frozen source's data directory, which the fork's
/// container starts from as from a template (recovering it as after a
/// crash). See the script.
const FORK_COPY: &str = include_str!("fork/postgres.sh");

impl Postgres {
    async fn connect(&self, target: &Target<'_>) -> Result<PgConnection, String> {
        let c = target.credentials;
        let options = PgConnectOptions::new()
            .host(target.host)
            .port(target.port)
            .username(&c.user)
            .password(c.password.expose())
            .database(&c.database)
            .disable_statement_logging();
        match tokio::time::timeout(Duration::from_secs(3), options.connect()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("connection timed out".into()),
        }
    }
}

#[async_trait]
impl Engine for Postgres {
    fn name(&self) -> EngineName {
        NAME
    }
    fn env_group(&self) -> &'static str {
        "DB"
    }
    fn allowed_features(&self) -> &'static [&'static str] {
        &["vector", "postgis", "pg_trgm", "citext", "uuid-ossp"]
    }
    fn default_image(&self) -> &'static str {
        "sandboxd/postgres:17"
    }
    fn default_features_image(&self) -> &'static str {
        "sandboxd/postgres-ext:17"
    }
    fn port(&self) -> u16 {
        5432
    }
    fn data_path(&self) -> &'static str {
        "/var/lib/postgresql/data"
    }
    fn template_dir(&self) -> Option<&'static str> {
        Some("/var/lib/postgresql/template")
    }
    fn start_dir(&self) -> Option<&'static str> {
        // The template's: the image starts from a fork's copy as from one.
        self.template_dir()
    }
    fn fork_copy(&self) -> Option<ForkCopy> {
        Some(ForkCopy {
            script: FORK_COPY,
            freeze: true,
        })
    }
    fn binaries_dir(&self) -> Option<&'static str> {
        // The server, its libraries (ICU alone is tens of MB) and the
        // entrypoint's tools: about 20 MiB of them are resident per
        // container when each reads them through its own fuse-overlayfs
        // mount.
        Some("/usr")
    }
    fn credentials(&self, password: Secret) -> Credentials {
        Credentials {
            user: USER.into(),
            password,
            database: DATABASE.into(),
        }
    }
    fn runtime_dirs(&self) -> &'static [&'static str] {
        &["/var/run/postgresql"]
    }
    fn container_env(
        &self,
        c: &Credentials,
        features: &BTreeSet<String>,
        persistent: bool,
    ) -> Vec<String> {
        let features: Vec<&str> = features.iter().map(String::as_str).collect();
        let mut env = vec![
            "SANDBOXD_SANDBOX=1".to_owned(),
            format!("SANDBOXD_USER={}", c.user),
            format!("SANDBOXD_DATABASE={}", c.database),
            format!("SANDBOXD_FEATURES={}", features.join(",")),
            format!("PGDATA={}", self.data_path()),
        ];
        if persistent {
            env.push("SANDBOXD_PERSISTENT=1".to_owned());
        }
        env
    }
    fn container_args(&self, _features: &BTreeSet<String>, persistent: bool) -> Vec<String> {
        if persistent {
            // Data that must outlive the container: the server's defaults.
            return Vec::new();
        }
        // Throwaway data on tmpfs: durability buys nothing, speed does.
        // And density: the data dir is tmpfs, counted in the container's
        // memory with the server's processes: minimal WAL (the image's
        // entrypoint initialises such a cluster with 1 MB segments and
        // keeps few), no replication, few connection slots and workers, a
        // small buffer pool and no JIT (docs/architecture.md, "Density").
        [
            "fsync=off",
            "synchronous_commit=off",
            "full_page_writes=off",
            "wal_level=minimal",
            "max_wal_senders=0",
            "max_replication_slots=0",
            "shared_buffers=16MB",
            "max_connections=32",
            "max_worker_processes=2",
            "max_parallel_workers=0",
            "max_parallel_workers_per_gather=0",
            "autovacuum_max_workers=1",
            "jit=off",
            "huge_pages=off",
        ]
        .into_iter()
        .flat_map(|setting| ["-c".to_owned(), setting.to_owned()])
        .collect()
    }
    fn has_pool(&self) -> bool {
        true
    }
    async fn claim(&self, pool: &Target<'_>, claimant: &Credentials) -> Result<(), EngineError> {
        // The same role and database in every container: only the password
        // changes, which any role may do to its own. The statement carries
        // the SCRAM verifier, never the password.
        let failed = |reason: String| EngineError::Client {
            engine: NAME,
            reason: format!("setting the claimant's password failed: {reason}"),
        };
        if pool.credentials.user != claimant.user || pool.credentials.database != claimant.database
        {
            return Err(failed(
                "the pool's role or database is not the claimant's".into(),
            ));
        }
        let mut conn = self.connect(pool).await.map_err(failed)?;
        let verifier = super::scram::verifier(claimant.password.expose());
        // A verifier is base64, digits, `$`, `:` and letters: no quote can
        // end the literal (and ALTER ROLE takes no parameters).
        debug_assert!(!verifier.contains('\''));
        let alter = format!("ALTER ROLE CURRENT_USER PASSWORD '{verifier}'");
        let result = async {
            sqlx::query(&alter)
                .persistent(false)
                .execute(&mut conn)
                .await?;
            // The pool's own sessions (none is expected) end here.
            sqlx::query(
                "SELECT count(pg_catalog.pg_terminate_backend(pid)) FROM pg_catalog.pg_stat_activity \
                 WHERE usename = current_user AND pid <> pg_catalog.pg_backend_pid()",
            )
            .execute(&mut conn)
            .await
        }
        .await;
        let _ = conn.close().await;
        result.map(|_| ()).map_err(|e| failed(e.to_string()))
    }
    async fn seed(&self, target: &Target<'_>, seed: SeedBytes<'_>) -> Result<(), EngineError> {
        // As the agent, over its own login, from a client next to the
        // engine: the seed can do what the agent can (it owns the database
        // and schema public), nothing more.
        postgres_seed::load(target.exec, self.port(), target.credentials, seed)
            .await
            .map_err(|reason| EngineError::Seed {
                engine: NAME,
                reason: seed::first_lines(&reason),
            })
    }
    fn url(&self, host: &str, port: u16, c: &Credentials) -> String {
        format!(
            "postgres://{}:{}@{host}:{port}/{}",
            c.user,
            c.password.expose(),
            c.database
        )
    }
    fn env_suffixes(&self, host: &str, port: u16, c: &Credentials) -> Vec<(&'static str, String)> {
        vec![
            ("HOST", host.to_owned()),
            ("PORT", port.to_string()),
            ("USER", c.user.clone()),
            ("PASSWORD", c.password.expose().to_owned()),
            // The database to connect to for CREATE DATABASE: the agent's
            // own (it may create databases; `postgres` is closed to it).
            ("ADMIN_DB", c.database.clone()),
            ("NAME", c.database.clone()),
            ("URL", self.url(host, port, c)),
        ]
    }

    async fn probe(&self, target: &Target<'_>) -> Result<(), EngineError> {
        // The image's temporary init server listens only on a Unix socket, so
        // an authenticated TCP login can only reach the real server.
        let not_ready = |reason: String| EngineError::NotReady {
            engine: NAME,
            reason,
        };
        let mut conn = self.connect(target).await.map_err(not_ready)?;
        sqlx::query("SELECT 1")
            .execute(&mut conn)
            .await
            .map_err(|e| not_ready(e.to_string()))?;
        let _ = conn.close().await;
        Ok(())
    }

    async fn clients(&self, target: &Target<'_>) -> Result<Option<u32>, EngineError> {
        let failed = |reason: String| EngineError::Client {
            engine: NAME,
            reason: format!("counting client connections failed: {reason}"),
        };
        let mut conn = self.connect(target).await.map_err(failed)?;
        // Client backends only (no background workers), this one left out.
        let count: Result<i64, _> = sqlx::query_scalar(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity \
             WHERE backend_type = 'client backend' AND pid <> pg_catalog.pg_backend_pid()",
        )
        .fetch_one(&mut conn)
        .await;
        let _ = conn.close().await;
        let count = count.map_err(|e| failed(e.to_string()))?;
        Ok(Some(u32::try_from(count).unwrap_or(u32::MAX)))
    }

    async fn verify_features(
        &self,
        target: &Target<'_>,
        features: &BTreeSet<String>,
    ) -> Result<Vec<String>, EngineError> {
        let mut conn = self
            .connect(target)
            .await
            .map_err(|reason| EngineError::Client {
                engine: NAME,
                reason,
            })?;
        let installed: Vec<String> =
            sqlx::query_scalar("SELECT extname::text FROM pg_extension ORDER BY extname")
                .fetch_all(&mut conn)
                .await
                .map_err(|e| EngineError::Client {
                    engine: NAME,
                    reason: e.to_string(),
                })?;
        let _ = conn.close().await;
        let present: BTreeSet<String> = installed
            .into_iter()
            .filter(|e| self.allowed_features().contains(&e.as_str()))
            .collect();
        require_all(NAME, features, &present)?;
        Ok(present.into_iter().collect())
    }

    fn checkpoint_size_command(&self, c: &Credentials) -> Option<Vec<String>> {
        Some(script(
            "bash",
            CHECKPOINTS,
            &["size", &c.database, &c.user, "-"],
        ))
    }
    fn checkpoint_command(&self, c: &Credentials, name: &CheckpointName) -> Option<Vec<String>> {
        Some(script(
            "bash",
            CHECKPOINTS,
            &["checkpoint", &c.database, &c.user, name.as_str()],
        ))
    }
    fn reset_command(&self, c: &Credentials, name: &CheckpointName) -> Option<Vec<String>> {
        Some(script(
            "bash",
            CHECKPOINTS,
            &["reset", &c.database, &c.user, name.as_str()],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkpoint_script_is_valid_bash_and_carries_no_password() {
        let c = Postgres.credentials(Secret::new("s3cretPassw0rd1234"));
        let name = CheckpointName::parse("before").unwrap();
        for cmd in [
            Postgres.checkpoint_command(&c, &name).unwrap(),
            Postgres
                .reset_command(&c, &CheckpointName::baseline())
                .unwrap(),
        ] {
            assert!(!cmd.join(" ").contains("s3cret"));
            assert_eq!(cmd[0], "bash");
        }
        let out = std::process::Command::new("bash")
            .args(["-n", "-c", CHECKPOINTS])
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
