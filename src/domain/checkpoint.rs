//! Checkpoints and resets of a sandbox's data: the validated names, the
//! requests an orchestrator made (`sandbox_checkpoint`, `sandbox_reset`),
//! the order sandboxd performs them in, and whether a checkpoint fits under
//! the sandbox's memory cap. Pure: the engines produce the commands
//! ([`crate::engine::Engine::checkpoint_command`]) and the controller runs
//! them (`controller::checkpoint`).

use super::id::Incarnation;
use std::collections::BTreeMap;
use std::fmt;

/// The reserved name of the checkpoint sandboxd records after provisioning:
/// the empty database with its features.
pub const BASELINE: &str = "baseline";

/// How much of the memory cap a checkpoint leaves free: a checkpoint is
/// refused unless the container's usage plus the checkpoint stays under
/// this fraction of the cap (the engine needs room to work).
pub const CAP_MARGIN: f64 = 0.9;

/// The most requests one reconcile performs; the rest wait for the next
/// look (a second later), so one sandbox's queue cannot hold a reconcile
/// for long. The database bounds what may be pending at all
/// (`sandbox_checkpoint_settings.max_pending_per_sandbox`, 8 unless the
/// owner raised it).
pub(crate) const STEPS_PER_RECONCILE: usize = 8;

/// A checkpoint's name: 1 to 31 characters from `a-z`, `0-9`, `_` and `-`,
/// starting with a letter or digit (safe in a database name, a file name
/// and a shell word), or [`BASELINE`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckpointName(String);

/// Why a checkpoint name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("checkpoint name {0:?} is not valid: use 1 to 31 characters from a-z, 0-9, \"_\" and \"-\", starting with a letter or digit")]
pub struct NameError(String);

impl CheckpointName {
    /// Validates `name` (which may be [`BASELINE`]).
    pub fn parse(name: &str) -> Result<Self, NameError> {
        let bytes = name.as_bytes();
        let ok = (1..=31).contains(&bytes.len())
            && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_' || *b == b'-');
        if ok {
            Ok(Self(name.to_owned()))
        } else {
            Err(NameError(name.chars().take(64).collect()))
        }
    }

    /// The baseline.
    pub fn baseline() -> Self {
        Self(BASELINE.to_owned())
    }

    pub(crate) fn is_baseline(&self) -> bool {
        self.0 == BASELINE
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CheckpointName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A checkpoint row as sandboxd reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Its name, as stored (validated when used).
    pub name: String,
    /// The request number of its latest `sandbox_checkpoint`.
    pub request: i64,
    /// The incarnation of the row it was asked for.
    pub incarnation: Option<Incarnation>,
    /// `requested`, `ready` or `failed`.
    pub state: String,
    /// The containers (engine name → instance token) that hold it.
    pub(crate) instances: BTreeMap<String, String>,
    /// What it takes in memory (all engines), once ready.
    pub size_bytes: Option<u64>,
}

/// A reset asked for and not done yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reset {
    /// Its request number.
    pub request: i64,
    /// The checkpoint to go back to ([`BASELINE`] or a name), as stored.
    pub checkpoint: String,
    /// The incarnation of the row it was asked for.
    pub incarnation: Option<Incarnation>,
}

/// A sandbox's checkpoints and pending resets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Work {
    /// Every checkpoint row of the sandbox.
    pub checkpoints: Vec<Checkpoint>,
    /// Resets not done yet.
    pub resets: Vec<Reset>,
}

/// One request to perform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Record checkpoint `name` (request number `request`).
    Checkpoint {
        /// Request number.
        request: i64,
        /// Name, as stored.
        name: String,
        /// The row's incarnation when asked.
        incarnation: Option<Incarnation>,
    },
    /// Go back to a checkpoint.
    Reset(Reset),
}

impl Step {
    pub(crate) fn request(&self) -> i64 {
        match self {
            Step::Checkpoint { request, .. } => *request,
            Step::Reset(r) => r.request,
        }
    }

    /// The incarnation of the row when it was asked.
    pub(crate) fn incarnation(&self) -> Option<&Incarnation> {
        match self {
            Step::Checkpoint { incarnation, .. } => incarnation.as_ref(),
            Step::Reset(r) => r.incarnation.as_ref(),
        }
    }
}

impl Work {
    /// Whether nothing is asked.
    pub fn is_idle(&self) -> bool {
        self.steps().is_empty()
    }

    /// The requests to perform, in the order they were asked (a reset
    /// asked after a checkpoint finds it taken).
    pub(crate) fn steps(&self) -> Vec<Step> {
        let mut steps: Vec<Step> = self
            .checkpoints
            .iter()
            .filter(|c| c.state == "requested")
            .map(|c| Step::Checkpoint {
                request: c.request,
                name: c.name.clone(),
                incarnation: c.incarnation.clone(),
            })
            .chain(self.resets.iter().cloned().map(Step::Reset))
            .collect();
        steps.sort_by_key(Step::request);
        steps
    }

    /// The requests one reconcile performs: the first `most` of
    /// [`Work::steps`], and whether more are left for a later look.
    pub(crate) fn batch(&self, most: usize) -> (Vec<Step>, bool) {
        let mut steps = self.steps();
        let more = steps.len() > most;
        steps.truncate(most);
        (steps, more)
    }

    /// The ready checkpoint called `name`, if any.
    pub fn ready(&self, name: &str) -> Option<&Checkpoint> {
        self.checkpoints
            .iter()
            .find(|c| c.name == name && c.state == "ready")
    }
}

/// How a checkpoint request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Recorded: its size (all engines) and the containers that hold it.
    Ready {
        /// Bytes it takes in the sandbox's memory.
        size_bytes: u64,
        /// Engine name → instance token of the container holding it.
        instances: BTreeMap<String, String>,
    },
    /// Not recorded, and why (no credential).
    Failed(String),
}

