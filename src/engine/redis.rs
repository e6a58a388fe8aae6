//! The engines that speak the Redis protocol, Redis and Valkey: one type,
//! [`Resp`], and one value per engine ([`REDIS`], [`VALKEY`]), which differ
//! only in name, variable group, images and the module features they offer.
//!
//! Features are modules, loaded at start (`--loadmodule`); the `MODULE`
//! command stays disabled. The agent's login is the default user, which the
//! images' sandbox mode restricts by ACL: no `MODULE` (but `MODULE LIST`),
//! `CONFIG` (but `CONFIG GET`), `REPLICAOF`, `DEBUG`, `SHUTDOWN`, `MIGRATE`,
//! `ACL`, …, and none of the loaded modules' administration, debug and
//! raw-load commands (`FT.CONFIG`, `BF.LOADCHUNK`, `JSON.DEBUG`, …; the
//! entrypoint names only those of the modules in its `--loadmodule`
//! arguments, since naming an unknown command stops the server).

use super::{require_all, script, Credentials, Engine, EngineError, ForkCopy, SeedBytes, Target};
use crate::domain::checkpoint::CheckpointName;
use crate::domain::id::EngineName;
use crate::domain::secret::Secret;
use crate::domain::seed;
use async_trait::async_trait;
use futures::StreamExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::AsyncConnectionConfig;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::time::Duration;

/// An engine that speaks the Redis protocol.
#[derive(Debug)]
pub struct Resp {
    name: EngineName,
    env_group: &'static str,
    image: &'static str,
    features_image: &'static str,
    /// The features a row may request, each with a module in [`Resp::modules`].
    features: &'static [&'static str],
    /// The modules its images ship.
    modules: &'static [Module],
}

/// Redis, with the search, JSON and bloom modules.
pub static REDIS: Resp = Resp {
    name: EngineName::of_engine("redis"),
    env_group: "REDIS",
    image: "sandboxd/redis:8",
    features_image: "sandboxd/redis:8",
    features: &["search", "json", "bloom"],
    modules: MODULES,
};

/// Valkey, with the same modules as Redis.
pub static VALKEY: Resp = Resp {
    name: EngineName::of_engine("valkey"),
    env_group: "VALKEY",
    image: "sandboxd/valkey:8",
    features_image: "sandboxd/valkey:8",
    features: &["search", "json", "bloom"],
    modules: MODULES,
};

/// Checkpoints are RDB snapshots the engine writes (`SAVE`) and loads
/// (`DEBUG RELOAD NOSAVE`) as the images' admin user, from inside the
/// container; the baseline is the empty keyspace. See the script.
const CHECKPOINTS: &str = include_str!("checkpoint/redis.sh");

/// A fork copies the RDB file of a `SAVE` (a snapshot of its own: the
/// source is not frozen), which the fork's server loads at start. See the
/// script.
const FORK_COPY: &str = include_str!("fork/redis.sh");

/// The ACL user a warm-pool container gets besides `default`, with the
/// rights to change `default`'s password at a claim; the claim deletes it.
const POOL_ADMIN: &str = "sandboxd-pool";

/// Where sandboxd's images keep module files (Debian's packages do).
const MODULE_DIR: &str = "/usr/lib/redis/modules";

/// A feature's module: its file in [`MODULE_DIR`] and the names `INFO
/// modules` may report for it (they differ between module versions).
#[derive(Debug)]
pub struct Module {
    feature: &'static str,
    file: &'static str,
    names: &'static [&'static str],
}

const MODULES: &[Module] = &[
    Module {
        feature: "search",
        file: "redisearch.so",
        names: &["search", "ft"],
    },
    Module {
        feature: "json",
        file: "rejson.so",
        names: &["ReJSON"],
    },
    Module {
        feature: "bloom",
        file: "redisbloom.so",
        names: &["bf"],
    },
];

