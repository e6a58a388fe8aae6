//! Why a container died, as far as self-heal cares: an order from outside
//! (`docker kill`, `docker stop`, `docker rm -f`: a chaos test, an
//! operator, a script) or the engine's own doing (its process exited, or
//! the kernel killed it for memory). An order is healed at once, every
//! time; only the engine's own deaths count towards the crash-loop
//! back-off (`domain::crash_loop`), because backing off cannot fix what
//! someone outside keeps doing, while it does spare the host an engine
//! that cannot start.
//!
//! Docker tells them apart in its event stream: an API call reports
//! `kill` (with the signal; `docker stop` sends one too) or `destroy`
//! before the container's `die`, while a process that ends on its own
//! reports only `die` (and `oom` first when the kernel killed it). The
//! watcher records the orders ([`Orders`]); a heal looks its dead
//! container up there, and falls back on how the container ended when
//! the stream missed the order (a reconnect): a removed container was
//! removed from outside (an engine cannot remove its own container), and
//! a SIGKILL the kernel's memory killer did not send came from outside.

use super::container::RunState;
use super::id::ContainerId;
use super::plan::HealCause;
use std::collections::HashMap;
use std::sync::Mutex;

/// An order Docker's event stream reported for a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// `kill`: a signal sent through the API (`docker kill`, and the
    /// signals of `docker stop` and `docker rm -f`).
    Kill,
    /// `stop`.
    Stop,
    /// `destroy`: removed.
    Destroy,
}

/// Most orders remembered; past it the oldest go (a heal looks its
/// container up within moments of the order, so only a storm of kills of
/// containers nobody heals could fill it).
const KEEP: usize = 4096;

/// The orders the event stream reported, by container, until the
/// container's heal looks them up. Shared by the event watcher, which
/// records, and the reconciles, which read.
#[derive(Debug, Default)]
pub struct Orders(Mutex<Recorded>);

#[derive(Debug, Default)]
struct Recorded {
    /// Each container's last order, and when it was recorded (a count).
    by_container: HashMap<ContainerId, (Order, u64)>,
    next: u64,
}

impl Orders {
    /// Records that `container` was sent `order` (a later `destroy`
    /// replaces an earlier `kill`: the container is gone).
    pub fn record(&self, container: &ContainerId, order: Order) {
        let mut recorded = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let seq = recorded.next;
        recorded.next += 1;
        let map = &mut recorded.by_container;
        if map.len() >= KEEP && !map.contains_key(container) {
            let oldest = map
                .iter()
                .min_by_key(|(_, (_, s))| *s)
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                map.remove(&oldest);
            }
        }
        map.insert(container.clone(), (order, seq));
    }

    /// The last order `container` was sent, if the stream reported one.
    pub(crate) fn of(&self, container: &ContainerId) -> Option<Order> {
        let recorded = self.0.lock().unwrap_or_else(|e| e.into_inner());
        recorded
            .by_container
            .get(container)
            .map(|(order, _)| *order)
    }

    /// Forgets `container` (its heal has looked).
    pub(crate) fn forget(&self, container: &ContainerId) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_container
            .remove(container);
    }
}

/// The exit code of a process ended by SIGKILL (128 + 9).
const SIGKILLED: i64 = 137;

/// Why the container a heal replaces died: `order` is what the event
/// stream reported for it, `ended` how it ended (`None`: it no longer
/// exists). `retrying` says the engine's last heal did not come up (its
/// new container was removed by sandboxd, so "removed" says nothing of
/// who ended it): that is the engine's doing.
pub(crate) fn cause(order: Option<Order>, ended: Option<&RunState>, retrying: bool) -> HealCause {
    if retrying {
        return HealCause::Exited;
    }
    match (order, ended) {
        (Some(Order::Destroy), _) | (None, None) => HealCause::Removed,
        (Some(Order::Kill | Order::Stop), Some(run)) if run.oom_killed => HealCause::Oom,
        (Some(Order::Kill | Order::Stop), _) => HealCause::Stopped,
        (None, Some(run)) if run.oom_killed => HealCause::Oom,
        (None, Some(run)) if run.exit_code == Some(SIGKILLED) => HealCause::Stopped,
        (None, Some(_)) => HealCause::Exited,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(oom: bool, exit: Option<i64>) -> RunState {
        RunState {
            running: false,
            oom_killed: oom,
            finished_at: None,
            exit_code: exit,
        }
    }

    #[test]
    fn orders_from_outside_are_told_from_the_engines_own_deaths() {
        use HealCause::*;
        type Case = (
            &'static str,
            Option<Order>,
            Option<RunState>,
            bool,
            HealCause,
        );
        let table: [Case; 11] = [
            (
                "docker kill",
                Some(Order::Kill),
                Some(run(false, Some(137))),
                false,
                Stopped,
            ),
            (
                "docker stop: Postgres exits 0 on SIGTERM",
                Some(Order::Kill),
                Some(run(false, Some(0))),
                false,
                Stopped,
            ),
            (
                "docker stop, its own event",
                Some(Order::Stop),
                Some(run(false, Some(0))),
                false,
                Stopped,
            ),
            ("docker rm -f", Some(Order::Destroy), None, false, Removed),
            (
                "removed while the stream was cut",
                None,
                None,
                false,
                Removed,
            ),
            (
                "a kill the stream missed (SIGKILL, not the memory killer)",
                None,
                Some(run(false, Some(137))),
                false,
                Stopped,
            ),
            (
                "exited on its own",
                None,
                Some(run(false, Some(1))),
                false,
                Exited,
            ),
            (
                "exited 0 on its own",
                None,
                Some(run(false, Some(0))),
                false,
                Exited,
            ),
            (
                "the kernel's memory killer",
                None,
                Some(run(true, Some(137))),
                false,
                Oom,
            ),
            (
                "OOM while an operator's signal was on its way",
                Some(Order::Kill),
                Some(run(true, Some(137))),
                false,
                Oom,
            ),
            ("its last heal did not come up", None, None, true, Exited),
        ];
        for (case, order, ended, retrying, want) in table {
            assert_eq!(cause(order, ended.as_ref(), retrying), want, "{case}");
        }
        assert!(!Exited.is_outside_order() && !Oom.is_outside_order());
        assert!(Stopped.is_outside_order() && Removed.is_outside_order());
    }

    #[test]
    fn orders_are_kept_per_container_and_bounded() {
        let orders = Orders::default();
        let a = ContainerId::new("a");
        orders.record(&a, Order::Kill);
        orders.record(&a, Order::Destroy);
        assert_eq!(orders.of(&a), Some(Order::Destroy));
        orders.forget(&a);
        assert_eq!(orders.of(&a), None);
        for i in 0..KEEP + 10 {
            orders.record(&ContainerId::new(format!("c{i}")), Order::Kill);
        }
        assert_eq!(orders.0.lock().unwrap().by_container.len(), KEEP);
        assert_eq!(orders.of(&ContainerId::new("c0")), None, "the oldest went");
        assert!(orders
            .of(&ContainerId::new(format!("c{}", KEEP + 9)))
            .is_some());
    }
}
