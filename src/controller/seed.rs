//! Loading a seed into a new engine container: its content streamed from
//! the state database a chunk at a time ([`CHUNK_BYTES`]) into the engine,
//! logged in as the agent ([`Engine::seed`]), under a deadline. A seed is
//! never held whole in this process, and at most `--seed-loads` loads run
//! at once, so seeds cost the controller a few chunks of memory however
//! large and however many they are.
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

use super::env::Env;
use super::reach::{probe_address, InContainer};
use crate::domain::container::ByteStream;
use crate::domain::id::ContainerId;
use crate::domain::labels;
use crate::domain::seed::{self, SeedHash, SeedInfo, APPLY_TIMEOUT};
use crate::engine::{Credentials, Engine, EngineError, SeedBytes, Target};
use crate::ports::runtime::{FileContent, RuntimeError, Volume, VolumeFill};
use crate::ports::store::{Store, StoreError};
use bytes::Bytes;
use futures::{stream, StreamExt};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// How many bytes of a seed one read from the state database takes: what
/// a load holds of the seed at a time.
pub(crate) const CHUNK_BYTES: u32 = 256 * 1024;

/// How many seeds' descriptions this process keeps (a hash, an engine, a
/// size and a few bytes each).
const INFOS: usize = 4096;

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
    /// Its content could not be read from the state database while it
    /// streamed into the engine.
    #[error("reading seed {hash} from the state database failed while loading it ({reason}); the next reconcile tries again")]
    Read {
        /// The seed.
        hash: SeedHash,
        /// Why.
        reason: String,
    },
    /// As many loads as `--seed-loads` allows ran for as long as a load
    /// may take.
    #[error("seed {hash} waited {:?} for one of the --seed-loads slots, all busy loading other seeds; the next reconcile tries again (raise --seed-loads if this persists)", APPLY_TIMEOUT)]
    Busy {
        /// The seed.
        hash: SeedHash,
    },
}

/// The seeds this process loads: what it knows of each, and how many
/// loads may run at once.
pub(crate) struct Seeds {
    infos: Mutex<HashMap<SeedHash, Arc<SeedInfo>>>,
    /// One permit per load (or data file written) running.
    loads: Semaphore,
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
    /// No seed known yet; at most `loads` loads at once.
    pub(crate) fn new(loads: u16) -> Self {
        Self {
            infos: Mutex::default(),
            loads: Semaphore::new(usize::from(loads.max(1))),
            written: Mutex::default(),
            writing: tokio::sync::Mutex::default(),
            used: Mutex::default(),
        }
    }

    /// What the state database says of `hash` (its content is fixed by
    /// the hash, so this process remembers it).
    async fn info(&self, env: &Env, hash: &SeedHash) -> Result<Arc<SeedInfo>, SeedError> {
        if let Some(info) = self.infos.lock().unwrap().get(hash) {
            return Ok(info.clone());
        }
        let info = env
            .store
            .seed(hash)
            .await
            .map_err(|source| SeedError::Store {
                hash: hash.clone(),
                source,
            })?
            .ok_or_else(|| SeedError::Unknown(hash.clone()))?;
        let info = Arc::new(info);
        let mut infos = self.infos.lock().unwrap();
        if infos.len() >= INFOS {
            // Cheap to read again; a bound is all that matters.
            infos.clear();
        }
        infos.insert(hash.clone(), info.clone());
        Ok(info)
    }

    /// Forgets what this process knew of `hash`: the next load reads it
    /// from the state database again (and finds it gone if it was deleted).
    pub(crate) fn forget(&self, hash: &SeedHash) {
        self.infos.lock().unwrap().remove(hash);
    }

    /// A load's slot: waits while `--seed-loads` loads run, at most as
    /// long as one may take.
    async fn slot(&self, hash: &SeedHash) -> Result<SemaphorePermit<'_>, SeedError> {
        match tokio::time::timeout(APPLY_TIMEOUT, self.loads.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; a timeout is the busy case.
            _ => Err(SeedError::Busy { hash: hash.clone() }),
        }
    }
}