/// A container's memory as its cgroup counts it (tmpfs pages included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// Bytes in use.
    pub used: u64,
    /// The cap (`None`: unlimited).
    pub limit: Option<u64>,
}

/// Whether a checkpoint of `size` bytes fits in `memory` with the
/// [`CAP_MARGIN`]; the error says what to do.
pub fn fits(size: u64, memory: Memory) -> Result<(), String> {
    let Some(limit) = memory.limit else {
        return Ok(());
    };
    let room = (limit as f64 * CAP_MARGIN) as u64;
    if memory.used.saturating_add(size) <= room {
        Ok(())
    } else {
        Err(format!(
            "a checkpoint of {} would not fit: the container uses {} of its {} memory cap, and a checkpoint must leave {:.0}% of it free (its data is in memory, on tmpfs); reset to an earlier checkpoint, take fewer checkpoints (a name taken again is replaced), or request the sandbox with a larger memory cap",
            mib(size),
            mib(memory.used),
            mib(limit),
            (1.0 - CAP_MARGIN) * 100.0
        ))
    }
}

/// `12.3 MiB`.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Reads a cgroup's usage and limit as a command inside the container
/// prints them: `<used> <limit>` (a limit of `max` or a huge number, as
/// cgroup v1 reports "unlimited", is none).
pub(crate) fn parse_memory(text: &str) -> Option<Memory> {
    let mut words = text.split_whitespace();
    let used = words.next()?.parse().ok()?;
    let limit = match words.next()? {
        "max" => None,
        n => {
            let n: u64 = n.parse().ok()?;
            // cgroup v1's "no limit" is a page-rounded i64::MAX.
            (n < (1u64 << 60)).then_some(n)
        }
    };
    Some(Memory { used, limit })
}

/// The value of the last `size=<bytes>` line a checkpoint command printed.
pub(crate) fn parse_size(output: &str) -> Option<u64> {
    output
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("size="))
        .and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_lowercase_words_safe_in_sql_files_and_shells() {
        for ok in [
            "a",
            "before-migration",
            "v2_3",
            "0",
            &"x".repeat(31),
            BASELINE,
        ] {
            assert!(CheckpointName::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "_a",
            "A",
            "a b",
            "a;drop",
            "a'b",
            "a\"b",
            "é",
            &"x".repeat(32),
        ] {
            assert!(CheckpointName::parse(bad).is_err(), "{bad}");
        }
        assert!(CheckpointName::baseline().is_baseline());
    }

    fn checkpoint(name: &str, request: i64, state: &str) -> Checkpoint {
        Checkpoint {
            name: name.into(),
            request,
            incarnation: None,
            state: state.into(),
            instances: BTreeMap::new(),
            size_bytes: None,
        }
    }

    #[test]
    fn requests_are_performed_in_the_order_they_were_asked() {
        let work = Work {
            checkpoints: vec![
                checkpoint("b", 5, "requested"),
                checkpoint("a", 1, "ready"),
                checkpoint("c", 2, "requested"),
            ],
            resets: vec![Reset {
                request: 3,
                checkpoint: "c".into(),
                incarnation: None,
            }],
        };
        let order: Vec<i64> = work.steps().iter().map(Step::request).collect();
        assert_eq!(order, [2, 3, 5]);
        assert!(work.ready("a").is_some());
        assert!(work.ready("c").is_none());
        assert!(Work::default().is_idle());
    }

    #[test]
    fn a_reconcile_performs_at_most_a_batch_and_says_when_more_are_left() {
        let reset = |request| Reset {
            request,
            checkpoint: BASELINE.into(),
            incarnation: None,
        };
        // (pending resets, most per batch) → (requests performed, more left)
        let cases: [(i64, usize, &[i64], bool); 4] = [
            (0, 8, &[], false),
            (3, 8, &[1, 2, 3], false),
            (8, 8, &[1, 2, 3, 4, 5, 6, 7, 8], false),
            (10, 4, &[1, 2, 3, 4], true),
        ];
        for (pending, most, performed, more) in cases {
            let work = Work {
                checkpoints: Vec::new(),
                resets: (1..=pending).map(reset).collect(),
            };
            let (steps, left) = work.batch(most);
            let requests: Vec<i64> = steps.iter().map(Step::request).collect();
            assert_eq!(
                (requests.as_slice(), left),
                (performed, more),
                "{pending} pending, {most} per batch"
            );
        }
    }

    #[test]
    fn a_checkpoint_that_would_pass_the_margin_under_the_cap_is_refused() {
        let mb = 1024 * 1024;
        let memory = Memory {
            used: 100 * mb,
            limit: Some(256 * mb),
        };
        assert!(fits(100 * mb, memory).is_ok());
        let refused = fits(140 * mb, memory).unwrap_err();
        assert!(refused.contains("would not fit"), "{refused}");
        assert!(refused.contains("256.0 MiB"), "{refused}");
        assert!(fits(
            u64::MAX / 2,
            Memory {
                used: 0,
                limit: None
            }
        )
        .is_ok());
    }

    #[test]
    fn cgroup_figures_and_sizes_are_read_from_command_output() {
        assert_eq!(
            parse_memory("123 456\n"),
            Some(Memory {
                used: 123,
                limit: Some(456)
            })
        );
        assert_eq!(parse_memory("5 max").unwrap().limit, None);
        assert_eq!(parse_memory("5 9223372036854771712").unwrap().limit, None);
        assert_eq!(parse_memory("x y"), None);
        assert_eq!(parse_size("NOTICE: hi\nsize=42\n"), Some(42));
        assert_eq!(parse_size("nothing"), None);
    }
}
