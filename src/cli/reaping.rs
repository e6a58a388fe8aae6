//! `sandboxd resume-reaping`: resume reaping after the circuit breaker
//! paused it. Run with the controller's DATABASE_URL.

use super::CliError;
use crate::adapters::PgStore;

/// Resumes reaping, saying since when and why it was paused.
pub(super) async fn resume(url: &str) -> Result<(), CliError> {
    let store = PgStore::connect(url, 1, crate::engine::REGISTRY).await?;
    match store.resume_reaping().await? {
        Some(pause) => {
            let since = pause
                .paused_at
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_default();
            say!(
                "reaping resumed; it had been paused since {since}: {}",
                pause.reason
            );
        }
        None => say!("reaping was not paused; nothing to resume"),
    }
    Ok(())
}
