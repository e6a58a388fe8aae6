//! Redis: features are modules, loaded with `MODULE LOAD`.
//!
//! Redis 7+ refuses `MODULE LOAD` unless the server was started with
//! `enable-module-command`, so the container is started with it.
//!
//! The RESP helpers here (login, probe, arguments, URL, variables) serve
//! every engine that speaks the Redis protocol.

use super::{require_all, Credentials, Engine, EngineError, Target};
use crate::domain::id::EngineName;
use crate::domain::secret::Secret;
use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use std::collections::BTreeSet;
use std::time::Duration;

/// The Redis engine.
#[derive(Debug, Clone, Copy)]
pub struct Redis;

const NAME: EngineName = EngineName::of_engine("redis");

/// Where images keep module files: Debian's packages, then upstream's images.
const MODULE_DIRS: &[&str] = &["/usr/lib/redis/modules", "/usr/local/lib/redis/modules"];

/// A feature's module: the file names it may have and the names
/// `MODULE LIST` may report for it (they differ between module versions).
struct Module {
    feature: &'static str,
    files: &'static [&'static str],
    names: &'static [&'static str],
}

const MODULES: &[Module] = &[
    Module {
        feature: "search",
        files: &["redisearch.so"],
        names: &["search", "ft"],
    },
    Module {
        feature: "json",
        files: &["rejson.so", "librejson.so"],
        names: &["ReJSON"],
    },
    Module {
        feature: "bloom",
        files: &["redisbloom.so"],
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

/// Arguments of a throwaway RESP server (`server` is its binary): the
/// password, no persistence, then `extra`.
pub(super) fn server_args(server: &str, c: &Credentials, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        server,
        "--requirepass",
        c.password.expose(),
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

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

/// Names of the loaded modules, from `MODULE LIST`.
async fn loaded_modules(con: &mut MultiplexedConnection) -> Result<BTreeSet<String>, String> {
    let reply: Value = redis::cmd("MODULE")
        .arg("LIST")
        .query_async(con)
        .await
        .map_err(|e| e.to_string())?;
    Ok(module_names(&reply))
}

/// Extracts module names from a `MODULE LIST` reply (RESP2 arrays of
/// alternating keys and values, or RESP3 maps).
fn module_names(reply: &Value) -> BTreeSet<String> {
    fn text(v: &Value) -> Option<String> {
        match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        }
    }
    let mut names = BTreeSet::new();
    if let Value::Array(entries) = reply {
        for entry in entries {
            match entry {
                Value::Array(kv) => {
                    for pair in kv.chunks(2) {
                        if let [k, v] = pair {
                            if text(k).as_deref() == Some("name") {
                                names.extend(text(v));
                            }
                        }
                    }
                }
                Value::Map(kv) => {
                    for (k, v) in kv {
                        if text(k).as_deref() == Some("name") {
                            names.extend(text(v));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    names
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
        "redis:8-alpine"
    }
    fn default_features_image(&self) -> &'static str {
        "redis:8"
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
    fn container_env(&self, _c: &Credentials) -> Vec<String> {
        Vec::new()
    }
    fn container_args(&self, c: &Credentials) -> Vec<String> {
        server_args("redis-server", c, &["--enable-module-command", "yes"])
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

    async fn enable_features(
        &self,
        target: &Target<'_>,
        features: &BTreeSet<String>,
    ) -> Result<(), EngineError> {
        let client_err = |reason: String| EngineError::Client {
            engine: NAME,
            reason,
        };
        let mut con = connect(target).await.map_err(client_err)?;
        let already = features_loaded(&loaded_modules(&mut con).await.map_err(client_err)?);
        for feature in features.difference(&already) {
            let unavailable = |reason: String| EngineError::FeatureUnavailable {
                engine: NAME,
                feature: feature.clone(),
                reason,
            };
            let m = module(feature).ok_or_else(|| unavailable("not in the allowlist".into()))?;
            let mut last_error = String::new();
            let mut loaded = false;
            'search: for dir in MODULE_DIRS {
                for file in m.files {
                    let path = format!("{dir}/{file}");
                    let reply: Result<Value, _> = redis::cmd("MODULE")
                        .arg("LOAD")
                        .arg(&path)
                        .query_async(&mut con)
                        .await;
                    match reply {
                        Ok(_) => {
                            loaded = true;
                            break 'search;
                        }
                        Err(e) => last_error = format!("MODULE LOAD {path}: {e}"),
                    }
                }
            }
            if !loaded {
                return Err(unavailable(format!(
                    "no loadable module file in {MODULE_DIRS:?} (last error: {last_error})"
                )));
            }
        }
        Ok(())
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

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn module_list_replies_map_back_to_features() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                bulk("name"),
                bulk("ft"),
                bulk("ver"),
                Value::Int(10202),
            ]),
            Value::Map(vec![(bulk("name"), bulk("bf"))]),
        ]);
        let names = module_names(&reply);
        assert_eq!(names, BTreeSet::from(["ft".to_owned(), "bf".to_owned()]));
        assert_eq!(
            features_loaded(&names),
            BTreeSet::from(["search".to_owned(), "bloom".to_owned()])
        );
    }

    #[test]
    fn every_allowed_feature_has_a_module() {
        for f in Redis.allowed_features() {
            assert!(module(f).is_some(), "{f}");
        }
    }
}
