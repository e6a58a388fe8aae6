//! The state Postgres of the tests: sandboxd's own database, always with a
//! superuser for the test and an ordinary role `sandboxd` owning the
//! database for the controller (so every test proves the controller works
//! without superuser rights).
//!
//! Most tests get a fresh database on one server shared by the whole test
//! process: the first test to ask starts it (with the docker CLI) and
//! migrates a template database once; every test then gets its own copy
//! (`CREATE DATABASE … TEMPLATE`, a few milliseconds instead of a container
//! start and a migration) under its own name, dropped when the test ends.
//! A watcher process removes the server once the test process has exited,
//! however it ends. Only what is plain data is shared: the URLs. Each
//! `#[tokio::test]` has its own runtime, so a pool or a handle made on one
//! would be dead on the next.
//!
//! Databases share their server's roles: `sandboxd` is one role for all of
//! them, and a login role a test creates (`orchestrator`, `alice`, …) is
//! the same role for every test that names it; each test grants it
//! privileges in its own database only. Tests that stop, pause or restart
//! the server, or act on every session of a role, start a server of their
//! own ([`StatePostgres::start_with`]).

use super::{eventually, random_suffix};
use sqlx::{Connection, PgConnection};
use std::sync::OnceLock;
use std::time::Duration;
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

/// Label on every state Postgres the fixtures start (`scripts/test.sh`
/// removes any a killed test run left behind).
pub const STATE_LABEL: &str = "io.sandboxd.test-state";

/// The migrated database every shared test database is a copy of.
const TEMPLATE: &str = "sandboxd_template";

/// The image of the state Postgres: `SANDBOXD_TEST_STATE_IMAGE`, else the
/// Debian-built `sandboxd/postgres:17`.
fn state_image() -> (String, String) {
    let image = std::env::var("SANDBOXD_TEST_STATE_IMAGE")
        .unwrap_or_else(|_| "sandboxd/postgres:17".into());
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => (name.into(), tag.into()),
        _ => (image, "latest".into()),
    }
}

/// Where a state Postgres of its own keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateStorage {
    /// On tmpfs, published on a port Docker picks: fast, lost on a restart.
    Tmpfs,
    /// On the image's volume and published on `port`, so that `docker
    /// restart` brings the same database back at the same address.
    Restartable {
        /// The host port.
        port: u16,
    },
}

/// A throwaway database for sandboxd's own state, removed when dropped: a
/// database of the shared server, or a whole server of its own.
pub struct StatePostgres {
    /// `postgres://sandboxd:…@127.0.0.1:PORT/DB`: the controller's role, a
    /// non-superuser that owns the database.
    pub url: String,
    /// `postgres://postgres:…@127.0.0.1:PORT/DB`: a superuser, for tests
    /// that create roles or force rows in.
    pub admin_url: String,
    place: Place,
}

/// Where a [`StatePostgres`] lives.
enum Place {
    /// The database `name` on the process's shared server.
    Shared { name: String },
    /// A server of its own, removed with the container.
    Own(Box<ContainerAsync<GenericImage>>),
}

impl StatePostgres {
    /// An empty database (not migrated) on the shared server, owned by
    /// `sandboxd`.
    pub async fn start() -> Self {
        Self::on_shared_server("template1").await
    }

    /// A fresh copy of the migrated template database on the shared
    /// server, owned by `sandboxd`, with an identity of its own (as if it
    /// had been migrated itself).
    pub async fn migrated() -> Self {
        let state = Self::on_shared_server(TEMPLATE).await;
        state.new_identity().await;
        state
    }