/// An ACL password rule that sets `password` by its SHA-256 (`#hex`), so
/// that the password itself is never in a command or a configuration.
fn acl_hash(password: &Secret) -> String {
    let hash = Sha256::digest(password.expose().as_bytes());
    format!("#{}", crate::domain::hex::encode(&hash))
}

/// The most seed commands one pipeline sends.
const SEED_BATCH: usize = 1024;

/// The most bytes of seed commands one pipeline sends (a command longer
/// than this goes alone).
const SEED_BATCH_BYTES: usize = 256 * 1024;

/// Seed commands on their way to the server, sent as one pipeline.
#[derive(Default)]
struct Batch {
    commands: Vec<seed::Command>,
    bytes: usize,
}

impl Batch {
    fn push(&mut self, command: seed::Command) {
        self.bytes += command.words.iter().map(String::len).sum::<usize>();
        self.commands.push(command);
    }

    fn is_full(&self) -> bool {
        self.commands.len() >= SEED_BATCH || self.bytes >= SEED_BATCH_BYTES
    }

    /// Sends the commands (none: nothing) and empties the batch; the
    /// first the server refused, by its line and name.
    async fn send(&mut self, con: &mut MultiplexedConnection) -> Result<(), String> {
        if self.commands.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for command in &self.commands {
            let cmd = pipe.cmd(&command.words[0]);
            for word in &command.words[1..] {
                cmd.arg(word);
            }
        }
        let replies = con
            .req_packed_commands(&pipe, 0, self.commands.len())
            .await
            .map_err(|e| e.to_string())?;
        let refused = replies.into_iter().enumerate().find_map(|(i, v)| match v {
            redis::Value::ServerError(e) => Some((i, redis::RedisError::from(e))),
            _ => None,
        });
        if let Some((i, e)) = refused {
            let command = &self.commands[i];
            return Err(format!("line {} ({}): {e}", command.line, command.words[0]));
        }
        self.commands.clear();
        self.bytes = 0;
        Ok(())
    }
}

/// Logs in to the server with the target's password.
async fn connect(target: &Target<'_>) -> Result<MultiplexedConnection, String> {
    connect_as(target, None).await
}

/// Logs in to the server as `user` (`None`: `default`) with the target's
/// password.
async fn connect_as(
    target: &Target<'_>,
    user: Option<&str>,
) -> Result<MultiplexedConnection, String> {
    let info = redis::ConnectionInfo {
        addr: redis::ConnectionAddr::Tcp(target.host.to_owned(), target.port),
        redis: redis::RedisConnectionInfo {
            db: 0,
            username: user.map(str::to_owned),
            password: Some(target.credentials.password.expose().to_owned()),
            ..Default::default()
        },
    };
    let client = redis::Client::open(info).map_err(|e| e.to_string())?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Duration::from_secs(3))
        .set_response_timeout(Duration::from_secs(10));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| e.to_string())
}

/// Names of the loaded modules, from `INFO modules` (the agent's ACL
/// denies `MODULE LIST`).
/// `connected_clients` of an `INFO clients` answer.
fn connected_clients(info: &str) -> Option<u32> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
}

async fn loaded_modules(con: &mut MultiplexedConnection) -> Result<BTreeSet<String>, String> {
    let info: String = redis::cmd("INFO")
        .arg("modules")
        .query_async(con)
        .await
        .map_err(|e| e.to_string())?;
    Ok(module_names(&info))
}

/// Extracts module names from `INFO modules`: lines such as
/// `module:name=search,ver=20210,api=1,filters=0,usedby=[],using=[],options=[]`.
fn module_names(info: &str) -> BTreeSet<String> {
    info.lines()
        .filter_map(|line| line.trim().strip_prefix("module:"))
        .filter_map(|fields| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix("name="))
                .map(str::to_owned)
        })
        .collect()
}

