//! Loading a seed into a new engine container: its content read from the
//! state database once per hash (content is fixed by its hash, so this
//! process keeps it, up to a bound), then handed to the engine over its own
//! protocol, logged in as the agent ([`Engine::seed`]), under a deadline.
//!
//! A sandbox's container gets its seed once it is ready, before anything
//! is published; a warm-pool container of a seeded pool gets it before it
//! is offered, logged in with the pool's password (the same role or user
//! the claimant's password then opens), so a claim serves the seeded data
//! at once.
//!
//! A data-file seed (an RDB file) is instead written into a volume that
//! containers start from ([`data_file`]); a relist removes such volumes
//! once nothing names or asks for them ([`collect`]).

use super::bring_up::{probe_address, InContainer};
use super::Context;
use crate::domain::id::ContainerId;
use crate::domain::labels;
use crate::domain::seed::{self, SeedContent, SeedHash, APPLY_TIMEOUT};
use crate::engine::{Credentials, Engine, EngineError};
use crate::ports::runtime::{RuntimeError, Volume, VolumeFill};
use crate::ports::store::StoreError;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

/// The most seed bytes this process keeps in memory (a seed is at most
/// 16 MiB; the state database holds them all).
const CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Why a seed was not loaded.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// No owner registered the hash (the database checks rows, so only a
    /// row that got past its checks names one).
    #[error("seed {0} is not registered: register its content with sandbox_seed_put and name the hash it returns")]
    Unknown(SeedHash),
    /// The hash was registered for another engine.
    #[error("seed {hash} was registered for {registered}, not for {engine}: register the {engine} seed with sandbox_seed_put('{engine}', content)")]
    WrongEngine {
        /// The seed.
        hash: SeedHash,
        /// The engine it was registered for.
        registered: String,
        /// The engine that was to load it.
        engine: String,
    },
    /// Reading it from the state database failed.
    #[error("reading seed {hash} from the state database failed ({source}); the next reconcile tries again")]
    Store {
        /// The seed.
        hash: SeedHash,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// Where the engine answers is unknown.
    #[error("cannot say where the engine answers to load seed {hash}: {source}")]
    Address {
        /// The seed.
        hash: SeedHash,
        /// Why.
        #[source]
        source: RuntimeError,
    },
    /// The engine refused it.
    #[error("seed {hash}: {source}; fix the content and register it again (a new hash), then name that in the row")]
    Engine {
        /// The seed.
        hash: SeedHash,
        /// The engine's words.
        #[source]
        source: EngineError,
    },
    /// Its data file could not be written into its volume.
    #[error("seed {hash}: writing its data file into a volume failed ({source}); the next reconcile tries again")]
    Write {
        /// The seed.
        hash: SeedHash,
        /// Why.
        #[source]
        source: RuntimeError,
    },
    /// It did not finish in time.
    #[error("seed {hash} did not finish loading within {:?}: make it smaller or faster (its statements run as the agent, each under the same limit)", APPLY_TIMEOUT)]
    Timeout {
        /// The seed.
        hash: SeedHash,
    },
}

/// The seeds this process read, by hash.
#[derive(Default)]
pub(crate) struct Seeds {
    cache: Mutex<HashMap<SeedHash, Arc<SeedContent>>>,
    /// The data-file volumes this process wrote (each once: the file is
    /// fixed by its hash).
    pub(super) written: Mutex<HashSet<String>>,
    /// Held while one is written or collected (a sandbox and a pool
    /// container of one seed may ask at once; the second finds it
    /// written).
    pub(super) writing: tokio::sync::Mutex<()>,
    /// When each data-file volume was last asked for, or first seen
    /// unnamed by a relist of this process ([`collect`]).
    pub(super) used: Mutex<HashMap<String, Instant>>,
}

impl Seeds {
    /// The content of `hash`, from memory or the state database.
    async fn content(&self, ctx: &Context, hash: &SeedHash) -> Result<Arc<SeedContent>, SeedError> {
        if let Some(content) = self.cache.lock().unwrap().get(hash) {
            return Ok(content.clone());
        }
        let content = ctx
            .store
            .seed(hash)
            .await
            .map_err(|source| SeedError::Store {
                hash: hash.clone(),
                source,
            })?
            .ok_or_else(|| SeedError::Unknown(hash.clone()))?;
        let content = Arc::new(content);
        let mut cache = self.cache.lock().unwrap();
        let held: usize = cache.values().map(|c| c.bytes.len()).sum();
        if held + content.bytes.len() > CACHE_BYTES {
            // Content is cheap to read again; a bound is all that matters.
            cache.clear();
        }
        cache.insert(hash.clone(), content.clone());
        Ok(content)
    }
}