    /// A new database on the shared server, a copy of `template`.
    async fn on_shared_server(template: &str) -> Self {
        let server = Server::shared();
        let name = format!("sandboxd_{}", random_suffix());
        let mut admin = PgConnection::connect(&server.admin_url("postgres"))
            .await
            .expect("connect to the shared state Postgres as its superuser");
        sqlx::query(&format!(
            "CREATE DATABASE {name} TEMPLATE {template} OWNER sandboxd"
        ))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("create the test database {name}: {e}"));
        admin.close().await.expect("close the setup connection");
        Self {
            url: server.url(&name),
            admin_url: server.admin_url(&name),
            place: Place::Shared { name },
        }
    }

    /// A copy carries its template's identity (`sandbox_identity`, which
    /// sandboxd labels every container with); a migration would have
    /// made a new one. Its guard trigger stays off for this one update.
    async fn new_identity(&self) {
        let mut admin = PgConnection::connect(&self.admin_url)
            .await
            .expect("connect to the test database as its superuser");
        sqlx::raw_sql(
            "SET session_replication_role = replica;
             UPDATE sandbox_identity SET state_id = gen_random_uuid(), created_at = now();",
        )
        .execute(&mut admin)
        .await
        .expect("give the test database an identity of its own");
        admin.close().await.expect("close the setup connection");
    }

    /// A server of its own (data on tmpfs, published on 127.0.0.1 only),
    /// started through testcontainers: waits until its real server listens
    /// on TCP (the image's temporary init server never does) and accepts a
    /// login, then creates the login role `sandboxd` (no superuser, no
    /// CREATEROLE, no CREATEDB) and the database `sandboxd` owned by it.
    pub async fn start_with(storage: StateStorage) -> Self {
        Self::start_with_settings(storage, &[]).await
    }

    /// [`StatePostgres::start_with`], the server started with `settings`
    /// too (`-c name=value` each).
    pub async fn start_with_settings(storage: StateStorage, settings: &[(&str, &str)]) -> Self {
        let (name, tag) = state_image();
        let mut cmd: Vec<String> = ["-c", "fsync=off", "-c", "max_connections=200"]
            .map(String::from)
            .into();
        for (setting, value) in settings {
            cmd.extend(["-c".to_owned(), format!("{setting}={value}")]);
        }
        let admin_password = random_suffix() + &random_suffix();
        let password = random_suffix() + &random_suffix();
        let container = GenericImage::new(name.clone(), tag.clone())
            .with_exposed_port(5432.tcp())
            .with_wait_for(WaitFor::message_on_stderr("listening on IPv4 address"))
            .with_env_var("POSTGRES_USER", "postgres")
            .with_env_var("POSTGRES_PASSWORD", &admin_password)
            .with_cmd(cmd)
            .with_label(STATE_LABEL, "true")
            .with_startup_timeout(Duration::from_secs(120))
            .with_host_config_modifier(move |hc| {
                hc.publish_all_ports = Some(false);
                hc.port_bindings = Some(std::collections::HashMap::from([(
                    "5432/tcp".to_owned(),
                    Some(vec![bollard::models::PortBinding {
                        host_ip: Some("127.0.0.1".into()),
                        host_port: Some(match storage {
                            StateStorage::Tmpfs => String::new(),
                            StateStorage::Restartable { port } => port.to_string(),
                        }),
                    }]),
                )]));
                if storage == StateStorage::Tmpfs {
                    hc.tmpfs = Some(std::collections::HashMap::from([(
                        "/var/lib/postgresql/data".to_owned(),
                        "rw,size=512m".to_owned(),
                    )]));
                }
            })
            .start()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "starting the state Postgres from {name}:{tag} failed: {e}; build the engine \
                     images first (deploy/images/build.sh, which scripts/test.sh runs)"
                )
            });
        let port = container
            .get_host_port_ipv4(5432.tcp())
            .await
            .expect("the state Postgres publishes 5432");
        let server = Server {
            container: container.id().to_owned(),
            port,
            admin_password,
            password,
        };
        server.create_role_and_database("sandboxd").await;
        Self {
            url: server.url("sandboxd"),
            admin_url: server.admin_url("sandboxd"),
            place: Place::Own(Box::new(container)),
        }
    }

    /// The id of the container of its server (the shared one's too).
    pub fn id(&self) -> &str {
        match &self.place {
            Place::Shared { .. } => &Server::shared().container,
            Place::Own(container) => container.id(),
        }
    }

    /// The id of the container of its own server, for a test that stops,
    /// pauses or restarts it; panics on a database of the shared server,
    /// whose server every other test is using.
    pub fn own_server(&self) -> &str {
        match &self.place {
            Place::Shared { .. } => panic!(
                "this test stops or restarts the state Postgres: start its TestEnv with \
                 TestEnv::new_with(StateStorage::Tmpfs), a server of its own, not TestEnv::new()"
            ),
            Place::Own(container) => container.id(),
        }
    }
}

