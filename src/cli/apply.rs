//! `sandboxd apply`: write a desired row, replacing what it asked before.

use super::args::ApplyArgs;
use super::get::print_status;
use super::{progress, CliError};
use crate::client::{Client, SandboxRequest};
use std::collections::{BTreeMap, BTreeSet};

/// Writes the row `args` describe; with `--wait`, prints the status once ready.
pub(super) async fn apply(url: &str, args: ApplyArgs) -> Result<(), CliError> {
    let req = SandboxRequest {
        owner: args.owner,
        services: args.services,
        features: parse_features(&args.features)?,
        attach: args.attach,
        expires_at: args.expires_in.map(|d| {
            chrono::Utc::now() + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
        }),
        idle_timeout: args.idle_timeout,
        persistent: args.persistent,
        owner_container: args.owner_container,
        idle_action: args.idle_action.into(),
        isolation: args.isolation.map(Into::into),
        seeds: super::seed::parse_seeds(&args.seed)?,
    };
    let client = Client::connect(url).await?;
    let revision = client.apply(&args.id, &req).await?;
    match args.wait {
        Some(timeout) => print_status(
            &progress::wait(&client, &args.id, &revision, timeout, args.progress).await?,
        ),
        None => say!("applied {} at generation {}", args.id, revision.generation),
    }
    Ok(())
}

/// Parses `--features` values (`ENGINE=FEATURE`) into features per engine.
/// `ENGINE=FEATURE` entries; an entry without `=` is one more feature of
/// the engine before it, so `postgres=vector,postgis` names two.
pub(super) fn parse_features(
    values: &[String],
) -> Result<BTreeMap<String, BTreeSet<String>>, CliError> {
    let mut features: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut engine: Option<&str> = None;
    for f in values {
        let (e, feature) = match f.split_once('=') {
            Some((e, feature)) => (Some(e), feature),
            None => (engine, f.as_str()),
        };
        let e = e
            .filter(|e| !e.is_empty() && !feature.is_empty())
            .ok_or_else(|| CliError::Feature(f.clone()))?;
        engine = Some(e);
        features
            .entry(e.to_owned())
            .or_default()
            .insert(feature.to_owned());
    }
    Ok(features)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_feature_belongs_to_the_engine_before_it() {
        let list = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let got = parse_features(&list(&["postgres=vector", "postgis", "redis=json"])).unwrap();
        assert_eq!(
            got["postgres"],
            ["postgis", "vector"].map(String::from).into()
        );
        assert_eq!(got["redis"], ["json"].map(String::from).into());
        assert!(parse_features(&list(&["vector"])).is_err());
        assert!(parse_features(&list(&["postgres="])).is_err());
    }
}
