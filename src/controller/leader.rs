//! Leader election over the lease in the state database: stand by until
//! the lease is free, then renew it while leading, and stop acting the
//! moment it can no longer be trusted.
//!
//! The timings are [`LeasePolicy`]'s; the fence ([`super::fence`]) is what
//! the rest of the controller obeys. Every lease call is one statement
//! with its own deadline, so a stuck database costs one try, and the
//! fence runs out by itself (by this process's clock) if renewals keep
//! failing.

use super::fence::Fence;
use crate::domain::lease::{LeaseHolder, LeasePolicy, Term};
use crate::metrics::Metrics;
use crate::ports::store::{Store, StoreError};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::time::Instant;

/// What this process is, for `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    /// Waiting for the lease; who holds it, when last read.
    Standby(Option<LeaseHolder>),
    /// Holding the lease in this term.
    Leader(Term),
}

/// Campaigns for, holds and gives up the lease of one state database.
pub(crate) struct Elector {
    store: Arc<dyn Store>,
    policy: LeasePolicy,
    holder: String,
    fence: Fence,
    metrics: Arc<Metrics>,
    role: Mutex<Role>,
}

impl Elector {
    /// An elector for `holder` (this process's name in the lease row).
    pub(crate) fn new(
        store: Arc<dyn Store>,
        policy: LeasePolicy,
        holder: String,
        fence: Fence,
        metrics: Arc<Metrics>,
    ) -> Self {
        metrics.leader.leading(None);
        Self {
            store,
            policy,
            holder,
            fence,
            metrics,
            role: Mutex::new(Role::Standby(None)),
        }
    }

    /// This process's name in the lease row.
    pub(crate) fn holder(&self) -> &str {
        &self.holder
    }

    /// Leader or standby.
    pub(crate) fn role(&self) -> Role {
        self.lock().clone()
    }

