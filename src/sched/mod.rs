//! Scheduling: the generic keyed work queue that runs reconciles, with
//! dedup, one run per key at a time, a concurrency limit, per-key backoff
//! and panic isolation.

pub mod queue;

pub use self::queue::{Failed, FinishedAs, Next, QueueConfig, QueueObserver, WorkQueue};
