//! MongoDB: no features. The upstream image does not read its secrets from
//! standard input, so sandboxd replaces its entrypoint with [`SHIM`], which
//! does: it creates the agent's user (`readWrite` and `dbAdmin` on its own
//! database, nothing else; no root user exists) on a loopback-only server
//! without auth, then runs the real server with `--auth`. Readiness is
//! checked with `mongosh` inside the container, which reads the password
//! from the tmpfs file the shim wrote, never from its arguments.
//!
//! No MongoDB server can be installed on the development machine, so this
//! engine is exercised only where a `mongo` image exists.

use super::{script, Credentials, Engine, EngineError, Target};
use crate::domain::checkpoint::CheckpointName;
use crate::domain::id::EngineName;
use crate::domain::secret::Secret;
use async_trait::async_trait;
use std::collections::BTreeSet;
use std::time::Duration;

/// The MongoDB engine.
#[derive(Debug, Clone, Copy)]
pub struct Mongo;

const NAME: EngineName = EngineName::of_engine("mongo");
/// Where the agent's user is defined (as the Python provisioner's
/// `MONGO_AUTH_DB`); its roles cover only its own database.
const AUTH_DB: &str = "admin";

/// The entrypoint of a Mongo sandbox (bash, as `bash -c SHIM sandboxd-mongo
/// ARGS...`): secrets from standard input, the agent's user, then `mongod
/// --auth` with ARGS.
pub const SHIM: &str = r#"set -Eeuo pipefail
umask 077
password=
while IFS= read -r line || [[ -n $line ]]; do
	case $line in
	SANDBOXD_PASSWORD=*) password=${line#SANDBOXD_PASSWORD=} ;;
	'') ;;
	*) echo "sandboxd-mongo: unknown key ${line%%=*} on standard input (allowed: SANDBOXD_PASSWORD)" >&2; exit 64 ;;
	esac
done
if ! [[ $password =~ ^[A-Za-z0-9]{16,128}$ ]]; then
	echo "sandboxd-mongo: no valid SANDBOXD_PASSWORD on standard input: sandbox containers read their secrets from stdin" >&2
	exit 64
fi
printf '%s' "$password" >/run/sandboxd/password
unset password
mongod --dbpath /data/db --bind_ip 127.0.0.1 --port 27018 --fork --logpath /tmp/init.log >/dev/null
mongosh --quiet --port 27018 --eval '
	const pwd = fs.readFileSync("/run/sandboxd/password", "utf8");
	const name = process.env.SANDBOXD_DATABASE;
	db.getSiblingDB("admin").createUser({user: process.env.SANDBOXD_USER, pwd,
		roles: [{role: "readWrite", db: name}, {role: "dbAdmin", db: name}]});'
mongod --dbpath /data/db --port 27018 --shutdown >/dev/null
exec mongod --auth --bind_ip_all --dbpath /data/db "$@"
"#;

/// Checkpoints are `mongodump` archives in the data directory, restored
/// with `mongorestore` after the database is dropped; the baseline is the
/// dropped (empty) database. See the script.
const CHECKPOINTS: &str = include_str!("checkpoint/mongo.sh");

/// The probe: the agent's login, its password read inside the container.
const PING: &str = r#"mongosh --quiet --host 127.0.0.1 --eval '
	const name = process.env.SANDBOXD_DATABASE;
	db.getSiblingDB("admin").auth(process.env.SANDBOXD_USER, fs.readFileSync("/run/sandboxd/password", "utf8"));
	print(db.getSiblingDB(name).runCommand({ping: 1}).ok)'"#;

/// The client connections besides this one: the agent's login (every
/// client of a sandbox logs in as its one user), then its own operations
/// with idle connections (`$currentOp` with `allUsers: false` needs no
/// privilege beyond the login), counted by client address, this shell's
/// own left out. Not run on the development machine (no Mongo image).
const CLIENTS: &str = r#"mongosh --quiet --host 127.0.0.1 --eval '
	db.getSiblingDB("admin").auth(process.env.SANDBOXD_USER, fs.readFileSync("/run/sandboxd/password", "utf8"));
	const me = db.getSiblingDB("admin").runCommand({whatsmyuri: 1}).you;
	const ops = db.getSiblingDB("admin").aggregate([{$currentOp: {allUsers: false, idleConnections: true}}]).toArray();
	print(new Set(ops.filter(o => o.client && o.client !== me).map(o => o.client)).size)'"#;

/// The count [`CLIENTS`] printed last.
fn clients_printed(output: &str) -> Option<u32> {
    output.lines().rev().find_map(|l| l.trim().parse().ok())
}

