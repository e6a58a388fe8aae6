//! Seeded templates: a seed of statements (SQL, an archive, commands) is
//! loaded into a container once per engine image, feature set and seed
//! hash, and every later container of that kind starts from a copy.
//!
//! The copy is taken from a seeded warm-pool container right after its
//! seed was loaded and **before** it is offered: nothing of any agent is in
//! it yet, only the image's template and the seed. It is the fork's copy
//! ([`super::copy::snapshot`]: a helper next to the container, the engine
//! flushed, then frozen for the copy) into a volume of this deployment,
//! `DEP-seed-ENGINE-<hash 12>-<image and features 12>`. A sandbox's cold
//! start, a heal, and the pool's next containers then start from it with
//! the images' `SANDBOXD_TEMPLATE=use`, under their own fresh password,
//! and load nothing.
//!
//! Until the copy exists, a container loads the seed once its engine is
//! ready, as without templates: nothing ever waits for one. A copy is made
//! once per process (a volume a previous process left is filled again by
//! the first seeded pool container, whose copy replaces it whole), and
//! [`super::seed::collect`] removes it with the seed's other volumes once
//! no row names the seed. Off with `--templates false`, for persistent
//! sandboxes (their data is a volume of their own), and under the Swarm
//! backend (the volume would be on one node).

use super::copy::{self, Snapshot};
use super::env::Env;
use super::seed::Seeds;
use crate::domain::id::ContainerId;
use crate::domain::seed::{self, SeedHash};
use crate::engine::{Credentials, Engine, ForkCopy};
use crate::ports::runtime::Volume;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use tokio::time::Instant;

/// What a seeded template is made for.
pub(crate) struct Kind<'a> {
    /// The engine.
    pub(crate) engine: &'static dyn Engine,
    /// The image reference its containers run.
    pub(crate) image: &'a str,
    /// Their features.
    pub(crate) features: &'a BTreeSet<String>,
    /// The seed.
    pub(crate) hash: &'a SeedHash,
}

/// The seeded template a new container of `kind` starts from, when this
/// process has made it (marked as asked for, so it is not collected
/// meanwhile); `None` to load the seed once the engine is ready.
pub(crate) async fn ready(env: &Env, seeds: &Seeds, kind: &Kind<'_>) -> Option<Volume> {
    let volume = volume(env, kind).await?;
    seeds
        .used
        .lock()
        .unwrap()
        .insert(volume.name.clone(), Instant::now());
    seeds
        .written
        .lock()
        .unwrap()
        .contains(&volume.name)
        .then_some(volume)
}

/// Copies container `source` of `kind` (its seed just loaded, logged in
/// with `credentials`, not offered to anyone yet) into its seeded
/// template, unless this process made that already. A copy that fails
/// is logged and costs nothing else: the seed keeps being loaded.
pub(crate) async fn capture(
    env: &Env,
    seeds: &Seeds,
    kind: &Kind<'_>,
    source: &ContainerId,
    credentials: &Credentials,
) {
    let Some(volume) = volume(env, kind).await else {
        return;
    };
    let Some(how) = kind.engine.fork_copy() else {
        return;
    };
    let made = || seeds.written.lock().unwrap().contains(&volume.name);
    if made() {
        return;
    }
    // One write at a time, and none while a collection removes volumes.
    let _writing = seeds.writing.lock().await;
    if made() {
        return;
    }
    seeds
        .used
        .lock()
        .unwrap()
        .insert(volume.name.clone(), Instant::now());
    let started = Instant::now();
    let job = job(env, kind, &volume, source, how, credentials);
    let copied = copy::snapshot(env.runtime.clone(), job, ()).await;
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let (seed, volume) = (kind.hash, &volume.name);
    let failed = "copying a seeded warm-pool container into its seed's template failed; its seed keeps being loaded into each container";
    match copied {
        Ok((out, _)) if out.exit_code == 0 => {
            seeds.written.lock().unwrap().insert(volume.clone());
            let bytes = copy::size_of(&out.output);
            tracing::info!(%seed, %volume, bytes, elapsed_ms, "seeded template made from a seeded warm-pool container");
        }
        Ok((out, _)) => {
            let output = seed::first_lines(&out.output);
            tracing::warn!(%seed, %volume, exit_code = out.exit_code, %output, elapsed_ms, "{failed}");
        }
        Err(e) => tracing::warn!(%seed, %volume, error = %e, elapsed_ms, "{failed}"),
    }
}

/// The copy of `source` (a running seeded container, not frozen) into
/// `volume`, `kind`'s seeded template.
fn job(
    env: &Env,
    kind: &Kind<'_>,
    volume: &Volume,
    source: &ContainerId,
    how: ForkCopy,
    credentials: &Credentials,
) -> Snapshot {
    Snapshot {
        source: source.clone(),
        paused: false,
        helper: copy::helper(
            env,
            format!("sandboxd-seed.{}", volume.name),
            (seed::SEED, kind.hash.as_str()),
            kind.image,
            kind.engine,
            volume,
            source,
        ),
        how,
        data_path: kind.engine.data_path(),
        env: kind.engine.container_env(credentials, kind.features, false),
    }
}

/// The volume of `kind`'s seeded template, or `None` where there is none:
/// templates off, a runtime without copies local to its containers (a
/// Swarm task may run on another node), an engine without a copy or a start
/// from one, an image whose id is unknown.
async fn volume(env: &Env, kind: &Kind<'_>) -> Option<Volume> {
    if !env.config.templates || !env.runtime.capabilities().local_copies {
        return None;
    }
    kind.engine.fork_copy()?;
    let dir = kind.engine.start_dir()?;
    let image_id = match env.runtime.image_id(kind.image).await {
        Ok(id) => id?,
        Err(e) => {
            tracing::debug!(image = kind.image, error = %e, "image id unreadable; the seed is loaded");
            return None;
        }
    };
    Some(Volume {
        name: volume_name(
            &super::seed::volume_name(env, kind.engine.name().as_str(), kind.hash),
            &image_id,
            kind.features,
        ),
        path: dir.to_owned(),
        labels: super::seed::volume_labels(env, kind.hash),
        disk: None,
    })
}

/// The seed's volume name `seed_volume` (what [`super::seed::collect`]
/// matches rows by), then 12 hex digits of the image id and the features
/// (a new image or feature set is another template).
fn volume_name(seed_volume: &str, image_id: &str, features: &BTreeSet<String>) -> String {
    let mut digest = Sha256::new();
    digest.update(image_id.as_bytes());
    for feature in features {
        digest.update(b"\n");
        digest.update(feature.as_bytes());
    }
    format!(
        "{seed_volume}-{}",
        crate::domain::hex::short(&digest.finalize())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|f| (*f).to_owned()).collect()
    }

    #[test]
    fn the_name_is_the_seed_s_volume_then_the_image_and_features() {
        let base = "d-seed-postgres-0123456789ab";
        let plain = volume_name(base, "sha256:aaa", &features(&[]));
        assert!(
            plain.starts_with("d-seed-postgres-0123456789ab-"),
            "{plain}"
        );
        assert_eq!(plain.len(), base.len() + 13);
        assert_eq!(plain, volume_name(base, "sha256:aaa", &features(&[])));
        for other in [
            volume_name(base, "sha256:bbb", &features(&[])),
            volume_name(base, "sha256:aaa", &features(&["vector"])),
            volume_name(base, "sha256:aaa", &features(&["pg_trgm", "vector"])),
        ] {
            assert_ne!(plain, other);
        }
    }
}
