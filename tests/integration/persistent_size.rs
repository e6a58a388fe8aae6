//! A persistent sandbox cannot fill the host's disk (issue 29, hole 7):
//! its data volume is an ext4 file system of `--persistent-size` in a
//! sparse file, so a full volume is the engine's "no space left on
//! device", and the host loses at most the cap.

use crate::common;

use common::{eventually, host_pg_url, request, sample, sandbox_id, TestEnv};
use sandboxd::client::Client;
use sqlx::Connection;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);
const CAP: u64 = 128 << 20;

/// Bytes available to unprivileged writers on the file system of `path`.
fn host_available(path: &str) -> u64 {
    let out = std::process::Command::new("df")
        .args(["-B1", "--output=avail", path])
        .output()
        .expect("run df");
    let out = String::from_utf8_lossy(&out.stdout);
    out.trim()
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("df {path}: {out}"))
}

#[tokio::test]
async fn a_full_persistent_volume_gives_the_engine_no_space_while_the_host_loses_at_most_the_cap() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.persistent_size = CAP;
    let controller = env.start(config.clone());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("capped");
    let mut req = request(&["postgres"], &[]);
    req.persistent = true;
    let status = client.provision(&id, &req, READY).await.unwrap();
    let file =
        Path::new(&config.disks.dir).join(format!("sandboxd.{}.{id}.postgres.img", env.deployment));
    assert_eq!(
        std::fs::metadata(&file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
            .len(),
        CAP,
        "the volume is a file system of the cap"
    );

    // Far more than the cap (about 400 MB): unlogged, so the table's own
    // files hit the wall, not the write-ahead log.
    let mut conn = sqlx::PgConnection::connect(&host_pg_url(&status.services["postgres"]))
        .await
        .unwrap();
    let err = sqlx::raw_sql(
        "CREATE UNLOGGED TABLE fill AS \
         SELECT repeat(md5(i::text), 32) AS pad FROM generate_series(1, 400000) AS i",
    )
    .execute(&mut conn)
    .await
    .expect_err("the volume is full before the table is written");
    assert!(
        err.to_string().contains("No space left on device"),
        "the engine's error: {err}"
    );
    let allocated = std::fs::metadata(&file).unwrap().blocks() * 512;
    assert!(
        allocated <= CAP,
        "the file takes {allocated} bytes of the host, more than the cap {CAP}"
    );
    // What the engine hit is its own wall, not the host's.
    let host = host_available(&config.disks.dir);
    assert!(host > 1 << 30, "the host has {host} bytes left");

    // The engine goes on: the failed statement's files are gone again.
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .expect("the engine still answers");
    assert_eq!(one, 1);
    conn.close().await.unwrap();

    // The metric: what the capped volumes take of the host, and their caps.
    let text = eventually(
        "a relist to measure the volume",
        Duration::from_secs(30),
        || async {
            let text = controller.metrics.render();
            (sample(&text, "sandboxd_persistent_disk_bytes{kind=\"size\"}") == Some(CAP as f64))
                .then_some(text)
        },
    )
    .await;
    let used = sample(&text, "sandboxd_persistent_disk_bytes{kind=\"used\"}").unwrap();
    assert!(used > 0.0 && used <= CAP as f64, "used {used}");

    // Released: the volume's file goes with it.
    assert!(client.release(&id).await.unwrap());
    eventually(
        "the volume's file to be removed",
        Duration::from_secs(60),
        || async { (!file.exists()).then_some(()) },
    )
    .await;
    controller.stop().await;
}
