//! Valkey: the Redis-protocol server, without modules for now. Everything
//! but its name, group, images and binary comes from the RESP helpers in
//! `redis.rs`.

use super::redis::{credentials, env_suffixes, ping, server_env, url, RUNTIME_DIRS};
use super::{require_all, Credentials, Engine, EngineError, Target};
use crate::domain::id::EngineName;
use crate::domain::secret::Secret;
use async_trait::async_trait;
use std::collections::BTreeSet;

/// The Valkey engine.
#[derive(Debug, Clone, Copy)]
pub struct Valkey;

const NAME: EngineName = EngineName::of_engine("valkey");

#[async_trait]
impl Engine for Valkey {
    fn name(&self) -> EngineName {
        NAME
    }
    fn env_group(&self) -> &'static str {
        "VALKEY"
    }
    fn allowed_features(&self) -> &'static [&'static str] {
        &[]
    }
    fn default_image(&self) -> &'static str {
        "sandboxd/valkey:8"
    }
    fn default_features_image(&self) -> &'static str {
        "sandboxd/valkey:8"
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
    fn container_args(&self, _features: &BTreeSet<String>) -> Vec<String> {
        Vec::new()
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
        _target: &Target<'_>,
        features: &BTreeSet<String>,
    ) -> Result<Vec<String>, EngineError> {
        require_all(NAME, features, &BTreeSet::new()).map(|()| Vec::new())
    }
}