impl Drop for StatePostgres {
    /// A database of the shared server is dropped (its sessions ended):
    /// the server lives for the whole test process. A server of its own
    /// goes with its container.
    fn drop(&mut self) {
        let Place::Shared { name } = &self.place else {
            return;
        };
        let admin = Server::shared().admin_url("postgres");
        let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
        // Drop runs inside the test's runtime, which cannot block on a
        // future: a thread of its own does it.
        let dropped = std::thread::spawn(move || {
            block_on(async {
                let mut conn = PgConnection::connect(&admin).await?;
                sqlx::query(&sql).execute(&mut conn).await?;
                conn.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop the test database {name}: {dropped:?}");
        }
    }
}

/// Runs `f` to completion on a runtime of its own (on a thread that has
/// none).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(f)
}

/// Where a state Postgres server answers, and its two passwords: plain
/// data, so that every test's runtime can connect to it.
#[derive(Debug)]
struct Server {
    container: String,
    port: u16,
    admin_password: String,
    password: String,
}

impl Server {
    /// The process's shared server, started by the first caller.
    fn shared() -> &'static Self {
        static SHARED: OnceLock<Server> = OnceLock::new();
        // The first test starts it while the others wait; on a thread of
        // its own, since a test's runtime cannot block on a future.
        SHARED.get_or_init(|| {
            std::thread::spawn(|| block_on(Self::start()))
                .join()
                .unwrap_or_else(|_| panic!("the shared state Postgres did not start (see above)"))
        })
    }

    /// Starts the server (data on tmpfs, published on 127.0.0.1 only),
    /// has it removed once this process has exited, and makes the role
    /// `sandboxd` and the migrated template database.
    async fn start() -> Self {
        let (name, tag) = state_image();
        let image = format!("{name}:{tag}");
        let admin_password = random_suffix() + &random_suffix();
        let password = random_suffix() + &random_suffix();
        let container = super::docker_ok(&[
            "run",
            "-d",
            "--label",
            &format!("{STATE_LABEL}=true"),
            "--tmpfs",
            // Room for every test running at once: each test's database is
            // dropped when it ends.
            "/var/lib/postgresql/data:rw,size=2g",
            "--publish",
            "127.0.0.1::5432",
            "--env",
            "POSTGRES_USER=postgres",
            "--env",
            &format!("POSTGRES_PASSWORD={admin_password}"),
            &image,
            "-c",
            "fsync=off",
            // Every test of the process at once, each with its controllers'
            // pools and a `sandboxd run` or two.
            "-c",
            "max_connections=600",
            // Each copy of the template goes through the WAL; keep it
            // small on tmpfs.
            "-c",
            "max_wal_size=256MB",
        ]);
        remove_when_this_process_exits(&container);
        let published = super::docker_ok(&["port", &container, "5432/tcp"]);
        let port = published
            .lines()
            .find_map(|l| l.strip_prefix("127.0.0.1:")?.parse().ok())
            .unwrap_or_else(|| panic!("the shared state Postgres publishes 5432: {published}"));
        let server = Self {
            container,
            port,
            admin_password,
            password,
        };
        server.create_role_and_database(TEMPLATE).await;
        let store = sandboxd::adapters::PgStore::connect(
            &server.url(TEMPLATE),
            2,
            sandboxd::engine::REGISTRY,
        )
        .await
        .expect("connect to the template database");
        store
            .migrate()
            .await
            .expect("migrate the template database");
        store.pool().close().await;
        // No session may be connected to a template while it is copied.
        let mut admin = PgConnection::connect(&server.admin_url("postgres"))
            .await
            .expect("connect to the shared state Postgres as its superuser");
        sqlx::query(&format!(
            "ALTER DATABASE {TEMPLATE} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"
        ))
        .execute(&mut admin)
        .await
        .expect("make the migrated database a template");
        admin.close().await.expect("close the setup connection");
        server
    }

    /// Waits until the real server accepts a login over TCP (the image's
    /// temporary init server listens on a socket only), then creates the
    /// login role `sandboxd` and the database `database` owned by it.
    async fn create_role_and_database(&self, database: &str) {
        // "listening" comes a moment before "ready to accept connections".
        let mut conn = eventually(
            "the state Postgres accepts logins",
            Duration::from_secs(120),
            || async {
                PgConnection::connect(&self.admin_url("postgres"))
                    .await
                    .ok()
            },
        )
        .await;
        // Utility statements take no parameters; the password is alphanumeric.
        for sql in [
            format!(
                "CREATE ROLE sandboxd LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '{}'",
                self.password
            ),
            format!("CREATE DATABASE {database} OWNER sandboxd"),
        ] {
            sqlx::query(&sql)
                .execute(&mut conn)
                .await
                .expect("create the controller's role and database");
        }
        conn.close().await.expect("close the setup connection");
    }

    fn url(&self, database: &str) -> String {
        format!(
            "postgres://sandboxd:{}@127.0.0.1:{}/{database}",
            self.password, self.port
        )
    }

    fn admin_url(&self, database: &str) -> String {
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/{database}",
            self.admin_password, self.port
        )
    }
}

/// Starts a watcher that removes `container` once this process has exited,
/// however it ends (a static is never dropped, and a killed test process
/// runs nothing). It ignores the terminal's signals, which reach it with
/// its parent's.
fn remove_when_this_process_exits(container: &str) {
    let watcher = std::process::Command::new("sh")
        .args([
            "-c",
            r#"trap '' INT TERM HUP
while kill -0 "$0" 2>/dev/null; do sleep 1; done
exec docker rm -f -v "$1" >/dev/null 2>&1"#,
        ])
        .arg(std::process::id().to_string())
        .arg(container)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if let Err(e) = watcher {
        super::docker(&["rm", "-f", "-v", container]);
        panic!("could not start the watcher that removes the shared state Postgres: {e}");
    }
}
