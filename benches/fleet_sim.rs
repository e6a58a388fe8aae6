//! Scale simulation of the controller core: a fully converged fleet of N
//! sandboxes over the in-memory fakes, and the resync of a controller
//! that starts over it (initial lists, a relist that plans every row from
//! them, the rows not converged reconciled), its time and the process's
//! resident memory (before the resync: the fakes holding the fleet; and
//! the resync's peak). Targets (issue 11): 100 000 rows resync in under
//! 1 s and under 300 MB resident.
//!
//! `cargo bench --bench fleet_sim --features simulation [-- 10000 100000]`
//! (or `FLEET_SIM_ROWS=10000,100000`; `FLEET_SIM_CONCURRENCY`, default 8
//! as in production). Each N runs in its own child process so that its
//! memory figures are its own. One JSON object per N on stdout, a table
//! on stderr.

use sandboxd::testing::sim;
use std::process::Command;

const CHILD: &str = "FLEET_SIM_CHILD";

fn main() {
    let concurrency = std::env::var("FLEET_SIM_CONCURRENCY")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(8);
    if let Ok(rows) = std::env::var(CHILD) {
        let rows = rows.parse().expect("FLEET_SIM_CHILD is a row count");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        match runtime.block_on(sim::run(rows, concurrency)) {
            Ok(report) => println!("{}", serde_json::to_string(&report).expect("JSON")),
            Err(e) => {
                eprintln!("fleet_sim: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let from_args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rows = if from_args.is_empty() {
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
    let me = std::env::current_exe().expect("the bench's own path");
    eprintln!(
        "{:>8} {:>10} {:>10} {:>8} {:>8} {:>10} {:>10} {:>10}",
        "rows", "resync_s", "setup_s", "creates", "lists", "rss_MiB", "hwm_MiB", "pre_MiB"
    );
    let mut failed = false;
    for n in rows {
        let out = Command::new(&me)
            .env(CHILD, n.to_string())
            .output()
            .expect("the bench can run itself");
        let line = String::from_utf8_lossy(&out.stdout);
        let Some(json) = line.lines().last().filter(|_| out.status.success()) else {
            eprintln!("{n:>8} failed: {}", String::from_utf8_lossy(&out.stderr));
            failed = true;
            continue;
        };
        println!("{json}");
        let v: serde_json::Value = serde_json::from_str(json).expect("the child's JSON");
        let mib = |k: &str| v[k].as_f64().unwrap_or(0.0) / (1024.0 * 1024.0);
        eprintln!(
            "{:>8} {:>10.3} {:>10.1} {:>8} {:>8} {:>10.1} {:>10.1} {:>10.1}",
            n,
            v["resync_seconds"].as_f64().unwrap_or(0.0),
            v["setup_seconds"].as_f64().unwrap_or(0.0),
            v["creates"],
            v["full_lists"],
            mib("rss_bytes"),
            mib("hwm_bytes"),
            mib("rss_before_resync_bytes"),
        );
    }
    if failed {
        std::process::exit(1);
    }
}