#[async_trait]
impl Engine for Mongo {
    fn name(&self) -> EngineName {
        NAME
    }
    fn env_group(&self) -> &'static str {
        "MONGO"
    }
    fn allowed_features(&self) -> &'static [&'static str] {
        &[]
    }
    fn default_image(&self) -> &'static str {
        "mongo:8"
    }
    fn default_features_image(&self) -> &'static str {
        "mongo:8"
    }
    fn port(&self) -> u16 {
        27017
    }
    fn data_path(&self) -> &'static str {
        "/data/db"
    }
    fn runtime_dirs(&self) -> &'static [&'static str] {
        &["/run/sandboxd", "/data/configdb"]
    }
    fn readiness_deadline(&self) -> Duration {
        Duration::from_secs(60)
    }
    fn credentials(&self, password: Secret) -> Credentials {
        Credentials {
            user: "sandbox".into(),
            password,
            database: "sandbox".into(),
        }
    }
    fn container_env(
        &self,
        c: &Credentials,
        _features: &BTreeSet<String>,
        _persistent: bool,
    ) -> Vec<String> {
        vec![
            "SANDBOXD_SANDBOX=1".to_owned(),
            format!("SANDBOXD_USER={}", c.user),
            format!("SANDBOXD_DATABASE={}", c.database),
            "HOME=/tmp".to_owned(),
        ]
    }
    fn container_args(&self, _features: &BTreeSet<String>, _persistent: bool) -> Vec<String> {
        Vec::new()
    }
    fn image_label(&self) -> Option<&'static str> {
        None
    }
    fn entrypoint(&self) -> Option<Vec<String>> {
        Some(vec![
            "bash".to_owned(),
            "-c".to_owned(),
            SHIM.to_owned(),
            "sandboxd-mongo".to_owned(),
        ])
    }
    fn url(&self, host: &str, port: u16, c: &Credentials) -> String {
        format!(
            "mongodb://{}:{}@{host}:{port}/{}?authSource={AUTH_DB}",
            c.user,
            c.password.expose(),
            c.database,
        )
    }
    fn env_suffixes(&self, host: &str, port: u16, c: &Credentials) -> Vec<(&'static str, String)> {
        vec![
            ("HOST", host.to_owned()),
            ("PORT", port.to_string()),
            ("USER", c.user.clone()),
            ("PASSWORD", c.password.expose().to_owned()),
            ("AUTH_DB", AUTH_DB.to_owned()),
            ("DB", c.database.clone()),
            ("URL", self.url(host, port, c)),
        ]
    }

    async fn probe(&self, target: &Target<'_>) -> Result<(), EngineError> {
        let out = target
            .exec
            .exec(&["bash", "-c", PING], Vec::new())
            .await
            .map_err(|reason| EngineError::NotReady {
                engine: NAME,
                reason,
            })?;
        if out.exit_code == 0 && out.output.trim().ends_with('1') {
            Ok(())
        } else {
            Err(EngineError::NotReady {
                engine: NAME,
                reason: format!("mongosh ping exited {}", out.exit_code),
            })
        }
    }

    async fn verify_features(
        &self,
        _target: &Target<'_>,
        _features: &BTreeSet<String>,
    ) -> Result<Vec<String>, EngineError> {
        Ok(Vec::new())
    }

    async fn clients(&self, target: &Target<'_>) -> Result<Option<u32>, EngineError> {
        let failed = |reason: String| EngineError::Client {
            engine: NAME,
            reason: format!("counting client connections failed: {reason}"),
        };
        let out = target
            .exec
            .exec(&["bash", "-c", CLIENTS], Vec::new())
            .await
            .map_err(failed)?;
        if out.exit_code != 0 {
            return Err(failed(format!("mongosh exited {}", out.exit_code)));
        }
        clients_printed(&out.output)
            .map(Some)
            .ok_or_else(|| failed("mongosh printed no count".into()))
    }
    fn checkpoint_size_command(&self, c: &Credentials) -> Option<Vec<String>> {
        Some(script(
            "bash",
            CHECKPOINTS,
            &["size", &c.database, &c.user, "-"],
        ))
    }
    fn checkpoint_command(&self, c: &Credentials, name: &CheckpointName) -> Option<Vec<String>> {
        Some(script(
            "bash",
            CHECKPOINTS,
            &["checkpoint", &c.database, &c.user, name.as_str()],
        ))
    }
    fn reset_command(&self, c: &Credentials, name: &CheckpointName) -> Option<Vec<String>> {
        Some(script(
            "bash",
            CHECKPOINTS,
            &["reset", &c.database, &c.user, name.as_str()],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_count_is_the_last_number_mongosh_printed() {
        assert_eq!(clients_printed("2\n"), Some(2));
        assert_eq!(clients_printed("a warning\n0\n"), Some(0));
        assert_eq!(clients_printed("no count\n"), None);
    }

    #[test]
    fn the_shim_and_the_probe_never_put_a_secret_in_an_argument() {
        let c = Mongo.credentials(Secret::new("s3cretPassw0rd1234"));
        let env = Mongo.container_env(&c, &BTreeSet::new(), false).join(" ");
        let entrypoint = Mongo.entrypoint().unwrap().join(" ");
        for text in [env.as_str(), entrypoint.as_str(), PING] {
            assert!(!text.contains("s3cret"), "{text}");
        }
        assert_eq!(
            Mongo.secrets(&c).expose(),
            "SANDBOXD_PASSWORD=s3cretPassw0rd1234\n"
        );
        // The agent gets its own database's roles, never root.
        assert!(SHIM.contains(r#"{role: "readWrite", db: name}, {role: "dbAdmin", db: name}"#));
        assert!(!SHIM.contains("root"));
    }

    #[test]
    fn the_checkpoint_script_is_valid_bash() {
        let out = std::process::Command::new("bash")
            .args(["-n", "-c", CHECKPOINTS])
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn the_shim_is_valid_bash() {
        let out = std::process::Command::new("bash")
            .args(["-n", "-c", SHIM])
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
