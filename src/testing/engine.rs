//! A fake engine: no client library, readiness through the runtime's exec.

use crate::domain::checkpoint::CheckpointName;
use crate::domain::container::ExecOutput;
use crate::domain::id::EngineName;
use crate::domain::secret::Secret;
use crate::engine::{Credentials, Engine, EngineError, ForkCopy, Registry, SeedBytes, Target};
use async_trait::async_trait;
use futures::StreamExt;
use std::collections::BTreeSet;
use std::time::Duration;

/// The fake engine's name.
const NAME: EngineName = EngineName::of_engine("fakedb");

/// The fake engine's copy script: the fake runtime runs `copy` in a
/// helper by copying the data's origin into the helper's volume.
pub(crate) const FORK_SCRIPT: &str = "fakedb-fork";
/// How a data-file seed of the fake engine begins (see
/// [`Engine::is_data_file`]).
pub(crate) const DATA_FILE: &[u8] = b"FAKEDATA";

/// An engine whose probe asks the container (through exec) whether it runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FakeEngine {
    /// Whether it starts from a template (mounted at [`TEMPLATE_DIR`],
    /// its binaries at [`BINARIES_DIR`]) as Postgres does.
    templated: bool,
}

/// Where the templated fake engine's template is mounted.
const TEMPLATE_DIR: &str = "/template";
/// Where the templated fake engine's binaries are mounted.
const BINARIES_DIR: &str = "/binaries";

/// A registry with only [`FakeEngine::PLAIN`].
pub(crate) static FAKE_ENGINES: Registry = Registry::new(&[&FakeEngine::PLAIN]);

/// A registry with only [`FakeEngine::TEMPLATED`] (the simulation's).
pub(crate) static TEMPLATED_FAKE_ENGINES: Registry = Registry::new(&[&FakeEngine::TEMPLATED]);

impl FakeEngine {
    /// The engine's name.
    pub(crate) const NAME: EngineName = NAME;
    /// The fake engine without templates (the controller's unit tests').
    pub(crate) const PLAIN: FakeEngine = FakeEngine { templated: false };
    /// The fake engine with a template and shared binaries, as Postgres.
    pub(crate) const TEMPLATED: FakeEngine = FakeEngine { templated: true };
}

