//! MongoDB: no features; readiness is checked with `mongosh` inside the
//! container against the container's own address, because the image's
//! temporary init server binds only to 127.0.0.1.

use super::{Credentials, Engine, EngineError, Target};
use crate::domain::id::EngineName;
use crate::domain::secret::Secret;
use async_trait::async_trait;
use std::collections::BTreeSet;
use std::time::Duration;

/// The MongoDB engine.
#[derive(Debug, Clone, Copy)]
pub struct Mongo;

const NAME: EngineName = EngineName::of_engine("mongo");

const PING: &str = r#"mongosh --quiet --host "$(hostname -i | cut -d' ' -f1)" -u "$SANDBOXD_USER" -p "$SANDBOXD_PASSWORD" --authenticationDatabase admin --eval 'db.runCommand({ping:1}).ok'"#;

#[async_trait]
impl Engine for Mongo {
    fn name(&self) -> EngineName {
        NAME
    }
    fn env_group(&self) -> &'static str {
        "MONGO"
    }
    fn allowed_features(&self) -> &'static [&'static str] {
        &[]
    }
    fn default_image(&self) -> &'static str {
        "mongo:8"
    }
    fn default_features_image(&self) -> &'static str {
        "mongo:8"
    }
    fn port(&self) -> u16 {
        27017
    }
    fn data_path(&self) -> &'static str {
        "/data/db"
    }
    fn readiness_deadline(&self) -> Duration {
        Duration::from_secs(90)
    }
    fn credentials(&self, password: Secret) -> Credentials {
        Credentials {
            user: "sandbox".into(),
            password,
            database: "sandbox".into(),
        }
    }
    fn container_env(&self, c: &Credentials) -> Vec<String> {
        vec![
            format!("MONGO_INITDB_ROOT_USERNAME={}", c.user),
            format!("MONGO_INITDB_ROOT_PASSWORD={}", c.password.expose()),
            format!("MONGO_INITDB_DATABASE={}", c.database),
        ]
    }
    fn container_args(&self, _c: &Credentials) -> Vec<String> {
        Vec::new()
    }
    fn url(&self, host: &str, port: u16, c: &Credentials) -> String {
        format!(
            "mongodb://{}:{}@{host}:{port}/{}?authSource=admin",
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
            ("DB", c.database.clone()),
            ("URL", self.url(host, port, c)),
        ]
    }

    async fn probe(&self, target: &Target<'_>) -> Result<(), EngineError> {
        let c = target.credentials;
        let env = vec![
            format!("SANDBOXD_USER={}", c.user),
            format!("SANDBOXD_PASSWORD={}", c.password.expose()),
        ];
        let out = target
            .exec
            .exec(&["sh", "-c", PING], env)
            .await
            .map_err(|reason| EngineError::NotReady {
                engine: NAME,
                reason,
            })?;
        if out.exit_code == 0 && out.output.trim().ends_with('1') {
            Ok(())
        } else {
            Err(EngineError::NotReady {
                engine: NAME,
                reason: format!("mongosh ping exited {}", out.exit_code),
            })
        }
    }

    async fn enable_features(
        &self,
        _target: &Target<'_>,
        _features: &BTreeSet<String>,
    ) -> Result<(), EngineError> {
        Ok(())
    }

    async fn verify_features(
        &self,
        _target: &Target<'_>,
        _features: &BTreeSet<String>,
    ) -> Result<Vec<String>, EngineError> {
        Ok(Vec::new())
    }
}
