//! The fence: what lets this process change Docker and write statuses, and
//! only while it leads.
//!
//! The elector ([`super::leader`]) grants the fence a term and a moment
//! until which the lease may be trusted (by this process's own monotonic
//! clock, a margin before the database can give the lease to someone
//! else), extends it at every renewal and revokes it when the lease is
//! lost. The runtime's guard ([`super::guard`]) checks it before every call
//! that changes Docker; the reconciler takes the term from it for every status write,
//! which the database checks once more.

use crate::domain::lease::Term;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::time::Instant;

/// This process may not act: it does not lead, or no longer trusts its
/// lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Fenced {
    /// It never led, or lost the lease.
    #[error("this sandboxd is not the leader (it stands by while another holds the lease)")]
    NotLeader,
    /// It led, but its last renewal is too old to trust the lease.
    #[error("this sandboxd's leader lease of term {0} could not be renewed in time; it stops acting until it leads again")]
    Expired(Term),
}

#[derive(Debug, Clone, Copy)]
struct Grant {
    term: Term,
    until: Instant,
}

/// Shared and cheap to clone: the term this process leads in, and until
/// when it trusts that.
#[derive(Debug, Clone, Default)]
pub struct Fence(Arc<Mutex<Option<Grant>>>);

impl Fence {
    /// Leads in `term` until `until`; a later renewal moves `until`.
    pub(crate) fn grant(&self, term: Term, until: Instant) {
        *self.lock() = Some(Grant { term, until });
    }

    /// Stops acting at once.
    pub(crate) fn revoke(&self) {
        *self.lock() = None;
    }

    /// The term to act in, if this process leads and still trusts its lease.
    pub fn check(&self) -> Result<Term, Fenced> {
        match *self.lock() {
            None => Err(Fenced::NotLeader),
            Some(g) if Instant::now() < g.until => Ok(g.term),
            Some(g) => Err(Fenced::Expired(g.term)),
        }
    }

    /// Until when the lease is trusted, if one is held.
    pub(crate) fn until(&self) -> Option<Instant> {
        self.lock().map(|g| g.until)
    }

    /// The term held, trusted or not.
    pub fn term(&self) -> Option<Term> {
        self.lock().map(|g| g.term)
    }

    fn lock(&self) -> MutexGuard<'_, Option<Grant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_fence_admits_its_term_until_the_trusted_moment_and_nothing_after() {
        let fence = Fence::default();
        assert_eq!(fence.check(), Err(Fenced::NotLeader));
        fence.grant(Term(3), Instant::now() + Duration::from_secs(10));
        assert_eq!(fence.check(), Ok(Term(3)));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(fence.check(), Ok(Term(3)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(fence.check(), Err(Fenced::Expired(Term(3))));
        fence.grant(Term(3), Instant::now() + Duration::from_secs(10));
        assert_eq!(fence.check(), Ok(Term(3)));
        fence.revoke();
        assert_eq!(fence.check(), Err(Fenced::NotLeader));
    }
}
