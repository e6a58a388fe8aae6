//! The engine registry: everything sandboxd knows about Postgres, Redis,
//! Valkey and Mongo lives in one type per engine (one value per engine for
//! the Redis-protocol ones, [`Resp`]), and [`REGISTRY`] lists them.
//!
//! Adding an engine is one type implementing [`Engine`] (or one more
//! [`Resp`] value) and one line in [`REGISTRY`]; the provisioner, the status writer, the allowlist in the
//! database and the metrics all iterate the registry. Engines reach their
//! containers only through a [`Target`]: an address, the login, and a way
//! to run a command inside the container; never through Docker itself.

mod mongo;
mod postgres;
mod postgres_seed;
mod redis;
mod scram;

use crate::domain::checkpoint::CheckpointName;
use crate::domain::container::{ByteStream, ExecOutput, FilterOutput};
use crate::domain::id::EngineName;
use crate::domain::secret::Secret;
use async_trait::async_trait;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

pub use self::mongo::Mongo;
pub use self::postgres::Postgres;
pub use self::redis::{Resp, REDIS, VALKEY};

/// The label of images whose entrypoint speaks sandbox mode (secrets on
/// standard input, least privilege; see `deploy/images/README.md`).
pub const SANDBOX_MODE_LABEL: &str = "io.sandboxd.sandbox-mode=1";

/// Every engine sandboxd can run. One line per engine.
pub static REGISTRY: Registry = Registry::new(&[&Postgres, &REDIS, &Mongo, &VALKEY]);

/// Finds an engine of [`REGISTRY`] by the name used in `sandbox_desired.services`.
pub fn lookup(name: &str) -> Option<&'static dyn Engine> {
    REGISTRY.lookup(name)
}

/// A set of engines: [`REGISTRY`] in production, a test's own in tests.
#[derive(Clone, Copy)]
pub struct Registry(&'static [&'static dyn Engine]);

impl Registry {
    /// A registry of `engines`.
    pub const fn new(engines: &'static [&'static dyn Engine]) -> Self {
        Self(engines)
    }

    /// The engine called `name`, if there is one.
    pub fn lookup(&self, name: &str) -> Option<&'static dyn Engine> {
        self.0.iter().copied().find(|e| e.name().as_str() == name)
    }

    /// The engine a resolved name stands for (`None` only for a name
    /// minted by another registry).
    pub fn get(&self, name: EngineName) -> Option<&'static dyn Engine> {
        self.0.iter().copied().find(|e| e.name() == name)
    }

    /// Every engine, in registry order.
    pub fn iter(&self) -> impl Iterator<Item = &'static dyn Engine> + '_ {
        self.0.iter().copied()
    }

    /// Every engine name, comma-separated, for messages.
    pub fn names(&self) -> String {
        self.iter()
            .map(|e| e.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|e| e.name()))
            .finish()
    }
}

/// Failures while probing an engine or checking its features.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The engine does not answer yet (expected while it starts).
    #[error("{engine} is not answering yet: {reason}")]
    NotReady {
        /// Engine name.
        engine: EngineName,
        /// What the client saw (no credentials).
        reason: String,
    },
    /// A requested feature is not present once the engine is up.
    #[error("{engine} features {missing:?} are not present after start: use an image that ships them (--features-image {engine}=IMAGE) or drop them from the row")]
    FeatureMissing {
        /// Engine name.
        engine: EngineName,
        /// Features that verification did not find.
        missing: Vec<String>,
    },
    /// The seed could not be loaded: the engine's words (first lines).
    #[error("{engine} seed failed: {reason}")]
    Seed {
        /// Engine name.
        engine: EngineName,
        /// What the engine answered (never a credential).
        reason: String,
    },
    /// Talking to the engine failed after it was ready.
    #[error("{engine} client error: {reason}")]
    Client {
        /// Engine name.
        engine: EngineName,
        /// What the client saw (no credentials).
        reason: String,
    },
}

/// Login for one engine container.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub user: String,
    /// Random password.
    pub password: Secret,
    /// Database (or logical db number for Redis).
    pub database: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &self.password)
            .field("database", &self.database)
            .finish()
    }
}

/// Runs a command inside one engine container.
#[async_trait]
pub trait Exec: Send + Sync {
    /// Runs `cmd` with extra environment `env`; `Err` says why it could not run.
    async fn exec(&self, cmd: &[&str], env: Vec<String>) -> Result<ExecOutput, String>;
    /// Runs `cmd` with extra environment `env` and `input` on its
    /// standard input (closed at its end), keeping the last `keep` bytes
    /// of its standard output; `Err` says why it could not run, or why
    /// the input ended early (the process then sees its input cut short).
    async fn filter(
        &self,
        cmd: &[&str],
        _env: Vec<String>,
        _input: ByteStream<'_>,
        _keep: usize,
    ) -> Result<FilterOutput, String> {
        Err(format!("cannot run {} with input here", cmd.join(" ")))
    }
}

