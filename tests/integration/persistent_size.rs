//! A persistent sandbox cannot fill the host's disk (issue 29, hole 7):
//! its data volume is an ext4 file system of `--persistent-size` in a
//! sparse file, so a full volume is the engine's "no space left on
//! device", and the host loses at most the cap.

use crate::common;

use common::{eventually, host_pg_url, request, sample, sandbox_id, TestEnv};
use sandboxd::client::Client;
use sqlx::Connection;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
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

/// The file of the capped Docker volume `volume` in `dir`: keyed by its
/// label `io.sandboxd.disk-key` (`NAME.img` without one).
fn volume_file(dir: &str, volume: &str) -> PathBuf {
    let out = std::process::Command::new("docker")
        .args([
            "volume",
            "inspect",
            "--format",
            r#"{{index .Labels "io.sandboxd.disk-key"}}"#,
            volume,
        ])
        .output()
        .expect("run docker volume inspect");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let name = if key.is_empty() || key == "<no value>" {
        format!("{volume}.img")
    } else {
        format!("{volume}.{key}.img")
    };
    Path::new(dir).join(name)
}

/// The files in `dir` whose names start with `volume` and a dot.
fn files_of(dir: &str, volume: &str) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| n.starts_with(&format!("{volume}.")))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Runs `docker ARGS`, which must succeed.
fn docker(args: &[&str]) {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .expect("run docker");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 50, finding 13: the job kept `/disks/NAME.img` by the volume's
/// name alone, so a Docker volume removed behind sandboxd's back left its
/// file, and the next holder of the sandbox id was handed the old data.
/// Now the file is keyed by the Docker volume (a random key in its label):
/// the next holder starts empty, and the orphan is removed.
#[tokio::test]
async fn a_persistent_volume_removed_behind_sandboxds_back_never_hands_its_data_to_the_next_holder_of_the_id(
) {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.persistent_size = 64 << 20;
    let dir = config.disks.dir.clone();
    let controller = env.start(config.clone());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("lost");
    let mut req = request(&["redis"], &[]);
    req.persistent = true;
    let status = client.provision(&id, &req, READY).await.unwrap();
    let mut con = common::host_redis(&status.services["redis"]).await;
    let _: () = redis::cmd("SET")
        .arg("secret")
        .arg("the first tenant's")
        .query_async(&mut con)
        .await
        .unwrap();
    drop(con);
    controller.stop().await;
    let volume = format!("sandboxd.{}.{id}.redis", env.deployment);
    let first = volume_file(&dir, &volume);

    // Behind sandboxd's back: the container stopped (Redis writes its
    // append-only file on the way out) and removed, then its volume; the
    // file stays. Then the row is released, and the id requested again by
    // another owner.
    docker(&["stop", "-t", "10", &volume]);
    docker(&["rm", "-f", &volume]);
    docker(&["volume", "rm", &volume]);
    assert!(first.exists(), "{} outlives its volume", first.display());
    assert!(client.release(&id).await.unwrap());
    let controller = env.start(config.clone());
    req.owner = "the-next-holder".into();
    let status = client.provision(&id, &req, READY).await.unwrap();
    let mut con = common::host_redis(&status.services["redis"]).await;
    let secret: Option<String> = redis::cmd("GET")
        .arg("secret")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(secret, None, "the next holder was handed the old data");
    let keys: i64 = redis::cmd("DBSIZE").query_async(&mut con).await.unwrap();
    assert_eq!(keys, 0);

    // Its own file, under a new key; the orphan is gone.
    let second = volume_file(&dir, &volume);
    assert_ne!(first, second);
    assert!(
        !first.exists(),
        "the orphan {} was removed",
        first.display()
    );
    let second_name = second.file_name().unwrap().to_str().unwrap().to_owned();
    assert_eq!(files_of(&dir, &volume), [second_name]);
    assert!(client.release(&id).await.unwrap());
    eventually(
        "the volume's file to be removed",
        Duration::from_secs(60),
        || async { (!second.exists()).then_some(()) },
    )
    .await;
    controller.stop().await;
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
    let volume = format!("sandboxd.{}.{id}.postgres", env.deployment);
    let file = volume_file(&config.disks.dir, &volume);
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
