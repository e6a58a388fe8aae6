//! The reaping circuit breaker, as the controller keeps it: evaluated at
//! every relist ([`domain::breaker`](crate::domain::breaker) decides),
//! recorded in the state database so that it outlives a restart and a
//! change of leader, and consulted before every reap of a deleted row.
//!
//! While it is open (paused), the containers of rows that went missing
//! stay. `sandboxd resume-reaping` closes it in the database and wakes the
//! controller, whose next relist approves the sandboxes missing at that
//! moment: they are reaped as usual, and the breaker watches anew for the
//! next burst. A deleted row is also reaped only once a relist whose lists
//! were read after the row was seen missing has looked at the fleet, so a
//! burst of single `DELETE`s cannot get ahead of the breaker.

use crate::domain::breaker::{BreakerPolicy, ReapingState};
use crate::domain::id::SandboxId;
use chrono::{DateTime, Utc};
use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};

/// Why a reap is held back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Held {
    /// Reaping is paused.
    Paused(String),
    /// No relist has looked at the fleet since the row was seen missing.
    Unconfirmed,
}

#[derive(Debug, Default)]
struct State {
    /// Paused, and why.
    paused: Option<String>,
    /// The pause is recorded in the state database (so a database that
    /// says "not paused" now means an operator resumed).
    recorded: bool,
    /// Sandboxes the operator let go by resuming.
    approved: BTreeSet<SandboxId>,
    /// When the lists of the last relist's look were read.
    looked_at: Option<DateTime<Utc>>,
}

/// The breaker's state in this process.
#[derive(Debug, Default)]
pub(crate) struct ReapBreaker(Mutex<State>);

/// What one look at the fleet changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing.
    None,
    /// Just tripped: record this reason.
    Tripped(String),
    /// The operator resumed: this many sandboxes are let go.
    Resumed(usize),
    /// Paused in the database by an earlier run or another leader.
    Adopted,
}

impl ReapBreaker {
    /// One look at the fleet as listed at `now`: `recorded` is the database's state,
    /// `fleet` the sandboxes with containers that were not released (their
    /// row is there, or vanished without a tombstone), `missing` those of
    /// them whose desired row is gone.
    pub(crate) fn look(
        &self,
        policy: &BreakerPolicy,
        recorded: &ReapingState,
        fleet: usize,
        missing: &BTreeSet<SandboxId>,
        now: DateTime<Utc>,
    ) -> Change {
        let mut st = self.lock();
        st.looked_at = Some(now);
        st.approved.retain(|id| missing.contains(id));
        let change = match (st.paused.clone(), recorded.paused) {
            (Some(_), true) => {
                st.recorded = true;
                Change::None
            }
            (Some(_), false) if st.recorded => {
                st.approved.extend(missing.iter().cloned());
                st.paused = None;
                st.recorded = false;
                Change::Resumed(missing.len())
            }
            // Tripped, but recording it failed: record it again.
            (Some(reason), false) => Change::Tripped(reason),
            (None, true) => {
                st.paused = Some(recorded.reason.clone());
                st.recorded = true;
                Change::Adopted
            }
            (None, false) => Change::None,
        };
        if change != Change::None || st.paused.is_some() {
            return change;
        }
        let unapproved = missing
            .iter()
            .filter(|id| !st.approved.contains(id))
            .count();
        #[cfg(any(test, feature = "simulation"))]
        if crate::domain::mutation::on(crate::domain::mutation::Mutation::NoBreaker) {
            return Change::None;
        }
        if policy.trips(unapproved, fleet) {
            let reason = policy.reason(unapproved, fleet);
            st.paused = Some(reason.clone());
            Change::Tripped(reason)
        } else {
            Change::None
        }
    }

    /// The pause is now recorded in the state database.
    pub(crate) fn recorded(&self) {
        let mut st = self.lock();
        if st.paused.is_some() {
            st.recorded = true;
        }
    }

    /// Whether the containers of `id`, whose row was first seen missing at
    /// `gone_since`, may be reaped now.
    pub(crate) fn may_reap(&self, id: &SandboxId, gone_since: DateTime<Utc>) -> Result<(), Held> {
        let st = self.lock();
        if st.approved.contains(id) {
            return Ok(());
        }
        if let Some(reason) = &st.paused {
            return Err(Held::Paused(reason.clone()));
        }
        // A look whose lists were read once the row was seen missing.
        match st.looked_at {
            Some(t) if t >= gone_since => Ok(()),
            _ => Err(Held::Unconfirmed),
        }
    }