/// A seed's content for [`Engine::seed`]: its first bytes, which tell its
/// kind, and all of it as it streams from the state database.
pub struct SeedBytes<'a> {
    /// The first bytes (at most [`crate::domain::seed::HEAD_BYTES`]).
    pub head: &'a [u8],
    /// The whole content, a chunk at a time.
    pub chunks: ByteStream<'a>,
}

/// Where and how the provisioner reaches a running engine container.
pub struct Target<'a> {
    /// Host the controller connects to (127.0.0.1 with the published port).
    pub host: &'a str,
    /// Port the controller connects to.
    pub port: u16,
    /// Login.
    pub credentials: &'a Credentials,
    /// Runs commands inside the container, for checks that must.
    pub exec: &'a dyn Exec,
}

/// How a fork copies an engine's data: a script, `bash -c SCRIPT
/// sandboxd-fork OP DATA TARGET`, where DATA is the source's data
/// directory (under `/proc/1/root`) and TARGET the fork's volume, mounted
/// at [`Engine::start_dir`]. OP `flush` runs in the source itself, serving; OP
/// `copy` in a helper container next to the source's processes (its PID
/// and network namespaces, as its user), with the source frozen when
/// [`ForkCopy::freeze`] says so; `copy` prints `size=<bytes>`.
#[derive(Debug, Clone, Copy)]
pub struct ForkCopy {
    /// The script.
    pub script: &'static str,
    /// Whether the source is frozen while `copy` runs (its files are only
    /// consistent so); an engine whose `copy` takes a snapshot of its own
    /// is not.
    pub freeze: bool,
}

