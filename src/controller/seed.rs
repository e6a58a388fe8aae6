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

use super::bring_up::{probe_address, InContainer};
use super::Context;
use crate::domain::id::ContainerId;
use crate::domain::seed::{SeedContent, SeedHash, APPLY_TIMEOUT};
use crate::engine::{Credentials, Engine, EngineError};
use crate::ports::runtime::RuntimeError;
use crate::ports::store::StoreError;
use std::collections::HashMap;
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
        if content.engine != engine.name().as_str() {
            return Err(SeedError::WrongEngine {
                hash: hash.clone(),
                registered: content.engine.clone(),
                engine: engine.name().to_string(),
            });
        }
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
