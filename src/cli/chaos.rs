//! `sandboxd chaos`: inject faults into one deployment's sandboxes and
//! check that sandboxd healed them.

use super::args::ChaosArgs;
use super::CliError;
use crate::adapters::PgStore;

/// Runs the faults `args` describe, then checks the invariants; prints the
/// report.
pub(super) async fn chaos(url: &str, args: ChaosArgs) -> Result<(), CliError> {
    if !args.yes {
        return Err(CliError::Chaos(format!(
            "sandboxd chaos kills, stops and removes the containers of deployment {:?}; run it against staging, and pass --yes",
            args.deployment.as_str()
        )));
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let options = crate::chaos::ChaosOptions {
        deployment: args.deployment.clone(),
        faults: args.faults,
        duration: args.duration,
        kinds: args.kinds.clone(),
        seed,
        settle: args.settle,
    };
    let chaos_error = |e: crate::chaos::ChaosError| CliError::Chaos(e.to_string());
    let docker = crate::adapters::DockerRuntime::connect().await?;
    let store = std::sync::Arc::new(PgStore::connect(url, 4, crate::engine::REGISTRY).await?);
    let run = crate::chaos::Chaos::new(docker, store, options).map_err(chaos_error)?;
    let others = run.others().await.map_err(chaos_error)?;
    eprintln!(
        "chaos: {} faults over {:?} in deployment {} (seed {seed})",
        args.faults,
        args.duration,
        args.deployment.as_str()
    );
    let records = run.inject().await;
    let report = run.check(records, &others).await.map_err(chaos_error)?;
    let json = serde_json::to_string_pretty(&report).expect("the report is JSON");
    if let Some(path) = &args.results {
        std::fs::write(path, &json)
            .map_err(|e| CliError::Chaos(format!("cannot write {}: {e}", path.display())))?;
    }
    say!("{json}");
    if report.passed() {
        Ok(())
    } else {
        Err(CliError::ChaosFound)
    }
}