/// Why reading a seed's content failed, once it did: the stream's reader
/// (an engine, a volume upload) sees only that its input ended early.
type ReadFailure = Arc<std::sync::OnceLock<String>>;

/// The content of seed `info` as it streams from the state database, a
/// chunk at a time; a failed read (a seed deleted meanwhile, the database
/// gone) ends it with an error, also kept in `failed`.
fn chunks(store: Arc<dyn Store>, info: &SeedInfo, failed: ReadFailure) -> ByteStream<'static> {
    let (hash, size) = (info.hash.clone(), info.size);
    stream::try_unfold(0u64, move |offset| {
        let (store, hash, failed) = (store.clone(), hash.clone(), failed.clone());
        let read = async move {
            if offset >= size {
                return Ok(None);
            }
            let want =
                u32::try_from(size - offset).map_or(CHUNK_BYTES, |left| left.min(CHUNK_BYTES));
            let chunk = store
                .seed_chunk(&hash, offset, want)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "the seed was deleted meanwhile".to_owned())?;
            if chunk.len() != want as usize {
                return Err(format!(
                    "it is shorter than the {size} bytes it was registered with"
                ));
            }
            Ok(Some((Bytes::from(chunk), offset + u64::from(want))))
        };
        async move {
            read.await.inspect_err(|reason: &String| {
                let _ = failed.set(reason.clone());
            })
        }
    })
    .boxed()
}

/// Writes seed `info`'s data file into `volume` with a helper of `engine`'s
/// `image`, one at a time per seed.
async fn write(
    env: &Env,
    seeds: &Seeds,
    engine: &'static dyn Engine,
    image: &str,
    info: &SeedInfo,
    volume: &Volume,
) -> Result<(), SeedError> {
    let hash = &info.hash;
    let _slot = seeds.slot(hash).await?;
    let started = Instant::now();
    let deployment = &env.config.deployment;
    let fill = VolumeFill {
        name: format!(
            "sandboxd-seed.{deployment}.{}.{}",
            engine.name(),
            hash.hex()
        ),
        image: image.to_owned(),
        labels: HashMap::from([
            (labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned()),
            (labels::DEPLOYMENT.to_owned(), deployment.to_string()),
        ]),
        volume: volume.clone(),
        file: seed::RDB_FILE.to_owned(),
        owner: engine.user().to_owned(),
    };
    let failed = ReadFailure::default();
    let content = FileContent {
        len: info.size,
        chunks: chunks(env.store.clone(), info, failed.clone()),
    };
    let written = env.runtime.fill_volume(&fill, content).await;
    env.metrics
        .lifecycle
        .seed_loaded(engine.name(), written.is_ok(), started.elapsed());
    written.map_err(|source| match failed.get() {
        Some(reason) => SeedError::Read {
            hash: hash.clone(),
            reason: reason.clone(),
        },
        None => SeedError::Write {
            hash: hash.clone(),
            source,
        },
    })
}