impl Resp {
    /// The module of `feature`, if this engine has one.
    fn module(&self, feature: &str) -> Option<&'static Module> {
        self.modules.iter().find(|m| m.feature == feature)
    }

    /// `--loadmodule FILE` for each requested feature with a module.
    fn module_args(&self, features: &BTreeSet<String>) -> Vec<String> {
        features
            .iter()
            .filter_map(|f| self.module(f))
            .flat_map(|m| {
                [
                    "--loadmodule".to_owned(),
                    format!("{MODULE_DIR}/{}", m.file),
                ]
            })
            .collect()
    }

    /// Features whose module is among `loaded`.
    fn features_loaded(&self, loaded: &BTreeSet<String>) -> BTreeSet<String> {
        self.modules
            .iter()
            .filter(|m| m.names.iter().any(|n| loaded.contains(*n)))
            .map(|m| m.feature.to_owned())
            .collect()
    }
}

#[async_trait]
impl Engine for Resp {
    fn name(&self) -> EngineName {
        self.name
    }
    fn env_group(&self) -> &'static str {
        self.env_group
    }
    fn allowed_features(&self) -> &'static [&'static str] {
        self.features
    }
    fn default_image(&self) -> &'static str {
        self.image
    }
    fn default_features_image(&self) -> &'static str {
        self.features_image
    }
    fn port(&self) -> u16 {
        6379
    }
    fn data_path(&self) -> &'static str {
        "/data"
    }
    fn credentials(&self, password: Secret) -> Credentials {
        Credentials {
            user: "default".into(),
            password,
            database: "0".into(),
        }
    }
    fn runtime_dirs(&self) -> &'static [&'static str] {
        // Where the images' sandbox mode writes the server's configuration.
        &["/run/sandboxd"]
    }
    fn start_dir(&self) -> Option<&'static str> {
        // The images load `dump.rdb` from there at start.
        Some("/var/lib/sandboxd/template")
    }
    /// An RDB file: only a start can load one (the agent's user may not
    /// `RESTORE`).
    fn is_data_file(&self, head: &[u8]) -> bool {
        seed::is_rdb(head)
    }
    fn fork_copy(&self) -> Option<ForkCopy> {
        Some(ForkCopy {
            script: FORK_COPY,
            freeze: false,
        })
    }
    fn readiness_deadline(&self) -> Duration {
        Duration::from_secs(15)
    }
    fn container_env(
        &self,
        _c: &Credentials,
        _features: &BTreeSet<String>,
        persistent: bool,
    ) -> Vec<String> {
        // Sandbox mode reads the password from standard input and writes the
        // configuration (ACL user, no `MODULE`; persistence only for a
        // persistent sandbox) to a tmpfs.
        let mut env = vec!["SANDBOXD_SANDBOX=1".to_owned()];
        if persistent {
            env.push("SANDBOXD_PERSISTENT=1".to_owned());
        }
        env
    }
    fn container_args(&self, features: &BTreeSet<String>, _persistent: bool) -> Vec<String> {
        self.module_args(features)
    }
    fn pool_args(&self, pool: &Credentials) -> Vec<String> {
        // A second ACL user that may change `default`'s password, known by
        // the SHA-256 of the pool password only (never the password).
        [
            "--user",
            POOL_ADMIN,
            "on",
            &acl_hash(&pool.password),
            "+@all",
        ]
        .map(String::from)
        .to_vec()
    }
    fn has_pool(&self) -> bool {
        true
    }
    async fn claim(&self, pool: &Target<'_>, claimant: &Credentials) -> Result<(), EngineError> {
        // As the pool's admin user: `default` gets the claimant's password
        // (as its SHA-256, never the password), and the admin user is
        // deleted, so the pool password opens nothing afterwards.
        let failed = |reason: String| EngineError::Client {
            engine: self.name,
            reason: format!("setting the claimant's password failed: {reason}"),
        };
        let mut con = connect_as(pool, Some(POOL_ADMIN)).await.map_err(failed)?;
        let set: String = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg("resetpass")
            .arg(acl_hash(&claimant.password))
            .query_async(&mut con)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let deleted: i64 = redis::cmd("ACL")
            .arg("DELUSER")
            .arg(POOL_ADMIN)
            .query_async(&mut con)
            .await
            .map_err(|e| failed(e.to_string()))?;
        if set != "OK" || deleted != 1 {
            return Err(failed(format!(
                "the server answered {set} and {deleted} (expected OK and 1)"
            )));
        }
        Ok(())
    }
    async fn seed(&self, target: &Target<'_>, seed: SeedBytes<'_>) -> Result<(), EngineError> {
        // As `default`, the agent's user: its ACL applies (no SAVE, DEBUG,
        // CONFIG SET, MODULE). Read a line at a time as the seed streams
        // in and pipelined a batch at a time, so a load holds a chunk, a
        // line and a batch, whatever the seed's size; each reply is looked
        // at, so a failure still names its command.
        let failed = |reason: String| EngineError::Seed {
            engine: self.name,
            reason: seed::first_lines(&reason),
        };
        let mut chunks = seed.chunks;
        let mut reader = seed::CommandReader::default();
        let mut batch = Batch::default();
        let mut con = connect(target).await.map_err(failed)?;
        loop {
            match chunks.next().await {
                Some(chunk) => reader
                    .feed(&chunk.map_err(failed)?)
                    .map_err(|e| failed(e.to_string()))?,
                None => reader.finish(),
            }
            while let Some(command) = reader.next().map_err(|e| failed(e.to_string()))? {
                batch.push(command);
                if batch.is_full() {
                    batch.send(&mut con).await.map_err(failed)?;
                }
            }
            if reader.is_finished() {
                return batch.send(&mut con).await.map_err(failed);
            }
        }
    }
    fn url(&self, host: &str, port: u16, c: &Credentials) -> String {
        format!(
            "redis://:{}@{host}:{port}/{}",
            c.password.expose(),
            c.database
        )
    }
    fn env_suffixes(&self, host: &str, port: u16, c: &Credentials) -> Vec<(&'static str, String)> {
        vec![
            ("HOST", host.to_owned()),
            ("PORT", port.to_string()),
            ("PASSWORD", c.password.expose().to_owned()),
            ("DB", c.database.clone()),
            ("URL", self.url(host, port, c)),
        ]
    }

    async fn probe(&self, target: &Target<'_>) -> Result<(), EngineError> {
        let not_ready = |reason: String| EngineError::NotReady {
            engine: self.name,
            reason,
        };
        let mut con = connect(target).await.map_err(not_ready)?;
        let pong: String = redis::cmd("PING")
            .query_async(&mut con)
            .await
            .map_err(|e| not_ready(e.to_string()))?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(not_ready(format!("PING answered {pong:?}")))
        }
    }

    async fn clients(&self, target: &Target<'_>) -> Result<Option<u32>, EngineError> {
        let failed = |reason: String| EngineError::Client {
            engine: self.name,
            reason: format!("counting client connections failed: {reason}"),
        };
        let mut con = connect(target).await.map_err(failed)?;
        let info: String = redis::cmd("INFO")
            .arg("clients")
            .query_async(&mut con)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let connected = connected_clients(&info)
            .ok_or_else(|| failed("INFO clients has no connected_clients".into()))?;
        // This connection is one of them.
        Ok(Some(connected.saturating_sub(1)))
    }

    async fn verify_features(
        &self,
        target: &Target<'_>,
        features: &BTreeSet<String>,
    ) -> Result<Vec<String>, EngineError> {
        let client_err = |reason: String| EngineError::Client {
            engine: self.name,
            reason,
        };
        let mut con = connect(target).await.map_err(client_err)?;
        let present = self.features_loaded(&loaded_modules(&mut con).await.map_err(client_err)?);
        require_all(self.name, features, &present)?;
        Ok(present.into_iter().collect())
    }

    fn checkpoint_size_command(&self, _c: &Credentials) -> Option<Vec<String>> {
        Some(script("sh", CHECKPOINTS, &["size", "-"]))
    }
    fn checkpoint_command(&self, _c: &Credentials, name: &CheckpointName) -> Option<Vec<String>> {
        Some(script("sh", CHECKPOINTS, &["checkpoint", name.as_str()]))
    }
    fn reset_command(&self, _c: &Credentials, name: &CheckpointName) -> Option<Vec<String>> {
        Some(script("sh", CHECKPOINTS, &["reset", name.as_str()]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_rdb_file_is_a_data_file_for_redis_and_valkey_only() {
        use crate::domain::seed::HEAD_BYTES;
        use crate::engine::{Engine, Postgres};
        let rdb = b"REDIS0012\xfa\x09redis-ver";
        for (engine, bytes, file) in [
            (&REDIS as &dyn Engine, &rdb[..], true),
            (&VALKEY, &rdb[..], true),
            (&Postgres, &rdb[..], false),
            (&REDIS, &b"SET k v\n"[..], false),
            (&REDIS, &b"REDIS"[..], false),
            (&REDIS, &b"REDISxxxx and more"[..], false),
            (&Postgres, &b"PGDMP\x01\x10\x00\x04\x08\x01\x01"[..], false),
        ] {
            let head = &bytes[..bytes.len().min(HEAD_BYTES)];
            assert_eq!(
                engine.is_data_file(head),
                file,
                "{} {bytes:?}",
                engine.name()
            );
        }
    }

    #[test]
    fn info_clients_replies_give_the_connected_clients() {
        let info =
            "# Clients\r\nconnected_clients:3\r\ncluster_connections:0\r\nmaxclients:10000\r\n";
        assert_eq!(connected_clients(info), Some(3));
        assert_eq!(connected_clients("# Clients\r\n"), None);
    }

    #[test]
    fn info_modules_replies_map_back_to_features() {
        let info = "# Modules\r\nmodule:name=ft,ver=10202,api=1,filters=0,usedby=[],using=[],options=[]\r\nmodule:name=bf,ver=20802\r\n";
        let names = module_names(info);
        assert_eq!(names, BTreeSet::from(["ft".to_owned(), "bf".to_owned()]));
        assert_eq!(
            REDIS.features_loaded(&names),
            BTreeSet::from(["search".to_owned(), "bloom".to_owned()])
        );
        assert!(module_names("# Modules\r\n").is_empty());
    }

    #[test]
    fn requested_modules_are_loaded_at_start() {
        let features = BTreeSet::from(["search".to_owned(), "bloom".to_owned()]);
        assert_eq!(
            REDIS.module_args(&features),
            [
                "--loadmodule",
                "/usr/lib/redis/modules/redisbloom.so",
                "--loadmodule",
                "/usr/lib/redis/modules/redisearch.so"
            ]
        );
    }

    #[test]
    fn the_checkpoint_script_is_valid_sh() {
        let out = std::process::Command::new("sh")
            .args(["-n", "-c", CHECKPOINTS])
            .output()
            .expect("sh runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let name = CheckpointName::parse("k1").unwrap();
        let c = REDIS.credentials(Secret::new("s3cretPassw0rd1234"));
        let cmd = REDIS.reset_command(&c, &name).unwrap();
        assert_eq!(&cmd[cmd.len() - 2..], ["reset", "k1"]);
        assert!(!cmd.join(" ").contains("s3cret"));
    }

    #[test]
    fn every_allowed_feature_has_a_module() {
        for engine in [&REDIS, &VALKEY] {
            for f in engine.allowed_features() {
                assert!(engine.module(f).is_some(), "{}: {f}", engine.name);
            }
        }
    }
}
