//! Redis: features are modules, loaded at start (`--loadmodule`); the
//! `MODULE` command stays disabled. The agent's login is the default user,
//! which the image's sandbox mode restricts by ACL: no `MODULE`, `CONFIG`
//! (but `CONFIG GET`), `REPLICAOF`, `DEBUG`, `SHUTDOWN`, `MIGRATE`, `ACL`, …
//!
//! The RESP helpers here (login, probe, arguments, URL, variables) serve
//! every engine that speaks the Redis protocol.

use super::{require_all, Credentials, Engine, EngineError, Target};
use crate::domain::id::EngineName;
use crate::domain::secret::Secret;
use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use std::collections::BTreeSet;
use std::time::Duration;

/// The Redis engine.
#[derive(Debug, Clone, Copy)]
pub struct Redis;

const NAME: EngineName = EngineName::of_engine("redis");

/// Where sandboxd's images keep module files (Debian's packages do).
const MODULE_DIR: &str = "/usr/lib/redis/modules";

/// A feature's module: its file in [`MODULE_DIR`] and the names `INFO
/// modules` may report for it (they differ between module versions).
struct Module {
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

fn module(feature: &str) -> Option<&'static Module> {
    MODULES.iter().find(|m| m.feature == feature)
}

/// Logs in to a RESP server with the target's password.
pub(super) async fn connect(target: &Target<'_>) -> Result<MultiplexedConnection, String> {
    let info = redis::ConnectionInfo {
        addr: redis::ConnectionAddr::Tcp(target.host.to_owned(), target.port),
        redis: redis::RedisConnectionInfo {
            db: 0,
            username: None,
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

/// The probe of every RESP engine: an authenticated `PING` answered `PONG`.
pub(super) async fn ping(engine: EngineName, target: &Target<'_>) -> Result<(), EngineError> {
    let not_ready = |reason: String| EngineError::NotReady { engine, reason };
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

/// The login of every RESP engine: the default user and logical db 0.
pub(super) fn credentials(password: Secret) -> Credentials {
    Credentials {
        user: "default".into(),
        password,
        database: "0".into(),
    }
}

/// The environment of every RESP sandbox: the image's sandbox mode, which
/// reads the password from standard input and writes the server's
/// configuration (ACL user, no persistence, no `MODULE`) to a tmpfs.
pub(super) fn server_env() -> Vec<String> {
    vec!["SANDBOXD_SANDBOX=1".to_owned()]
}

/// Where the RESP images' sandbox mode writes the server's configuration.
pub(super) const RUNTIME_DIRS: &[&str] = &["/run/sandboxd"];

/// `redis://:PASSWORD@HOST:PORT/DB`, which every RESP client reads.
pub(super) fn url(host: &str, port: u16, c: &Credentials) -> String {
    format!(
        "redis://:{}@{host}:{port}/{}",
        c.password.expose(),
        c.database
    )
}

/// `HOST PORT PASSWORD DB URL`.
pub(super) fn env_suffixes(host: &str, port: u16, c: &Credentials) -> Vec<(&'static str, String)> {
    vec![
        ("HOST", host.to_owned()),
        ("PORT", port.to_string()),
        ("PASSWORD", c.password.expose().to_owned()),
        ("DB", c.database.clone()),
        ("URL", url(host, port, c)),
    ]
}

/// Names of the loaded modules, from `INFO modules` (the agent's ACL
/// denies `MODULE LIST`).
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

/// `--loadmodule FILE` for each requested feature with a module.
fn module_args(features: &BTreeSet<String>) -> Vec<String> {
    features
        .iter()
        .filter_map(|f| module(f))
        .flat_map(|m| {
            [
                "--loadmodule".to_owned(),
                format!("{MODULE_DIR}/{}", m.file),
            ]
        })
        .collect()
}

/// Features whose module is among `loaded`.
fn features_loaded(loaded: &BTreeSet<String>) -> BTreeSet<String> {
    MODULES
        .iter()
        .filter(|m| m.names.iter().any(|n| loaded.contains(*n)))
        .map(|m| m.feature.to_owned())
        .collect()
}

#[async_trait]
impl Engine for Redis {
    fn name(&self) -> EngineName {
        NAME
    }
    fn env_group(&self) -> &'static str {
        "REDIS"
    }
    fn allowed_features(&self) -> &'static [&'static str] {
        &["search", "json", "bloom"]
    }
    fn default_image(&self) -> &'static str {
        "sandboxd/redis:7"
    }
    fn default_features_image(&self) -> &'static str {
        "sandboxd/redis-ext:7"
    }
    fn port(&self) -> u16 {
        6379
    }
    fn data_path(&self) -> &'static str {
        "/data"
    }
    fn credentials(&self, password: Secret) -> Credentials {
        credentials(password)
    }
    fn runtime_dirs(&self) -> &'static [&'static str] {
        RUNTIME_DIRS
    }
    fn container_env(&self, _c: &Credentials, _features: &BTreeSet<String>) -> Vec<String> {
        server_env()
    }
    fn container_args(&self, features: &BTreeSet<String>) -> Vec<String> {
        module_args(features)
    }
    fn url(&self, host: &str, port: u16, c: &Credentials) -> String {
        url(host, port, c)
    }
    fn env_suffixes(&self, host: &str, port: u16, c: &Credentials) -> Vec<(&'static str, String)> {
        env_suffixes(host, port, c)
    }

    async fn probe(&self, target: &Target<'_>) -> Result<(), EngineError> {
        ping(NAME, target).await
    }

    async fn verify_features(
        &self,
        target: &Target<'_>,
        features: &BTreeSet<String>,
    ) -> Result<Vec<String>, EngineError> {
        let client_err = |reason: String| EngineError::Client {
            engine: NAME,
            reason,
        };
        let mut con = connect(target).await.map_err(client_err)?;
        let present = features_loaded(&loaded_modules(&mut con).await.map_err(client_err)?);
        require_all(NAME, features, &present)?;
        Ok(present.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_modules_replies_map_back_to_features() {
        let info = "# Modules\r\nmodule:name=ft,ver=10202,api=1,filters=0,usedby=[],using=[],options=[]\r\nmodule:name=bf,ver=20802\r\n";
        let names = module_names(info);
        assert_eq!(names, BTreeSet::from(["ft".to_owned(), "bf".to_owned()]));
        assert_eq!(
            features_loaded(&names),
            BTreeSet::from(["search".to_owned(), "bloom".to_owned()])
        );
        assert!(module_names("# Modules\r\n").is_empty());
    }

    #[test]
    fn requested_modules_are_loaded_at_start() {
        let features = BTreeSet::from(["search".to_owned(), "bloom".to_owned()]);
        assert_eq!(
            module_args(&features),
            [
                "--loadmodule",
                "/usr/lib/redis/modules/redisbloom.so",
                "--loadmodule",
                "/usr/lib/redis/modules/redisearch.so"
            ]
        );
    }

    #[test]
    fn every_allowed_feature_has_a_module() {
        for f in Redis.allowed_features() {
            assert!(module(f).is_some(), "{f}");
        }
    }
}