/// One database engine sandboxd can provision.
///
/// Implementations are stateless unit structs; configuration that varies
/// by deployment (images) lives in [`crate::config`].
#[async_trait]
pub trait Engine: Send + Sync + 'static {
    /// Name used in `services`, labels, container names and metrics:
    /// lowercase letters and digits only, so no name with another character
    /// (`no-such-engine`) can ever become an engine.
    fn name(&self) -> EngineName;
    /// Middle part of the emitted environment variables (`<PREFIX>_<GROUP>_HOST`).
    fn env_group(&self) -> &'static str;
    /// Features (extensions, modules) a row may request for this engine.
    fn allowed_features(&self) -> &'static [&'static str];
    /// Image used when no features are requested (built by `deploy/images/build.sh`).
    fn default_image(&self) -> &'static str;
    /// Image used when features are requested.
    fn default_features_image(&self) -> &'static str;
    /// Port the engine listens on inside the container.
    fn port(&self) -> u16;
    /// Data directory, mounted as tmpfs.
    fn data_path(&self) -> &'static str;
    /// Other directories the engine writes to, each a small tmpfs (the root
    /// filesystem is read-only; `/tmp` is always mounted).
    fn runtime_dirs(&self) -> &'static [&'static str];
    /// `uid:gid` the container runs as from its first instruction; the
    /// tmpfs mounts belong to it, so no capability is ever added back.
    fn user(&self) -> &'static str {
        "999:999"
    }
    /// How long the engine may take to become ready before provisioning
    /// fails, unless configured otherwise (`--readiness-timeout`).
    fn readiness_deadline(&self) -> Duration {
        Duration::from_secs(60)
    }
    /// Where a template volume is mounted (the image fills it with
    /// `SANDBOXD_TEMPLATE=build` and starts from it with
    /// `SANDBOXD_TEMPLATE=use`); `None`: the engine starts fast enough
    /// without one.
    fn template_dir(&self) -> Option<&'static str> {
        None
    }
    /// Where the image keeps the binaries and libraries the engine runs,
    /// shared between containers through a volume the template job fills
    /// (`None`: the engine's binaries are small enough to leave in the
    /// image). Only used with a template.
    fn binaries_dir(&self) -> Option<&'static str> {
        None
    }
    /// The login for a container with this password.
    fn credentials(&self, password: Secret) -> Credentials;
    /// Environment of a sandbox container: never a credential. `persistent`:
    /// its data directory is a volume that may hold an earlier container's
    /// data (the images' `SANDBOXD_PERSISTENT=1`).
    fn container_env(
        &self,
        credentials: &Credentials,
        features: &BTreeSet<String>,
        persistent: bool,
    ) -> Vec<String>;
    /// Arguments to the image's entrypoint: never a credential.
    fn container_args(&self, features: &BTreeSet<String>, persistent: bool) -> Vec<String>;
    /// An entrypoint replacing the image's, for images that do not read
    /// their secrets from standard input themselves.
    fn entrypoint(&self) -> Option<Vec<String>> {
        None
    }
    /// The label an image must carry to be run for this engine: that of
    /// images whose entrypoint speaks sandbox mode. `None` when sandboxd
    /// replaces the entrypoint ([`Engine::entrypoint`]).
    fn image_label(&self) -> Option<&'static str> {
        Some(SANDBOX_MODE_LABEL)
    }
    /// Arguments a warm-pool container gets after
    /// [`Engine::container_args`]: what [`Engine::claim`] needs to set a
    /// claimant's credentials later (never a credential itself).
    fn pool_args(&self, _pool: &Credentials) -> Vec<String> {
        Vec::new()
    }
    /// Whether this engine has a warm pool (implements [`Engine::claim`]).
    fn has_pool(&self) -> bool {
        false
    }
    /// Gives a ready warm-pool container, reached at `pool` with the pool's
    /// credentials, `claimant`'s instead, over the engine's own protocol
    /// (no `docker exec`: a claim is on the request's path): afterwards
    /// only `claimant`'s open it, and no session of the pool's is left.
    /// Neither password is sent in clear where the engine can avoid it
    /// (a verifier or a hash is), and none is ever logged.
    async fn claim(&self, _pool: &Target<'_>, _claimant: &Credentials) -> Result<(), EngineError> {
        Err(EngineError::Client {
            engine: self.name(),
            reason: "this engine has no warm pool".to_owned(),
        })
    }
    /// Where a volume of data the engine starts from is mounted (a fork's
    /// copy, a seed's data file; the images' `SANDBOXD_TEMPLATE=use`): a
    /// directory of the image owned by its user, so that a new volume
    /// there is the user's. `None`: the engine starts from no such data.
    fn start_dir(&self) -> Option<&'static str> {
        None
    }
    /// Whether a seed that begins with `head` (its first
    /// [`HEAD_BYTES`](crate::domain::seed::HEAD_BYTES)) is a data file this
    /// engine starts from, written into a volume at its
    /// [`start_dir`](Self::start_dir), rather than statements sent to it
    /// once it is ready.
    fn is_data_file(&self, head: &[u8]) -> bool {
        let _ = head;
        false
    }
    /// How a fork copies this engine's data (see `controller::fork`);
    /// `None`: this engine's sandboxes cannot be forked.
    fn fork_copy(&self) -> Option<ForkCopy> {
        None
    }
    /// Loads `seed` into the engine at `target`, logged in with the
    /// target's credentials (the agent's, never a superuser's), each
    /// statement under [`crate::domain::seed::APPLY_TIMEOUT`]; the caller
    /// bounds the whole. The content streams through, a chunk at a time:
    /// however large the seed, a load holds little of it. An engine
    /// without seeds refuses (the database refuses to register one for
    /// it already).
    async fn seed(&self, _target: &Target<'_>, _seed: SeedBytes<'_>) -> Result<(), EngineError> {
        Err(EngineError::Seed {
            engine: self.name(),
            reason: "this engine takes no seeds".to_owned(),
        })
    }
    /// What the container reads on its standard input, then EOF: its
    /// secrets as `KEY=VALUE` lines (the images' "sandbox mode").
    fn secrets(&self, credentials: &Credentials) -> Secret {
        Secret::new(format!(
            "SANDBOXD_PASSWORD={}\n",
            credentials.password.expose()
        ))
    }
    /// Connection URL for a client.
    fn url(&self, host: &str, port: u16, credentials: &Credentials) -> String;
    /// Environment variables an agent's test suite reads, without the prefix
    /// and group (`HOST`, `PORT`, ...). See [`env_vars`].
    fn env_suffixes(
        &self,
        host: &str,
        port: u16,
        credentials: &Credentials,
    ) -> Vec<(&'static str, String)>;
    /// Succeeds once the real server accepts an authenticated client.
    async fn probe(&self, target: &Target<'_>) -> Result<(), EngineError>;
    /// Returns the features that are present, failing if any of `features` is not.
    async fn verify_features(
        &self,
        target: &Target<'_>,
        features: &BTreeSet<String>,
    ) -> Result<Vec<String>, EngineError>;
    /// How many client connections the engine serves, not counting the one
    /// asking, as the engine itself counts them: a connected client is in
    /// use even when it sends nothing (a sandbox with one is not idle).
    /// `None`: this engine cannot tell (idleness is then requests and
    /// touches only).
    async fn clients(&self, _target: &Target<'_>) -> Result<Option<u32>, EngineError> {
        Ok(None)
    }

    /// The command that prints `size=<bytes>`: about what a checkpoint of
    /// the data now would take. `None`: the engine has no checkpoints.
    fn checkpoint_size_command(&self, _credentials: &Credentials) -> Option<Vec<String>> {
        None
    }
    /// The command that records the data as checkpoint `name` (replacing
    /// one of that name) and prints `size=<bytes>` of it. Never a
    /// credential in it. `None`: the engine has no checkpoints.
    fn checkpoint_command(
        &self,
        _credentials: &Credentials,
        _name: &CheckpointName,
    ) -> Option<Vec<String>> {
        None
    }
    /// The command (run inside the container as its user, `docker exec`)
    /// that brings the data back to checkpoint `name` with the same
    /// credentials and endpoint, closing the sessions of connected
    /// clients; for [`CheckpointName::baseline`], to the empty database
    /// with its features, as provisioning made it (which every engine can
    /// make again from what its container was started with, so nothing is
    /// recorded for it). `None`: no checkpoints.
    fn reset_command(
        &self,
        _credentials: &Credentials,
        _name: &CheckpointName,
    ) -> Option<Vec<String>> {
        None
    }
}

/// `bash -c SCRIPT sandboxd-checkpoint ARGS...` (or `sh`).
fn script(shell: &str, script: &str, args: &[&str]) -> Vec<String> {
    [shell, "-c", script, "sandboxd-checkpoint"]
        .iter()
        .chain(args)
        .map(|s| (*s).to_owned())
        .collect()
}

impl fmt::Debug for dyn Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name().as_str())
    }
}

