//! `sandboxd grant-orchestrator` and `sandboxd revoke-orchestrator`: let a
//! database role act as an orchestrator, and take that back. Run with the
//! controller's DATABASE_URL (the owner of the tables).

use super::args::GrantArgs;
use super::CliError;
use crate::adapters::PgStore;

/// Grants `args.role` what an orchestrator needs.
pub(super) async fn grant(url: &str, args: GrantArgs) -> Result<(), CliError> {
    let store = PgStore::connect(url, 1, crate::engine::REGISTRY).await?;
    store
        .grant_orchestrator(&args.role, args.own_rows_only)
        .await?;
    let rows = if args.own_rows_only {
        format!("only rows whose owner is {:?}", args.role)
    } else {
        "every row".to_owned()
    };
    say!(
        "granted {:?}: it may write sandbox_desired and read sandbox_status ({rows})",
        args.role
    );
    Ok(())
}

/// Takes back everything [`grant`] gave `role`.
pub(super) async fn revoke(url: &str, role: String) -> Result<(), CliError> {
    let store = PgStore::connect(url, 1, crate::engine::REGISTRY).await?;
    if store.revoke_orchestrator(&role).await? {
        say!("revoked {role:?}: it no longer sees or writes sandboxd's tables");
    } else {
        say!("{role:?} was not registered as an orchestrator; it holds no privileges on sandboxd's tables now");
    }
    Ok(())
}
