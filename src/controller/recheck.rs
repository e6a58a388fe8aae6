//! Reading a row again just before a removal that an earlier read of it
//! justified: a replace of a running container, a rotation's removal of
//! the old one, or the teardown of one the row no longer wants (an
//! earlier incarnation's, an engine dropped, expired, idle, its owner
//! gone). A reconcile reads the row, then lists,
//! plans and acts; a row deleted, re-inserted or restored from a copy in
//! between must not lose a container on the strength of the old read.
//!
//! Docker takes no precondition on a row in Postgres, so this narrows the
//! window to one removal's round trip rather than closing it; the grace
//! window and the breaker guard what is left. The deterministic
//! simulation found both cases (docs/simulation.md).

use super::env::Env;
use crate::domain::sandbox::DesiredSandbox;
use crate::ports::store::StoreError;

/// How the row differs from the one a plan was made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Changed {
    /// The row is gone.
    Deleted,
    /// The row is another incarnation, or another generation of it.
    Rewritten,
}

impl Changed {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Changed::Deleted => "deleted",
            Changed::Rewritten => "rewritten",
        }
    }
}

/// Reads `read`'s row again: `None` when it is still the row the plan
/// was made on (the same incarnation and generation).
pub(crate) async fn since(env: &Env, read: &DesiredSandbox) -> Result<Option<Changed>, StoreError> {
    Ok(match env.store.fetch_desired(&read.id).await? {
        None => Some(Changed::Deleted),
        Some(now) if now.incarnation != read.incarnation || now.generation != read.generation => {
            Some(Changed::Rewritten)
        }
        Some(_) => None,
    })
}
