//! The simulation in CI: 10 000 seeded worlds (more with
//! `SANDBOXD_SIM_SEEDS=N`), determinism, the regression seeds, the
//! mutations each invariant must catch, and the replay of one seed.

use super::*;
use std::time::Instant;

/// Seeds CI runs; `SANDBOXD_SIM_SEEDS` sets another number.
const CI_SEEDS: u64 = 10_000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
    })
}

/// Runs seeds `first..first + n` on every core, returning the failures
/// (seed, failure) in seed order and the seeds run per second.
fn sweep(first: u64, n: u64, o: &Options) -> (Vec<(u64, Failure)>, f64) {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let started = Instant::now();
    let failures: Vec<(u64, Failure)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    (first + t..first + n)
                        .step_by(threads as usize)
                        .filter_map(|seed| run(seed, o).failure.map(|f| (seed, f)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<(u64, Failure)> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("a simulation thread"))
            .collect();
        all.sort_by_key(|(seed, _)| *seed);
        all
    });
    (failures, n as f64 / started.elapsed().as_secs_f64())
}

/// The shrunk report of a failing seed: what broke, the steps and trace
/// that still break it, and the command that replays them.
fn report(seed: u64, o: &Options, failure: &Failure) -> String {
    let (shrunk, outcome) = shrink(seed, o, failure, 300);
    let steps = shrunk.only.as_ref().map_or(o.steps, BTreeSet::len);
    format!(
        "seed {seed} broke {}\nshrunk to {steps} workload steps; replay with:\n  {}\n--- shrunk trace ---\n{}",
        outcome.failure.as_ref().map_or(&failure.what, |f| &f.what),
        replay_command(seed, &shrunk),
        outcome.trace
    )
}

#[test]
fn ten_thousand_seeded_worlds_keep_every_invariant() {
    let n = env_u64("SANDBOXD_SIM_SEEDS").unwrap_or(CI_SEEDS);
    let first = env_u64("SANDBOXD_SIM_FIRST").unwrap_or(0);
    let o = Options::default();
    let (failures, per_second) = sweep(first, n, &o);
    eprintln!(
        "simulation: {n} seeds from {first}, {per_second:.0} seeds/s, {} failed",
        failures.len()
    );
    // The open ones must still fail, each as recorded (else: fixed, move
    // it to REGRESSIONS); no other may.
    for (seed, invariant, why) in OPEN {
        if (first..first + n).contains(seed) {
            let broke = failures
                .iter()
                .find(|(s, _)| s == seed)
                .map(|(_, f)| f.invariant());
            assert_eq!(
                broke,
                Some(*invariant),
                "open seed {seed} ({why}) no longer breaks {invariant}: move it to REGRESSIONS"
            );
        }
    }
    let failures: Vec<(u64, Failure)> = failures
        .into_iter()
        .filter(|(seed, _)| !OPEN.iter().any(|(open, _, _)| open == seed))
        .collect();
    if let Some((seed, failure)) = failures.first() {
        let seeds: Vec<String> = failures
            .iter()
            .take(20)
            .map(|(s, f)| format!("{s} ({})", f.invariant()))
            .collect();
        panic!(
            "{} of {n} seeds failed: {}\n\n{}",
            failures.len(),
            seeds.join(", "),
            report(*seed, &o, failure)
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_trace_byte_for_byte() {
    for seed in [1, 2, 3, 42, 4242] {
        let o = Options::default();
        let a = run(seed, &o);
        let b = run(seed, &o);
        assert!(
            a.trace.len() > 1000,
            "seed {seed} traced almost nothing:\n{}",
            a.trace
        );
        assert_eq!(a.trace, b.trace, "seed {seed} replayed differently");
        assert_ne!(a.trace, run(seed + 1, &o).trace);
    }
}

#[test]
fn every_regression_seed_passes() {
    for (seed, steps, what) in REGRESSIONS {
        let o = Options {
            only: (!steps.is_empty()).then(|| steps.iter().copied().collect()),
            ..Options::default()
        };
        let outcome = run(*seed, &o);
        assert!(
            outcome.failure.is_none(),
            "regression seed {seed} ({what}) fails again: {:?}\n{}",
            outcome.failure,
            outcome.trace
        );
    }
}

/// The first seed from `first` (in chunks, on every core) whose world
/// breaks `invariant`, and how many seeds were run to find it.
fn first_caught(o: &Options, invariant: &str, budget: u64) -> Option<(u64, Failure)> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let chunk = 64;
    let mut from = 0;
    while from < budget {
        let found = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    s.spawn(move || {
                        (from + t..(from + chunk).min(budget))
                            .step_by(threads as usize)
                            .filter_map(|seed| {
                                run(seed, o)
                                    .failure
                                    .filter(|f| f.invariant() == invariant)
                                    .map(|f| (seed, f))
                            })
                            .next()
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().expect("a simulation thread"))
                .min_by_key(|(seed, _)| *seed)
        });
        if found.is_some() {
            return found;
        }
        from += chunk;
    }
    None
}

/// Each invariant has a broken controller that the CI budget catches:
/// the first seed whose world breaks exactly that invariant, and how many
/// seeds that took (docs/simulation.md has the table).
#[test]
fn every_mutation_is_caught_within_the_ci_budget() {
    for m in Mutation::ALL {
        let o = Options {
            mutation: Some(m),
            ..Options::default()
        };
        let invariant = m.caught_by();
        let Some((seed, failure)) = first_caught(&o, invariant, CI_SEEDS) else {
            panic!(
                "the mutation {} went unnoticed by the {invariant} invariant for {CI_SEEDS} seeds",
                m.name()
            )
        };
        eprintln!(
            "mutation {:<22} caught by {invariant:<13} at seed {seed} ({} seeds): {}",
            m.name(),
            seed + 1,
            failure.what
        );
    }
}

/// Replays one seed (`SANDBOXD_SIM_SEED`, optionally `SANDBOXD_SIM_STEPS`
/// and `SANDBOXD_SIM_MUTATION`) and prints its trace; without the
/// variable, replays seed 0 and checks it passes.
#[test]
fn replay() {
    // SANDBOXD_SIM_LOG=sandboxd=debug prints the controllers' logs too.
    if let Ok(filter) = std::env::var("SANDBOXD_SIM_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .without_time()
            .try_init();
    }
    let seed = env_u64("SANDBOXD_SIM_SEED").unwrap_or(0);
    let o = Options {
        only: std::env::var("SANDBOXD_SIM_STEPS").ok().map(|v| {
            v.split(',')
                .map(|s| s.trim().parse().expect("SANDBOXD_SIM_STEPS: step numbers"))
                .collect()
        }),
        switches: {
            // SANDBOXD_SIM_OFF=events,calls turns perturbations off by name.
            let off = std::env::var("SANDBOXD_SIM_OFF").unwrap_or_default();
            Switches {
                stale_lists: !off.contains("stale"),
                event_faults: !off.contains("events"),
                call_faults: !off.contains("calls"),
                lies: !off.contains("lies"),
                out_of_band: !off.contains("oob"),
                crashes: !off.contains("crashes"),
                rivals: !off.contains("rivals"),
                restores: !off.contains("restores"),
            }
        },
        mutation: std::env::var("SANDBOXD_SIM_MUTATION")
            .ok()
            .map(|m| Mutation::parse(&m).unwrap_or_else(|| panic!("no mutation {m}"))),
        ..Options::default()
    };
    let outcome = run(seed, &o);
    println!("{}", outcome.trace);
    if let Some(f) = outcome.failure {
        panic!("seed {seed} broke {}", f.what);
    }
}