/// The environment variables for one engine: `<prefix>_<group>_<suffix>`.
pub fn env_vars(
    engine: &dyn Engine,
    prefix: &str,
    host: &str,
    port: u16,
    credentials: &Credentials,
) -> BTreeMap<String, String> {
    engine
        .env_suffixes(host, port, credentials)
        .into_iter()
        .map(|(suffix, value)| (format!("{prefix}_{}_{suffix}", engine.env_group()), value))
        .collect()
}

/// Fails with [`EngineError::FeatureMissing`] unless every wanted feature is present.
fn require_all(
    engine: EngineName,
    wanted: &BTreeSet<String>,
    present: &BTreeSet<String>,
) -> Result<(), EngineError> {
    let missing: Vec<String> = wanted.difference(present).cloned().collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(EngineError::FeatureMissing { engine, missing })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_engine_has_a_unique_well_formed_name_and_env_group() {
        let names: BTreeSet<_> = REGISTRY.iter().map(|e| e.name()).collect();
        let groups: BTreeSet<_> = REGISTRY.iter().map(|e| e.env_group()).collect();
        assert_eq!(names.len(), REGISTRY.iter().count());
        assert_eq!(groups.len(), REGISTRY.iter().count());
        for name in names {
            let s = name.as_str();
            assert!(
                !s.is_empty()
                    && s.len() <= 20
                    && s.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
                "{s}: engine names are lowercase letters and digits"
            );
        }
    }

    #[test]
    fn allowlists_match_the_contract() {
        assert_eq!(
            lookup("postgres").unwrap().allowed_features(),
            &["vector", "postgis", "pg_trgm", "citext", "uuid-ossp"]
        );
        assert_eq!(
            lookup("redis").unwrap().allowed_features(),
            &["search", "json", "bloom"]
        );
        assert!(lookup("mongo").unwrap().allowed_features().is_empty());
        assert!(lookup("no-such-engine").is_none());
    }

    #[test]
    fn env_vars_use_the_configured_prefix() {
        let pg = lookup("postgres").unwrap();
        let creds = pg.credentials(Secret::new("pw"));
        let vars = env_vars(pg, "ROBOCO_TEST", "db-host", 5432, &creds);
        assert_eq!(vars["ROBOCO_TEST_DB_HOST"], "db-host");
        assert_eq!(vars["ROBOCO_TEST_DB_PORT"], "5432");
        assert_eq!(vars["ROBOCO_TEST_DB_PASSWORD"], "pw");
        assert!(vars.keys().all(|k| k.starts_with("ROBOCO_TEST_DB_")));
        let redis = lookup("redis").unwrap();
        let creds = redis.credentials(Secret::new("pw"));
        let vars = env_vars(redis, "SANDBOX", "r", 6379, &creds);
        assert_eq!(vars["SANDBOX_REDIS_URL"], "redis://:pw@r:6379/0");
    }
}