/// The volume a new `engine` container of `image` starts from when seed
/// `hash` is a data file (a Redis or Valkey RDB file, which only a start
/// can load: the agent's user may not `RESTORE`): one volume per hash,
/// written once per process, mounted read-only by every container of the
/// seed. `None` for a seed of statements, loaded once the engine is ready
/// ([`load`]).
pub(crate) async fn data_file(
    ctx: &Context,
    engine: &'static dyn Engine,
    image: &str,
    hash: &SeedHash,
) -> Result<Option<Volume>, SeedError> {
    let content = ctx.seeds.content(ctx, hash).await?;
    if !content.is_data_file() {
        return Ok(None);
    }
    same_engine(&content, engine)?;
    let Some(dir) = engine.start_dir() else {
        return Ok(None);
    };
    let short = hash.short();
    let volume = Volume {
        name: volume_name(ctx, engine.name().as_str(), hash),
        path: dir.to_owned(),
        labels: volume_labels(ctx, hash),
        disk: None,
    };
    // Asked for now: not collected within the window, so a container
    // that mounts it finds it.
    ctx.seeds
        .used
        .lock()
        .unwrap()
        .insert(volume.name.clone(), Instant::now());
    if ctx.seeds.written.lock().unwrap().contains(&volume.name) {
        return Ok(Some(volume));
    }
    let _writing = ctx.seeds.writing.lock().await;
    if ctx.seeds.written.lock().unwrap().contains(&volume.name) {
        return Ok(Some(volume));
    }
    let started = Instant::now();
    let fill = VolumeFill {
        name: format!(
            "sandboxd-seed.{}.{}.{short}",
            ctx.config.deployment,
            engine.name()
        ),
        image: image.to_owned(),
        labels: HashMap::from([
            (labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned()),
            (
                labels::DEPLOYMENT.to_owned(),
                ctx.config.deployment.to_string(),
            ),
        ]),
        volume: volume.clone(),
        file: seed::RDB_FILE.to_owned(),
        owner: engine.user().to_owned(),
        content: Arc::new(content.bytes.clone()),
    };
    let written = ctx.runtime.fill_volume(&fill).await;
    ctx.metrics
        .lifecycle
        .seed_loaded(engine.name(), written.is_ok(), started.elapsed());
    written.map_err(|source| SeedError::Write {
        hash: hash.clone(),
        source,
    })?;
    tracing::info!(seed = %hash, volume = %volume.name, "seed data file written");
    ctx.seeds
        .written
        .lock()
        .unwrap()
        .insert(volume.name.clone());
    Ok(Some(volume))
}

/// The labels of a volume of seed `hash` (its data file, its templates):
/// this deployment's, and the seed's, which [`collect`] and operators
/// find it by.
pub(super) fn volume_labels(ctx: &Context, hash: &SeedHash) -> HashMap<String, String> {
    HashMap::from([
        (labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned()),
        (
            labels::DEPLOYMENT.to_owned(),
            ctx.config.deployment.to_string(),
        ),
        (seed::SEED.to_owned(), hash.to_string()),
    ])
}

/// The volume holding data-file seed `hash` of `engine`; its seeded
/// templates add a suffix ([`super::seed_template`]).
pub(super) fn volume_name(ctx: &Context, engine: &str, hash: &SeedHash) -> String {
    format!("{}{engine}-{}", volume_prefix(ctx), hash.short())
}

/// How every seed volume of this deployment is called (data files and
/// seeded templates).
fn volume_prefix(ctx: &Context) -> String {
    format!("{}-seed-", ctx.config.deployment)
}

