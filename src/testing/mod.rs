//! Test support: in-memory fakes of the runtime and the store that can fail
//! or hang on any call on demand (and panic while listing one sandbox), and a fake engine whose readiness
//! probe runs through the runtime's exec. For the reconciler's unit tests
//! only: capabilities are proven against real Docker and Postgres in
//! `tests/`.

pub mod dst;
mod engine;
mod runtime;
#[cfg(feature = "simulation")]
pub mod sim;
mod store;
mod wiring;

pub(crate) use self::engine::{FakeEngine, FAKE_ENGINES, TEMPLATED_FAKE_ENGINES};
pub(crate) use self::runtime::{FakeContainer, FakeRuntime, RuntimeOp};
pub(crate) use self::store::{FakeStore, StoreOp, FAKE_STATE_ID};

/// A valid desired row of the fake engine with `features`, made at `at`
/// (the simulations' rows).
#[cfg_attr(not(feature = "simulation"), allow(dead_code))]
pub(crate) fn fake_row(
    id: crate::domain::SandboxId,
    features: std::collections::BTreeMap<
        crate::domain::EngineName,
        std::collections::BTreeSet<String>,
    >,
    at: chrono::DateTime<chrono::Utc>,
) -> crate::domain::sandbox::DesiredSandbox {
    crate::domain::sandbox::DesiredSandbox {
        id,
        owner: "sim".into(),
        services: vec![FakeEngine::NAME],
        unknown_services: Vec::new(),
        attach: Vec::new(),
        invalid: None,
        features,
        expires_at: None,
        generation: 0,
        incarnation: None,
        updated_at: at,
        created_at: at,
        last_used_at: at,
        idle_timeout: None,
        persistent: false,
        idle_action: Default::default(),
        owner_container: None,
        isolation: None,
        seeds: Default::default(),
        fork_of: None,
    }
}

/// What an injected fault does to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Fail the next `n` calls, then behave.
    Fail(u32),
    /// Let the next `n` calls through, then fail one and behave.
    FailOnceAfter(u32),
    /// Fail every call.
    FailAlways,
    /// Never answer.
    Hang,
}

/// Faults per operation, and how many calls each operation had.
#[derive(Debug)]
pub(crate) struct Faults<Op> {
    faults: std::sync::Mutex<std::collections::HashMap<Op, Fault>>,
    calls: std::sync::Mutex<std::collections::HashMap<Op, u64>>,
}

impl<Op> Default for Faults<Op> {
    fn default() -> Self {
        Self {
            faults: Default::default(),
            calls: Default::default(),
        }
    }
}

impl<Op: std::hash::Hash + Eq + Copy + std::fmt::Debug> Faults<Op> {
    /// Injects `fault` into every later call of `op`.
    pub(crate) fn set(&self, op: Op, fault: Fault) {
        self.faults.lock().unwrap().insert(op, fault);
    }

    /// Removes the fault of `op`.
    pub(crate) fn clear(&self, op: Op) {
        self.faults.lock().unwrap().remove(&op);
    }

    /// How many calls of `op` were made so far (failed ones included).
    pub(crate) fn calls(&self, op: Op) -> u64 {
        self.calls.lock().unwrap().get(&op).copied().unwrap_or(0)
    }

    /// Every operation called so far and how often.
    pub(crate) fn all_calls(&self) -> std::collections::HashMap<Op, u64> {
        self.calls.lock().unwrap().clone()
    }

    /// Applies the fault of `op`, if any: `Err` with a message for a
    /// failure; never returns for a hang.
    pub(crate) async fn check(&self, op: Op) -> Result<(), String> {
        *self.calls.lock().unwrap().entry(op).or_default() += 1;
        let fault = {
            let mut faults = self.faults.lock().unwrap();
            match faults.get(&op).copied() {
                Some(Fault::Fail(n)) if n <= 1 => {
                    faults.remove(&op);
                    Some(Fault::Fail(1))
                }
                Some(Fault::Fail(n)) => {
                    faults.insert(op, Fault::Fail(n - 1));
                    Some(Fault::Fail(n))
                }
                Some(Fault::FailOnceAfter(0)) => {
                    faults.remove(&op);
                    Some(Fault::Fail(1))
                }
                Some(Fault::FailOnceAfter(n)) => {
                    faults.insert(op, Fault::FailOnceAfter(n - 1));
                    None
                }
                other => other,
            }
        };
        match fault {
            None => Ok(()),
            Some(Fault::Fail(_) | Fault::FailAlways | Fault::FailOnceAfter(_)) => {
                Err(format!("injected failure of {op:?}"))
            }
            Some(Fault::Hang) => std::future::pending().await,
        }
    }
}