    /// One lease call, bounded by the policy's call timeout.
    async fn call<T>(
        &self,
        what: &'static str,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, String> {
        match tokio::time::timeout(self.policy.call_timeout(), f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "{what} did not answer within {:?}",
                self.policy.call_timeout()
            )),
        }
    }

    /// Stands by until this process holds the lease; returns its term (the
    /// fence is granted by then).
    pub(crate) async fn acquire(&self) -> Term {
        let mut announced: Option<(String, Term)> = None;
        loop {
            let started = Instant::now();
            let acquired = self
                .call(
                    "acquiring the lease",
                    self.store.acquire_lease(&self.holder, self.policy.duration),
                )
                .await;
            match acquired {
                Ok(Some(term)) => {
                    self.fence.grant(term, started + self.policy.trust_for());
                    *self.lock() = Role::Leader(term);
                    self.metrics.leader.leading(Some(term));
                    self.metrics.leader.acquired(term);
                    tracing::info!(holder = %self.holder, term = term.0, "leading: lease acquired");
                    return term;
                }
                Ok(None) => {
                    let seen = self
                        .call("reading the lease", self.store.lease())
                        .await
                        .ok()
                        .flatten();
                    if let Some(h) = &seen {
                        let key = (h.holder.clone(), h.term);
                        if announced.as_ref() != Some(&key) {
                            tracing::info!(
                                holder = %self.holder,
                                leader = %h.holder,
                                term = h.term.0,
                                expires_at = %h.expires_at,
                                "standing by: another sandboxd holds the lease"
                            );
                            announced = Some(key);
                        }
                    }
                    *self.lock() = Role::Standby(seen);
                }
                Err(error) => {
                    tracing::warn!(holder = %self.holder, error = %error, "cannot reach the lease; standing by");
                }
            }
            tokio::time::sleep(self.policy.renew_every()).await;
        }
    }

    /// Renews the lease of `term` until it is lost or can no longer be
    /// trusted; then revokes the fence and returns.
    pub(crate) async fn hold(&self, term: Term) {
        loop {
            let Some(until) = self.fence.until() else {
                self.lose(term, "the fence was revoked");
                return;
            };
            // Wake for the next renewal, or when trust runs out if sooner.
            tokio::time::sleep_until((Instant::now() + self.policy.renew_every()).min(until)).await;
            if self.fence.check().is_err() {
                self.metrics.leader.lease_renewal("error");
                self.lose(
                    term,
                    "the lease could not be renewed within its trusted time",
                );
                return;
            }
            let started = Instant::now();
            // A renewal still out when trust runs out has failed.
            let renewal = self
                .store
                .renew_lease(&self.holder, term, self.policy.duration);
            let renewed = tokio::time::timeout_at(until, self.call("renewing the lease", renewal))
                .await
                .unwrap_or_else(
                    |_| Err("the lease's trusted time ran out during a renewal".into()),
                );
            match renewed {
                Ok(true) => {
                    self.fence.grant(term, started + self.policy.trust_for());
                    self.metrics.leader.lease_renewal("ok");
                }
                Ok(false) => {
                    self.metrics.leader.lease_renewal("lost");
                    self.lose(
                        term,
                        "the lease is no longer this process's: another sandboxd took over",
                    );
                    return;
                }
                Err(error) => {
                    self.metrics.leader.lease_renewal("error");
                    if self.fence.check().is_err() {
                        self.lose(
                            term,
                            "the lease could not be renewed within its trusted time",
                        );
                        return;
                    }
                    tracing::warn!(holder = %self.holder, term = term.0, error = %error, "lease renewal failed; retrying");
                }
            }
        }
    }

    fn lose(&self, term: Term, why: &'static str) {
        self.fence.revoke();
        *self.lock() = Role::Standby(None);
        self.metrics.leader.leading(None);
        self.metrics.leader.lost();
        tracing::warn!(holder = %self.holder, term = term.0, reason = why, "leadership lost; standing by");
    }

    /// Gives the lease of `term` up (a clean shutdown), so that a standby
    /// takes over at once.
    pub(crate) async fn release(&self, term: Term) {
        self.fence.revoke();
        *self.lock() = Role::Standby(None);
        self.metrics.leader.leading(None);
        match self
            .call(
                "releasing the lease",
                self.store.release_lease(&self.holder, term),
            )
            .await
        {
            Ok(()) => tracing::info!(holder = %self.holder, term = term.0, "lease released"),
            Err(error) => {
                tracing::warn!(holder = %self.holder, term = term.0, error = %error, "could not release the lease; a standby takes over once it expires")
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Role> {
        self.role.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeStore;
    use std::time::Duration;

    fn elector(store: Arc<FakeStore>, holder: &str, fence: Fence) -> Elector {
        Elector::new(
            store,
            LeasePolicy::new(Duration::from_secs(15)).unwrap(),
            holder.into(),
            fence,
            Arc::new(Metrics::new()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_process_leads_and_a_second_stands_by_until_the_lease_runs_out() {
        let store = Arc::new(FakeStore::default());
        let (fa, fb) = (Fence::default(), Fence::default());
        let a = elector(store.clone(), "a", fa.clone());
        let b = Arc::new(elector(store.clone(), "b", fb.clone()));
        assert_eq!(a.acquire().await, Term(1));
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.acquire().await }
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(
            !waiting.is_finished(),
            "b must not lead while a's lease is valid"
        );
        assert!(matches!(b.role(), Role::Standby(Some(h)) if h.holder == "a"));
        // a stops renewing (killed): its fence runs out first, then the lease.
        assert!(fa.check().is_err(), "a stops trusting its lease after 10s");
        let term = waiting.await.unwrap();
        assert_eq!(term, Term(2));
        assert_eq!(fb.check(), Ok(Term(2)));
        assert_eq!(store.lease_of(), Some(("b".into(), Term(2))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_that_keeps_renewing_keeps_its_fence_open() {
        let store = Arc::new(FakeStore::default());
        let fence = Fence::default();
        let a = Arc::new(elector(store.clone(), "a", fence.clone()));
        let term = a.acquire().await;
        let holding = tokio::spawn({
            let a = a.clone();
            async move { a.hold(term).await }
        });
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(fence.check(), Ok(term));
        assert!(!holding.is_finished());
        holding.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_whose_lease_was_taken_revokes_its_fence_at_its_next_renewal() {
        let store = Arc::new(FakeStore::default());
        let fence = Fence::default();
        let a = elector(store.clone(), "a", fence.clone());
        let term = a.acquire().await;
        store.steal_lease("b", Duration::from_secs(15));
        a.hold(term).await;
        assert!(fence.check().is_err());
        assert!(matches!(a.role(), Role::Standby(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_that_cannot_reach_the_database_stops_acting_before_its_lease_expires() {
        let store = Arc::new(FakeStore::default());
        let fence = Fence::default();
        let a = elector(store.clone(), "a", fence.clone());
        let term = a.acquire().await;
        let granted = Instant::now();
        store
            .faults
            .set(crate::testing::StoreOp::Lease, crate::testing::Fault::Hang);
        a.hold(term).await;
        let stopped = Instant::now() - granted;
        assert!(fence.check().is_err());
        // Stopped trusting (and gave up) by 10 s, before the 15 s lease
        // can go to anyone else.
        assert!(stopped <= Duration::from_secs(10), "{stopped:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn releasing_the_lease_lets_a_standby_lead_at_its_next_try() {
        let store = Arc::new(FakeStore::default());
        let a = elector(store.clone(), "a", Fence::default());
        let b = elector(store.clone(), "b", Fence::default());
        let term = a.acquire().await;
        a.release(term).await;
        let started = Instant::now();
        assert_eq!(b.acquire().await, Term(2));
        assert!(Instant::now() - started <= Duration::from_secs(3));
    }
}
