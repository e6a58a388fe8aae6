//! Scale simulation of the controller core: a fully converged fleet of N
//! sandboxes over the in-memory fakes, and the resync of a controller
//! that starts over it (initial lists, a relist that plans every row from
//! them, the rows not converged reconciled): its time, the process's
//! resident memory (before the resync: the fakes holding the fleet; and
//! the resync's peak), and the heap the controller held for the resync
//! (the peak of live heap bytes above the fakes' fleet, counted by this
//! binary's allocator). Targets (issue 11): 100 000 rows resync in under
//! 1 s and under 300 MB.
//!
//! `cargo bench --bench fleet_sim --features simulation [-- 10000 100000]`
//! (or `FLEET_SIM_ROWS=10000,100000`; `FLEET_SIM_CONCURRENCY`, default 8
//! as in production). Each N runs twice, each time in its own child
//! process so that its memory figures are its own: once for the time and
//! resident memory, once with the heap counted (counting slows every
//! allocation, so that run's time is not the one reported). One JSON
//! object per N on stdout, a table on stderr.

use sandboxd::testing::sim::{self, HeapMeter};
use std::alloc::{GlobalAlloc, Layout, System};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};

const CHILD: &str = "FLEET_SIM_CHILD";
const COUNT_HEAP: &str = "FLEET_SIM_COUNT_HEAP";

/// The system allocator, counting live bytes and their peak once
/// [`COUNTING`] is set (at the start of a counting child's `main`; the
/// few allocations before it may be freed uncounted, hence signed).
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);

fn counted(delta: i64) {
    if COUNTING.load(Relaxed) {
        let live = LIVE.fetch_add(delta, Relaxed) + delta;
        if delta > 0 {
            PEAK.fetch_max(live, Relaxed);
        }
    }
}

// SAFETY: every call is passed on to `System` unchanged; the counters
// only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            counted(layout.size() as i64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            counted(layout.size() as i64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        counted(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            counted(new_size as i64 - layout.size() as i64);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Reads the counters of [`Counting`].
struct Meter;

impl HeapMeter for Meter {
    fn live(&self) -> u64 {
        LIVE.load(Relaxed).max(0) as u64
    }

    fn peak(&self) -> u64 {
        PEAK.load(Relaxed).max(0) as u64
    }

    fn reset_peak(&self) {
        PEAK.store(LIVE.load(Relaxed), Relaxed);
    }
}

/// Runs one simulation in this process and prints its report.
fn child(rows: &str, concurrency: usize) {
    let count_heap = std::env::var_os(COUNT_HEAP).is_some();
    COUNTING.store(count_heap, Relaxed);
    let rows = rows.parse().expect("FLEET_SIM_CHILD is a row count");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let heap = count_heap.then_some(&Meter as &dyn HeapMeter);
    match runtime.block_on(sim::run(rows, concurrency, heap)) {
        Ok(report) => println!("{}", serde_json::to_string(&report).expect("JSON")),
        Err(e) => {
            eprintln!("fleet_sim: {e}");
            std::process::exit(1);
        }
    }
}

/// Runs this binary as a child simulating `rows`, with the heap counted
/// or not; its report as JSON.
fn run_child(rows: usize, count_heap: bool) -> Result<serde_json::Value, String> {
    let me = std::env::current_exe().expect("the bench's own path");
    let mut command = Command::new(me);
    command.env(CHILD, rows.to_string());
    if count_heap {
        command.env(COUNT_HEAP, "1");
    } else {
        command.env_remove(COUNT_HEAP);
    }
    let out = command.output().expect("the bench can run itself");
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().last().filter(|_| out.status.success()) {
        Some(json) => serde_json::from_str(json).map_err(|e| format!("the child's JSON: {e}")),
        None => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

fn main() {
    let concurrency = std::env::var("FLEET_SIM_CONCURRENCY")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(8);
    if let Ok(rows) = std::env::var(CHILD) {
        child(&rows, concurrency);
        return;
    }
    let from_args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rows: Vec<usize> = if from_args.is_empty() {
        std::env::var("FLEET_SIM_ROWS")
            .unwrap_or_else(|_| "10000,100000".into())
            .split(',')
            .map(|n| {
                n.trim()
                    .parse()
                    .expect("FLEET_SIM_ROWS is a list of row counts")
            })
            .collect()
    } else {
        from_args
    };
    eprintln!(
        "{:>8} {:>10} {:>10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "rows",
        "resync_s",
        "setup_s",
        "creates",
        "rss_MiB",
        "hwm_MiB",
        "pre_MiB",
        "heap0_MiB",
        "heapmax_MiB"
    );
    let mut failed = false;
    for n in rows {
        let report = run_child(n, false).and_then(|mut timed| {
            let counted = run_child(n, true)?;
            for key in ["heap_before_resync_bytes", "heap_peak_resync_bytes"] {
                timed[key] = counted[key].clone();
            }
            Ok(timed)
        });
        let v = match report {
            Ok(v) => v,
            Err(e) => {
                eprintln!("{n:>8} failed: {e}");
                failed = true;
                continue;
            }
        };
        println!("{v}");
        let mib = |k: &str| v[k].as_f64().unwrap_or(0.0) / (1024.0 * 1024.0);
        eprintln!(
            "{:>8} {:>10.3} {:>10.1} {:>8} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            n,
            v["resync_seconds"].as_f64().unwrap_or(0.0),
            v["setup_seconds"].as_f64().unwrap_or(0.0),
            v["creates"],
            mib("rss_bytes"),
            mib("hwm_bytes"),
            mib("rss_before_resync_bytes"),
            mib("heap_before_resync_bytes"),
            mib("heap_peak_resync_bytes"),
        );
    }
    if failed {
        std::process::exit(1);
    }
}