/// Removes the seed volumes (data files, see [`data_file`], and seeded
/// templates, see [`super::seed_template`]) whose seed no row in
/// `rows` names, that nothing of this process asked for within
/// `--warm-pool-demand-window` (as long as a seeded pool's demand lasts),
/// and that no container mounts (Docker refuses those): what a relist
/// calls with its lists. A volume this process has not seen used is timed
/// from the first relist that finds it unnamed, so a restart removes
/// nothing at once.
pub(crate) async fn collect(
    ctx: &Context,
    rows: &[crate::domain::sandbox::DesiredSandbox],
    volumes: &[crate::ports::runtime::ObservedResource],
) {
    let prefix = volume_prefix(ctx);
    let seed_volumes: Vec<&str> = volumes
        .iter()
        .filter(|v| v.sandbox.is_none() && v.name.starts_with(&prefix))
        .map(|v| v.name.as_str())
        .collect();
    if seed_volumes.is_empty() {
        // Most relists: no row's names need making.
        return;
    }
    let named: HashSet<String> = rows
        .iter()
        .flat_map(|row| {
            row.seeds
                .iter()
                .map(|(engine, hash)| volume_name(ctx, engine.as_str(), hash))
        })
        .collect();
    let window = ctx.config.warm_pool_demand.window;
    let now = Instant::now();
    let due: Vec<String> = {
        let mut used = ctx.seeds.used.lock().unwrap();
        seed_volumes
            .into_iter()
            .filter(|name| !named.contains(seed_volume_of(&prefix, name)))
            .filter(|name| {
                now.duration_since(*used.entry(name.to_string()).or_insert(now)) >= window
            })
            .map(str::to_owned)
            .collect()
    };
    if due.is_empty() {
        return;
    }
    // No write begins while one is removed, and a removed volume is
    // written again the next time it is asked for.
    let _writing = ctx.seeds.writing.lock().await;
    for name in due {
        // Unmarked first, then checked: a [`data_file`] that marks it used
        // after this check finds it unwritten and waits for this lock.
        let was_written = ctx.seeds.written.lock().unwrap().remove(&name);
        let kept = |ctx: &Context| {
            if was_written {
                ctx.seeds.written.lock().unwrap().insert(name.clone());
            }
        };
        if ctx
            .seeds
            .used
            .lock()
            .unwrap()
            .get(&name)
            .is_some_and(|at| now < *at)
        {
            // Asked for since this relist looked.
            kept(ctx);
            continue;
        }
        match ctx
            .runtime
            .remove_volume(&name, &ctx.config.deployment, None)
            .await
        {
            Ok(()) => {
                ctx.seeds.used.lock().unwrap().remove(&name);
                tracing::info!(volume = %name, "removed a seed's volume no row names");
            }
            Err(e) => {
                kept(ctx);
                tracing::debug!(volume = %name, error = %e, "a seed's volume is still in use");
            }
        }
    }
}

/// The data-file volume name a seed volume `name` (of `prefix`) belongs
/// to: itself, or for a seeded template (`…-ENGINE-<hash>-<kind>`) the
/// name without its kind.
fn seed_volume_of<'a>(prefix: &str, name: &'a str) -> &'a str {
    let rest = &name[prefix.len().min(name.len())..];
    match rest.match_indices('-').nth(1) {
        Some((at, _)) => &name[..name.len() - rest.len() + at],
        None => name,
    }
}

/// Refuses `content` registered for another engine than `engine` (the
/// database checks rows, so only a row that got past its checks names one).
fn same_engine(content: &SeedContent, engine: &'static dyn Engine) -> Result<(), SeedError> {
    if content.engine == engine.name().as_str() {
        return Ok(());
    }
    Err(SeedError::WrongEngine {
        hash: content.hash.clone(),
        registered: content.engine.clone(),
        engine: engine.name().to_string(),
    })
}

/// Loads seed `hash` into `engine`'s container `id` (called `name`, its
/// engine port published on `host_port`), logged in with `credentials`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn load(
    ctx: &Context,
    engine: &'static dyn Engine,
    id: &ContainerId,
    name: &str,
    host_port: u16,
    credentials: &Credentials,
    hash: &SeedHash,
) -> Result<(), SeedError> {
    let started = Instant::now();
    let result = async {
        let content = ctx.seeds.content(ctx, hash).await?;
        same_engine(&content, engine)?;
        let (host, port) = probe_address(ctx, engine, id, name, host_port)
            .await
            .map_err(|source| SeedError::Address {
                hash: hash.clone(),
                source,
            })?;
        let exec = InContainer {
            runtime: ctx.runtime.as_ref(),
            id,
        };
        let target = exec.target(&host, port, credentials);
        match tokio::time::timeout(APPLY_TIMEOUT, engine.seed(&target, &content.bytes)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(SeedError::Engine {
                hash: hash.clone(),
                source,
            }),
            Err(_) => Err(SeedError::Timeout { hash: hash.clone() }),
        }
    }
    .await;
    ctx.metrics
        .lifecycle
        .seed_loaded(engine.name(), result.is_ok(), started.elapsed());
    match &result {
        Ok(()) => tracing::info!(
            container = %id,
            seed = %hash,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "seed loaded"
        ),
        Err(e) => tracing::warn!(container = %id, seed = %hash, error = %e, "seed not loaded"),
    }
    result
}

#[cfg(test)]
mod tests {
    use super::seed_volume_of;

    #[test]
    fn a_seed_volume_belongs_to_its_seed_s_data_file_name() {
        let prefix = "d-1-seed-";
        for (name, of) in [
            ("d-1-seed-redis-0123456789ab", "d-1-seed-redis-0123456789ab"),
            (
                "d-1-seed-postgres-0123456789ab-abcdef012345",
                "d-1-seed-postgres-0123456789ab",
            ),
            ("d-1-seed-odd", "d-1-seed-odd"),
        ] {
            assert_eq!(seed_volume_of(prefix, name), of, "{name}");
        }
    }
}