#[async_trait]
impl Engine for FakeEngine {
    fn name(&self) -> EngineName {
        NAME
    }
    fn env_group(&self) -> &'static str {
        "FAKE"
    }
    fn allowed_features(&self) -> &'static [&'static str] {
        &["alpha", "beta"]
    }
    fn default_image(&self) -> &'static str {
        "fakedb:1"
    }
    fn default_features_image(&self) -> &'static str {
        "fakedb-ext:1"
    }
    fn port(&self) -> u16 {
        7000
    }
    fn data_path(&self) -> &'static str {
        "/data"
    }
    fn readiness_deadline(&self) -> Duration {
        Duration::from_secs(5)
    }
    fn credentials(&self, password: Secret) -> Credentials {
        Credentials {
            user: "fake".into(),
            password,
            database: "fake".into(),
        }
    }
    fn runtime_dirs(&self) -> &'static [&'static str] {
        &["/run/fakedb"]
    }
    fn container_env(
        &self,
        _c: &Credentials,
        features: &BTreeSet<String>,
        _persistent: bool,
    ) -> Vec<String> {
        let features: Vec<&str> = features.iter().map(String::as_str).collect();
        vec![format!("FAKEDB_FEATURES={}", features.join(","))]
    }
    fn container_args(&self, _features: &BTreeSet<String>, _persistent: bool) -> Vec<String> {
        Vec::new()
    }
    fn url(&self, host: &str, port: u16, c: &Credentials) -> String {
        format!("fake://{}@{host}:{port}", c.user)
    }
    fn env_suffixes(&self, host: &str, port: u16, _c: &Credentials) -> Vec<(&'static str, String)> {
        vec![("HOST", host.to_owned()), ("PORT", port.to_string())]
    }
    async fn probe(&self, target: &Target<'_>) -> Result<(), EngineError> {
        run(target, "probe", Vec::new(), not_ready).await.map(drop)
    }
    fn has_pool(&self) -> bool {
        true
    }
    fn template_dir(&self) -> Option<&'static str> {
        self.templated.then_some(TEMPLATE_DIR)
    }
    fn binaries_dir(&self) -> Option<&'static str> {
        self.templated.then_some(BINARIES_DIR)
    }
    /// A fork's copy starts from here (the fake runtime carries the data's
    /// origin through the volume).
    fn start_dir(&self) -> Option<&'static str> {
        Some("/start")
    }
    /// A seed that begins with [`DATA_FILE`] is a data file, as an RDB
    /// file is Redis's: written into a volume the container starts from.
    fn is_data_file(&self, head: &[u8]) -> bool {
        head.starts_with(DATA_FILE)
    }
    /// Its copy needs the source frozen, as Postgres's does.
    fn fork_copy(&self) -> Option<ForkCopy> {
        Some(ForkCopy {
            script: FORK_SCRIPT,
            freeze: true,
        })
    }
    /// Through exec (a real engine speaks its protocol): the fake runtime
    /// lets the claimant's password in where the pool's opened.
    async fn claim(&self, pool: &Target<'_>, claimant: &Credentials) -> Result<(), EngineError> {
        let env = vec![
            format!(
                "FAKEDB_POOL_PASSWORD={}",
                pool.credentials.password.expose()
            ),
            format!("FAKEDB_PASSWORD={}", claimant.password.expose()),
        ];
        run(pool, "claim", env, client).await.map(drop)
    }
    /// Through exec: the fake runtime records the content in the
    /// container (one that begins with `fail` fails).
    async fn seed(&self, target: &Target<'_>, seed: SeedBytes<'_>) -> Result<(), EngineError> {
        let chunks: Vec<Result<bytes::Bytes, String>> = seed.chunks.collect().await;
        let mut content = Vec::new();
        for chunk in chunks {
            content.extend_from_slice(&chunk.map_err(seed_failed)?);
        }
        let env = vec![format!("FAKEDB_SEED={}", String::from_utf8_lossy(&content))];
        run(target, "seed", env, seed_failed).await.map(drop)
    }
    async fn clients(&self, target: &Target<'_>) -> Result<Option<u32>, EngineError> {
        let out = run(target, "clients", Vec::new(), client).await?;
        Ok(out.output.trim().parse().ok())
    }
    fn checkpoint_size_command(&self, _c: &Credentials) -> Option<Vec<String>> {
        Some(vec!["echo".into(), "size=4096".into()])
    }
    fn checkpoint_command(&self, _c: &Credentials, name: &CheckpointName) -> Option<Vec<String>> {
        Some(vec![
            "echo".into(),
            format!("checkpoint {name}"),
            "\nsize=4096".into(),
        ])
    }
    fn reset_command(&self, _c: &Credentials, name: &CheckpointName) -> Option<Vec<String>> {
        // A checkpoint called `broken` cannot be brought back.
        let program = if name.as_str() == "broken" {
            "false"
        } else {
            "echo"
        };
        Some(vec![program.into(), format!("reset {name}")])
    }
    async fn verify_features(
        &self,
        _target: &Target<'_>,
        features: &BTreeSet<String>,
    ) -> Result<Vec<String>, EngineError> {
        Ok(features.iter().cloned().collect())
    }
}

/// Runs `cmd` in the target's container with `env`: what it printed, or
/// `fail`'s error if it could not run or exited other than 0.
async fn run(
    target: &Target<'_>,
    cmd: &str,
    env: Vec<String>,
    fail: fn(String) -> EngineError,
) -> Result<ExecOutput, EngineError> {
    let out = target.exec.exec(&[cmd], env).await.map_err(fail)?;
    if out.exit_code == 0 {
        Ok(out)
    } else {
        Err(fail(format!(
            "{cmd} exited {}: {}",
            out.exit_code,
            out.output.trim()
        )))
    }
}

fn not_ready(reason: String) -> EngineError {
    EngineError::NotReady {
        engine: NAME,
        reason,
    }
}

fn seed_failed(reason: String) -> EngineError {
    EngineError::Seed {
        engine: NAME,
        reason,
    }
}

fn client(reason: String) -> EngineError {
    EngineError::Client {
        engine: NAME,
        reason,
    }
}