    /// Why reaping is paused, if it is.
    pub(crate) fn paused(&self) -> Option<String> {
        self.lock().paused.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + secs, 0).unwrap()
    }

    fn ids(n: usize) -> BTreeSet<SandboxId> {
        (0..n)
            .map(|i| SandboxId::parse(&format!("s{i}")).unwrap())
            .collect()
    }

    fn paused(reason: &str) -> ReapingState {
        ReapingState {
            paused: true,
            reason: reason.into(),
            paused_at: Some(at(0)),
        }
    }

    #[test]
    fn a_burst_of_missing_rows_pauses_reaping_until_the_operator_resumes_then_those_go() {
        let b = ReapBreaker::default();
        let p = BreakerPolicy::default();
        let missing = ids(6);
        let id = missing.first().unwrap().clone();
        let Change::Tripped(reason) = b.look(&p, &ReapingState::default(), 10, &missing, at(1))
        else {
            panic!("6 of 10 trips the breaker");
        };
        assert!(matches!(b.may_reap(&id, at(0)), Err(Held::Paused(r)) if r == reason));
        // Recorded; still paused at the next look.
        b.recorded();
        assert_eq!(
            b.look(&p, &paused(&reason), 10, &missing, at(2)),
            Change::None
        );
        assert!(b.may_reap(&id, at(0)).is_err());
        // Resumed in the database: those six may go, and do not trip it again.
        assert_eq!(
            b.look(&p, &ReapingState::default(), 10, &missing, at(3)),
            Change::Resumed(6)
        );
        assert_eq!(b.may_reap(&id, at(0)), Ok(()));
        assert_eq!(
            b.look(&p, &ReapingState::default(), 10, &missing, at(4)),
            Change::None
        );
    }

    #[test]
    fn a_new_burst_after_a_resume_trips_the_breaker_again() {
        let b = ReapBreaker::default();
        let p = BreakerPolicy::default();
        let first = ids(6);
        assert!(matches!(
            b.look(&p, &ReapingState::default(), 10, &first, at(1)),
            Change::Tripped(_)
        ));
        b.recorded();
        b.look(&p, &ReapingState::default(), 10, &first, at(2));
        // The first six are gone; a new fleet of ten loses six rows again.
        let second: BTreeSet<SandboxId> = (10..16)
            .map(|i| SandboxId::parse(&format!("s{i}")).unwrap())
            .collect();
        assert!(matches!(
            b.look(&p, &ReapingState::default(), 10, &second, at(3)),
            Change::Tripped(_)
        ));
    }

    #[test]
    fn a_pause_that_could_not_be_recorded_is_recorded_again_not_taken_for_a_resume() {
        let b = ReapBreaker::default();
        let p = BreakerPolicy::default();
        let missing = ids(6);
        assert!(matches!(
            b.look(&p, &ReapingState::default(), 10, &missing, at(1)),
            Change::Tripped(_)
        ));
        // The write failed: the database still says "not paused".
        assert!(matches!(
            b.look(&p, &ReapingState::default(), 10, &missing, at(2)),
            Change::Tripped(_)
        ));
        assert!(b.paused().is_some());
        // Written now; an operator's resume after that is a resume.
        b.recorded();
        assert_eq!(
            b.look(&p, &ReapingState::default(), 10, &missing, at(3)),
            Change::Resumed(6)
        );
    }

    #[test]
    fn a_pause_recorded_by_an_earlier_run_is_kept() {
        let b = ReapBreaker::default();
        let p = BreakerPolicy::default();
        assert_eq!(
            b.look(&p, &paused("earlier"), 10, &ids(1), at(1)),
            Change::Adopted
        );
        assert_eq!(b.paused().as_deref(), Some("earlier"));
    }

    #[test]
    fn a_row_seen_missing_after_the_last_look_waits_for_the_next_one() {
        let b = ReapBreaker::default();
        let p = BreakerPolicy::default();
        let id = SandboxId::parse("s0").unwrap();
        assert_eq!(b.may_reap(&id, at(0)), Err(Held::Unconfirmed));
        assert_eq!(
            b.look(&p, &ReapingState::default(), 10, &ids(1), at(5)),
            Change::None
        );
        assert_eq!(b.may_reap(&id, at(4)), Ok(()));
        assert_eq!(b.may_reap(&id, at(5)), Ok(()));
        assert_eq!(b.may_reap(&id, at(6)), Err(Held::Unconfirmed));
    }
}
