//! `sandboxd migrate`: apply the state database's migrations and sync the
//! engine allowlist, then exit.

use super::CliError;
use crate::adapters::PgStore;

/// Migrates the state database at `url`.
pub(super) async fn migrate(url: &str) -> Result<(), CliError> {
    PgStore::connect(url, 2, crate::engine::REGISTRY)
        .await?
        .migrate()
        .await?;
    say!("migrations applied; engine allowlist synced");
    Ok(())
}