/// The volume a new `engine` container of `image` starts from when seed
/// `hash` is a data file (a Redis or Valkey RDB file, which only a start
/// can load: the agent's user may not `RESTORE`): one volume per hash,
/// written once per process, mounted read-only by every container of the
/// seed. `None` for a seed of statements, loaded once the engine is ready
/// ([`load`]).
pub(crate) async fn data_file(
    env: &Env,
    seeds: &Seeds,
    engine: &'static dyn Engine,
    image: &str,
    hash: &SeedHash,
) -> Result<Option<Volume>, SeedError> {
    let info = seeds.info(env, hash).await?;
    #[cfg(any(test, feature = "simulation"))]
    if crate::domain::mutation::on(crate::domain::mutation::Mutation::IgnoreDataFile) {
        return Ok(None);
    }
    if !engine.is_data_file(&info.head) {
        return Ok(None);
    }
    same_engine(&info, engine)?;
    let Some(dir) = engine.start_dir() else {
        return Ok(None);
    };
    let volume = Volume {
        name: volume_name(env, engine.name().as_str(), hash),
        path: dir.to_owned(),
        labels: volume_labels(env, hash),
        disk: None,
    };
    // Asked for now: not collected within the window, so a container
    // that mounts it finds it.
    seeds
        .used
        .lock()
        .unwrap()
        .insert(volume.name.clone(), Instant::now());
    if seeds.written.lock().unwrap().contains(&volume.name) {
        return Ok(Some(volume));
    }
    let _writing = seeds.writing.lock().await;
    if seeds.written.lock().unwrap().contains(&volume.name) {
        return Ok(Some(volume));
    }
    write(env, seeds, engine, image, &info, &volume).await?;
    tracing::info!(seed = %hash, volume = %volume.name, "seed data file written");
    seeds.written.lock().unwrap().insert(volume.name.clone());
    Ok(Some(volume))
}

/// Forgets `volume`, a seed's data file or seeded template that a
/// container did not start from: a data file is written again by the
/// next start; a template's containers load the seed again until a seeded
/// pool container copies it anew.
pub(crate) fn forget(seeds: &Seeds, volume: &Volume) {
    seeds.written.lock().unwrap().remove(&volume.name);
}

/// The labels of a volume of seed `hash` (its data file, its templates):
/// this deployment's, and the seed's, which [`collect`] and operators
/// find it by.
pub(super) fn volume_labels(env: &Env, hash: &SeedHash) -> HashMap<String, String> {
    HashMap::from([
        (labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned()),
        (
            labels::DEPLOYMENT.to_owned(),
            env.config.deployment.to_string(),
        ),
        (seed::SEED.to_owned(), hash.to_string()),
    ])
}

/// The volume holding data-file seed `hash` of `engine`; its seeded
/// templates add a suffix ([`super::seed_template`]). The whole hash: no
/// two seeds share a volume, however their hashes begin.
pub(super) fn volume_name(env: &Env, engine: &str, hash: &SeedHash) -> String {
    format!("{}{engine}-{}", volume_prefix(env), hash.hex())
}

/// How every seed volume of this deployment is called (data files and
/// seeded templates).
fn volume_prefix(env: &Env) -> String {
    format!("{}-seed-", env.config.deployment)
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
    env: &Env,
    seeds: &Seeds,
    rows: &[crate::domain::sandbox::DesiredSandbox],
    volumes: &[crate::ports::runtime::ObservedResource],
) {
    let now = Instant::now();
    let due = unnamed_and_unused(env, seeds, rows, volumes, now);
    if due.is_empty() {
        return;
    }
    // No write begins while one is removed, and a removed volume is
    // written again the next time it is asked for.
    let _writing = seeds.writing.lock().await;
    for name in due {
        remove_unless_asked(env, seeds, name, now).await;
    }
}

/// The seed volumes among `volumes` that no row of `rows` names and that
/// nothing of this process asked for within the demand window before
/// `now` (one not seen used is timed from the first look that finds it
/// unnamed).
fn unnamed_and_unused(
    env: &Env,
    seeds: &Seeds,
    rows: &[crate::domain::sandbox::DesiredSandbox],
    volumes: &[crate::ports::runtime::ObservedResource],
    now: Instant,
) -> Vec<String> {
    let prefix = volume_prefix(env);
    let seed_volumes: Vec<&str> = volumes
        .iter()
        .filter(|v| v.sandbox.is_none() && v.name.starts_with(&prefix))
        .map(|v| v.name.as_str())
        .collect();
    if seed_volumes.is_empty() {
        // Most relists: no row's names need making.
        return Vec::new();
    }
    let named: HashSet<String> = rows
        .iter()
        .flat_map(|row| {
            row.seeds
                .iter()
                .map(|(engine, hash)| volume_name(env, engine.as_str(), hash))
        })
        .collect();
    let window = env.config.warm_pool_demand.window;
    let mut used = seeds.used.lock().unwrap();
    seed_volumes
        .into_iter()
        .filter(|name| !named.contains(seed_volume_of(&prefix, name)))
        .filter(|name| now.duration_since(*used.entry(name.to_string()).or_insert(now)) >= window)
        .map(str::to_owned)
        .collect()
}

/// Removes the seed volume `name`, due at `now`, unless it was asked for
/// since (or a container mounts it: Docker refuses).
async fn remove_unless_asked(env: &Env, seeds: &Seeds, name: String, now: Instant) {
    // Unmarked first, then checked: a [`data_file`] that marks it used
    // after this check finds it unwritten and waits for the writing lock.
    let was_written = seeds.written.lock().unwrap().remove(&name);
    let kept = || {
        if was_written {
            seeds.written.lock().unwrap().insert(name.clone());
        }
    };
    let asked = (seeds.used.lock().unwrap().get(&name)).is_some_and(|at| now < *at);
    if asked {
        // Asked for since this relist looked.
        kept();
        return;
    }
    match env
        .runtime
        .remove_volume(&name, &env.config.deployment, None)
        .await
    {
        Ok(()) => {
            seeds.used.lock().unwrap().remove(&name);
            tracing::info!(volume = %name, "removed a seed's volume no row names");
        }
        Err(e) => {
            kept();
            tracing::debug!(volume = %name, error = %e, "a seed's volume is still in use");
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

/// Refuses seed `info` registered for another engine than `engine` (the
/// database checks rows, so only a row that got past its checks names one).
fn same_engine(info: &SeedInfo, engine: &'static dyn Engine) -> Result<(), SeedError> {
    if info.engine == engine.name().as_str() {
        return Ok(());
    }
    Err(SeedError::WrongEngine {
        hash: info.hash.clone(),
        registered: info.engine.clone(),
        engine: engine.name().to_string(),
    })
}

/// Loads seed `hash` into `engine`'s container `id` (called `name`, its
/// engine port published on `host_port`), logged in with `credentials`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn load(
    env: &Env,
    seeds: &Seeds,
    engine: &'static dyn Engine,
    id: &ContainerId,
    name: &str,
    host_port: u16,
    credentials: &Credentials,
    hash: &SeedHash,
) -> Result<(), SeedError> {
    let started = Instant::now();
    let result = async {
        let info = seeds.info(env, hash).await?;
        same_engine(&info, engine)?;
        let (host, port) = probe_address(env, engine, id, name, host_port)
            .await
            .map_err(|source| SeedError::Address {
                hash: hash.clone(),
                source,
            })?;
        let exec = InContainer {
            runtime: env.runtime.as_ref(),
            id,
        };
        let target = exec.target(&host, port, credentials);
        let _slot = seeds.slot(hash).await?;
        feed(env, engine, &target, &info).await
    }
    .await;
    env.metrics
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

/// Streams the seed `info` names from the state database into `engine`
/// at `target`, within [`APPLY_TIMEOUT`].
async fn feed(
    env: &Env,
    engine: &'static dyn Engine,
    target: &Target<'_>,
    info: &SeedInfo,
) -> Result<(), SeedError> {
    let hash = &info.hash;
    let failed = ReadFailure::default();
    let content = SeedBytes {
        head: &info.head,
        chunks: chunks(env.store.clone(), info, failed.clone()),
    };
    match tokio::time::timeout(APPLY_TIMEOUT, engine.seed(target, content)).await {
        Ok(Ok(())) => Ok(()),
        // The engine saw its input end early: the state database's
        // fault, not the seed's.
        Ok(Err(_)) if failed.get().is_some() => Err(SeedError::Read {
            hash: hash.clone(),
            reason: failed.get().cloned().unwrap_or_default(),
        }),
        Ok(Err(source)) => Err(SeedError::Engine {
            hash: hash.clone(),
            source,
        }),
        Err(_) => Err(SeedError::Timeout { hash: hash.clone() }),
    }
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
