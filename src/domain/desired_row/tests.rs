//! The rules of a desired row, one table row per rule (every message a row
//! can earn, word for word, and what is kept of the row), plus a sweep of
//! hostile shapes that must never panic.

use super::*;
use chrono::TimeZone;

// ---------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------

/// The engines of these tests: postgres with two features, mongo with none.
/// Anything else (say "redis") is unknown to this binary.
fn engines(name: &str) -> Option<KnownEngine> {
    const POSTGRES: &[&str] = &["citext", "pg_trgm"];
    let (name, allowed_features) = match name {
        "postgres" => ("postgres", POSTGRES),
        "mongo" => ("mongo", &[] as &[&str]),
        _ => return None,
    };
    Some(KnownEngine {
        name: EngineName::of_engine(name),
        allowed_features,
    })
}

/// The incarnation of the table's rows.
const ROW: &str = "0a0b0c0d-0000-4000-8000-000000000002";

fn at(second: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 2, 0, 0, second).unwrap()
}

/// A list column holding `items`, shaped as the store reads a stored
/// one-dimensional array.
fn list(items: &[&str]) -> ListColumn {
    let len = items.len() as i32;
    let shaped = (len > 0).then_some(1);
    ListColumn {
        len: Ok(Some(len)),
        ndims: Ok(shaped),
        lower: Ok(shaped),
        json: Ok(Some(serde_json::to_string(items).unwrap())),
    }
}

/// A row that breaks no rule: postgres with pg_trgm and mongo, one
/// attached agent, updated at second 10, created at 1, used at 5.
fn good() -> DesiredRow {
    DesiredRow {
        owner: Ok(Some("agent-7".into())),
        services: list(&["postgres", "mongo"]),
        features: Ok(Some(r#"{"postgres":["pg_trgm"]}"#.into())),
        attach: list(&["agent-7"]),
        has_expiry: Ok(false),
        expires_at: Ok(None),
        updated_at_ok: Ok(true),
        updated_at: Ok(at(10)),
        generation: Ok(3),
        incarnation: Ok(Some(ROW.into())),
        last_used_at: Ok(Some(at(5))),
        idle_timeout_secs: Ok(None),
        persistent: Ok(Some(false)),
        idle_action: Ok(Some("release".into())),
        owner_container: Ok(None),
        created_at: Ok(Some(at(1))),
        isolation: Ok(None),
        seeds: Ok(Some("{}".into())),
        fork_of: Ok(None),
        fork_of_incarnation: Ok(None),
    }
}

#[test]
fn a_fork_names_its_source_by_id_and_incarnation_or_is_invalid() {
    const SOURCE: &str = "9b2f5a34-3c1e-4f7e-8d1a-2b9c8e7f6a50";
    let fork = |id: Option<&str>, inc: Option<&str>, persistent: bool| {
        read(DesiredRow {
            fork_of: Ok(id.map(Into::into)),
            fork_of_incarnation: Ok(inc.map(Into::into)),
            persistent: Ok(Some(persistent)),
            ..good()
        })
    };
    let d = fork(None, None, false);
    assert_eq!((d.fork_of, d.invalid), (None, None));
    let d = fork(Some("src-1"), Some(SOURCE), false);
    assert_eq!(d.invalid, None);
    let of = d.fork_of.unwrap();
    assert_eq!(
        (of.sandbox.as_str(), of.incarnation.to_string()),
        ("src-1", SOURCE.to_owned())
    );
    for (id, inc, persistent, says) in [
        (Some("src-1"), None, false, "set together"),
        (None, Some(SOURCE), false, "set together"),
        (Some("Not An Id"), Some(SOURCE), false, "not a sandbox id"),
        (Some("src-1"), Some("nope"), false, "not a uuid"),
        (
            Some("src-1"),
            Some(SOURCE),
            true,
            "neither persistent nor seeded",
        ),
    ] {
        let d = fork(id, inc, persistent);
        let invalid = d.invalid.unwrap_or_default();
        assert!(
            invalid.contains(says),
            "{id:?} {inc:?} {persistent}: {invalid}"
        );
    }
}

fn read(row: DesiredRow) -> DesiredSandbox {
    desired_from_row(&SandboxId::parse("sb").unwrap(), row, engines)
}

/// Every field of `d` but `invalid` as `field=value`, for the table to
/// pick from.
fn summary(d: &DesiredSandbox) -> Vec<String> {
    let time = |t: DateTime<Utc>| {
        if t == DateTime::UNIX_EPOCH {
            "epoch".to_owned()
        } else {
            format!("{}", (t - at(0)).num_seconds())
        }
    };
    let features: Vec<String> = d
        .features
        .iter()
        .map(|(e, set)| format!("{e}:{}", Vec::from_iter(set.iter().cloned()).join("+")))
        .collect();
    vec![
        format!("owner={:?}", d.owner),
        format!("services={:?}", d.services),
        format!("unknown={:?}", d.unknown_services),
        format!("features=[{}]", features.join(",")),
        format!("attach={:?}", d.attach),
        format!("expires={:?}", d.expires_at.map(time)),
        format!("generation={}", d.generation),
        format!(
            "incarnation={}",
            d.incarnation.as_ref().map_or("none", |i| i.as_str())
        ),
        format!("updated={}", time(d.updated_at)),
        format!("created={}", time(d.created_at)),
        format!("last_used={}", time(d.last_used_at)),
        format!("idle_timeout={:?}", d.idle_timeout),
        format!("persistent={}", d.persistent),
        format!("idle_action={}", d.idle_action),
        format!("owner_container={:?}", d.owner_container),
        format!("isolation={:?}", d.isolation.map(|i| i.as_str())),
        format!(
            "seeds=[{}]",
            d.seeds
                .iter()
                .map(|(e, h)| format!("{e}:{}", &h.as_str()[7..11]))
                .collect::<Vec<_>>()
                .join(",")
        ),
    ]
}

// ---------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------

/// A situation: its name, how it changes [`good`], the expected
/// `invalid` (`None`: the row is fine), and facts the read keeps (each a
/// `field=value` of [`summary`]).
type Case = (
    &'static str,
    fn(&mut DesiredRow),
    Option<&'static str>,
    &'static [&'static str],
);

fn table() -> Vec<Case> {
    vec![
        // --- a good row ----------------------------------------------------
        (
            "a row that breaks no rule is read as it is stored",
            |_| {},
            None,
            &[
                r#"owner="agent-7""#,
                "services=[postgres, mongo]",
                "unknown=[]",
                "features=[postgres:pg_trgm]",
                r#"attach=["agent-7"]"#,
                "expires=None",
                "generation=3",
                "incarnation=0a0b0c0d-0000-4000-8000-000000000002",
                "updated=10",
                "created=1",
                "last_used=5",
                "idle_timeout=None",
                "persistent=false",
                "idle_action=release",
                "owner_container=None",
                "isolation=None",
            ],
        ),
        (
            "a row with every optional value set keeps each of them",
            |r| {
                r.has_expiry = Ok(true);
                r.expires_at = Ok(Some(at(30)));
                r.idle_timeout_secs = Ok(Some(90.5));
                r.persistent = Ok(Some(true));
                r.idle_action = Ok(Some("pause".into()));
                r.owner_container = Ok(Some("agent-7".into()));
                r.isolation = Ok(Some("gvisor".into()));
            },
            None,
            &[
                "expires=Some(\"30\")",
                "idle_timeout=Some(90.5s)",
                "persistent=true",
                "idle_action=pause",
                r#"owner_container=Some("agent-7")"#,
                r#"isolation=Some("gvisor")"#,
            ],
        ),
        // --- owner ---------------------------------------------------------
        (
            "an owner of 200 characters is fine",
            |r| r.owner = Ok(Some("o".repeat(200))),
            None,
            &[],
        ),
        (
            "an owner longer than 200 characters fails the row and is cut to 200",
            |r| r.owner = Ok(Some(format!("{}xyz", "o".repeat(198)))),
            Some("owner must be text of at most 200 characters without control characters"),
            &[],
        ),
        (
            "an owner with control characters fails the row and loses them",
            |r| r.owner = Ok(Some("ag\u{1b}[31ment\n".into())),
            Some("owner must be text of at most 200 characters without control characters"),
            &[r#"owner="ag[31ment""#],
        ),
        (
            "a NULL owner reads as the empty owner",
            |r| r.owner = Ok(None),
            None,
            &[r#"owner="""#],
        ),
        (
            "an unreadable owner is named and reads as the empty owner",
            |r| r.owner = Err(Unreadable),
            Some("column owner cannot be read"),
            &[r#"owner="""#],
        ),
        // --- services ------------------------------------------------------
        (
            "an empty services list fails the row",
            |r| {
                r.services = list(&[]);
                r.features = Ok(Some("{}".into()));
            },
            Some("services is empty: name at least one engine"),
            &["services=[]"],
        ),
        (
            "a NULL services list fails the row",
            |r| {
                r.services = list(&[]);
                r.services.len = Ok(None);
                r.features = Ok(Some("{}".into()));
            },
            Some("services is NULL"),
            &["services=[]"],
        ),
        (
            "an engine named twice in services is kept once",
            |r| r.services = list(&["postgres", "mongo", "postgres"]),
            Some(r#"services name "postgres" twice"#),
            &["services=[postgres, mongo]"],
        ),
        (
            "an unknown engine named twice in services is kept once",
            |r| r.services = list(&["postgres", "redis", "redis"]),
            Some(r#"services name "redis" twice"#),
            &["services=[postgres]", r#"unknown=["redis"]"#],
        ),
        (
            "an engine this binary does not know is carried as unknown and is no problem here",
            |r| r.services = list(&["redis", "postgres"]),
            None,
            &["services=[postgres]", r#"unknown=["redis"]"#],
        ),
        (
            "more services than the store reads fail the row",
            |r| {
                r.services.len = Ok(Some(65));
                r.services.json = Ok(None);
            },
            Some(
                "services lists 65 entries: at most 64 are allowed; \
                 features name engine \"postgres\", which services do not request",
            ),
            &["services=[]"],
        ),
        (
            "a two-dimensional services array fails the row",
            |r| r.services.ndims = Ok(Some(2)),
            Some(
                "services is not a one-dimensional list starting at index 1; \
                 features name engine \"postgres\", which services do not request",
            ),
            &["services=[]"],
        ),
        (
            "a services array starting at index 0 fails the row",
            |r| r.services.lower = Ok(Some(0)),
            Some(
                "services is not a one-dimensional list starting at index 1; \
                 features name engine \"postgres\", which services do not request",
            ),
            &["services=[]"],
        ),
        (
            "a services array holding NULL fails the row",
            |r| r.services.json = Ok(Some(r#"["postgres",null]"#.into())),
            Some(
                "services contains NULL; \
                 features name engine \"postgres\", which services do not request",
            ),
            &["services=[]"],
        ),
        (
            "a services array that is not a list of text fails the row",
            |r| r.services.json = Ok(Some(r#"[["postgres"]]"#.into())),
            Some(
                "services cannot be read as a list of text; \
                 features name engine \"postgres\", which services do not request",
            ),
            &["services=[]"],
        ),
        (
            "services whose JSON is missing for a readable shape read as no services, \
             without a problem of their own",
            |r| {
                r.services.json = Ok(None);
                r.features = Ok(Some("{}".into()));
            },
            None,
            &["services=[]"],
        ),
        (
            "an unreadable services length is named by its column",
            |r| {
                r.services.len = Err(Unreadable);
                r.features = Ok(Some("{}".into()));
            },
            Some("column services_len cannot be read"),
            &["services=[]"],
        ),
        (
            "an unreadable services shape is named once, and the rest of the shape is not read",
            |r| {
                r.services.ndims = Err(Unreadable);
                r.services.lower = Err(Unreadable);
                r.features = Ok(Some("{}".into()));
            },
            Some("column services_ndims cannot be read"),
            &["services=[]"],
        ),
        (
            "an unreadable services lower bound is named by its column",
            |r| {
                r.services.lower = Err(Unreadable);
                r.features = Ok(Some("{}".into()));
            },
            Some("column services_lower cannot be read"),
            &["services=[]"],
        ),
        (
            "an unreadable services list is named by its column",
            |r| {
                r.services.json = Err(Unreadable);
                r.features = Ok(Some("{}".into()));
            },
            Some("column services cannot be read"),
            &["services=[]"],
        ),
        (
            "the shape of an empty services list is not read",
            |r| {
                r.services = list(&[]);
                r.services.ndims = Err(Unreadable);
                r.services.json = Err(Unreadable);
                r.features = Ok(Some("{}".into()));
            },
            Some("services is empty: name at least one engine"),
            &[],
        ),
        // --- seeds ---------------------------------------------------------
        (
            "a seed per requested engine is read",
            |r| {
                r.seeds = Ok(Some(format!(
                    r#"{{"postgres":"sha256:{}"}}"#,
                    "ab".repeat(32)
                )))
            },
            None,
            &["seeds=[postgres:abab]"],
        ),
        (
            "a seed that is not a hash fails the row and is dropped",
            |r| r.seeds = Ok(Some(r#"{"postgres":"schema.sql"}"#.into())),
            Some(
                r#"the seed of engine "postgres" is "schema.sql", not a hash (sha256: and 64 hex digits)"#,
            ),
            &["seeds=[]"],
        ),
        (
            "a seed for an engine services do not request fails the row",
            |r| r.seeds = Ok(Some(format!(r#"{{"redis":"sha256:{}"}}"#, "ab".repeat(32)))),
            Some(r#"seeds name engine "redis", which services do not request"#),
            &["seeds=[]"],
        ),
        (
            "seeds that are not an object of hashes fail the row",
            |r| r.seeds = Ok(Some(r#"["postgres"]"#.into())),
            Some(
                "seeds is not a JSON object mapping engine to a seed hash, \
                 e.g. {\"postgres\":\"sha256:…\"}",
            ),
            &["seeds=[]"],
        ),
        (
            "a persistent row with a seed fails: its data is kept",
            |r| {
                r.persistent = Ok(Some(true));
                r.seeds = Ok(Some(format!(
                    r#"{{"postgres":"sha256:{}"}}"#,
                    "ab".repeat(32)
                )));
            },
            Some(
                "seeds are for throwaway sandboxes, and this one is persistent: a persistent \
                 sandbox keeps its data, load it once from the agent's side",
            ),
            &["persistent=true"],
        ),
        // --- features ------------------------------------------------------
        (
            "features larger than the store reads fail the row",
            |r| r.features = Ok(None),
            Some("features is larger than 65536 bytes: name at most 16 features per engine"),
            &["features=[]"],
        ),
        (
            "features that are not a JSON object of lists fail the row",
            |r| r.features = Ok(Some(r#"{"postgres":"pg_trgm"}"#.into())),
            Some(
                "features is not a JSON object mapping engine to an array of feature names, \
                 e.g. {\"postgres\":[\"pg_trgm\"]}",
            ),
            &["features=[]"],
        ),
        (
            "features that are not JSON at all fail the row",
            |r| r.features = Ok(Some("{".into())),
            Some(
                "features is not a JSON object mapping engine to an array of feature names, \
                 e.g. {\"postgres\":[\"pg_trgm\"]}",
            ),
            &["features=[]"],
        ),
        (
            "unreadable features are named by their column",
            |r| r.features = Err(Unreadable),
            Some("column features cannot be read"),
            &["features=[]"],
        ),
        (
            "features for an engine services do not request fail the row and are dropped",
            |r| {
                r.services = list(&["mongo"]);
                r.features = Ok(Some(r#"{"postgres":["pg_trgm"],"mongo":[]}"#.into()));
            },
            Some(r#"features name engine "postgres", which services do not request"#),
            &["features=[mongo:]"],
        ),
        (
            "features for an unknown engine that services do not request fail the row",
            |r| r.features = Ok(Some(r#"{"redis":["search"]}"#.into())),
            Some(r#"features name engine "redis", which services do not request"#),
            &["features=[]"],
        ),
        (
            "features for an unknown engine that services request are dropped without a problem",
            |r| {
                r.services = list(&["postgres", "redis"]);
                r.features = Ok(Some(r#"{"redis":["search"]}"#.into()));
            },
            None,
            &["features=[]", r#"unknown=["redis"]"#],
        ),
        (
            "16 features for an engine are within the limit (here the repeats are the problem)",
            |r| {
                let list: Vec<&str> = ["citext", "pg_trgm"].repeat(8);
                r.features = Ok(Some(serde_json::json!({ "postgres": list }).to_string()));
            },
            Some("features for postgres name a feature twice"),
            &["features=[postgres:citext+pg_trgm]"],
        ),
        (
            "more than 16 features for an engine fail the row and are dropped",
            |r| {
                let list: Vec<&str> = vec!["pg_trgm"; 17];
                r.features = Ok(Some(serde_json::json!({ "postgres": list }).to_string()));
            },
            Some("features for postgres list 17 entries: at most 16 are allowed"),
            &["features=[]"],
        ),
        (
            "a feature named twice fails the row and is kept once",
            |r| r.features = Ok(Some(r#"{"postgres":["pg_trgm","pg_trgm"]}"#.into())),
            Some("features for postgres name a feature twice"),
            &["features=[postgres:pg_trgm]"],
        ),
        (
            "a feature the engine does not allow fails the row, naming the allowed ones",
            |r| r.features = Ok(Some(r#"{"postgres":["pg_trgm","plpython3u"]}"#.into())),
            Some(
                "feature \"plpython3u\" is not allowed for engine postgres: \
                 allowed features are citext, pg_trgm",
            ),
            &["features=[postgres:pg_trgm+plpython3u]"],
        ),
        (
            "a feature for an engine without features says none are allowed",
            |r| r.features = Ok(Some(r#"{"mongo":["sharding"]}"#.into())),
            Some(
                "feature \"sharding\" is not allowed for engine mongo: \
                 allowed features are (none)",
            ),
            &["features=[mongo:sharding]"],
        ),
        (
            "an empty feature list for a requested engine is kept",
            |r| r.features = Ok(Some(r#"{"mongo":[]}"#.into())),
            None,
            &["features=[mongo:]"],
        ),
        // --- attach --------------------------------------------------------
        (
            "an attach name that is not a Docker name fails the row and is dropped",
            |r| r.attach = list(&["agent-7", "-bad", "agent-8"]),
            Some(
                "attach holds \"-bad\", which is not a Docker container name (1 to 128 \
                 characters from a-z, A-Z, 0-9, '_', '.' and '-', starting with a letter \
                 or digit)",
            ),
            &[r#"attach=["agent-7", "agent-8"]"#],
        ),
        (
            "an attach name given twice fails the row and is kept once, in order",
            |r| r.attach = list(&["b", "a", "b"]),
            Some("attach names a container twice"),
            &[r#"attach=["b", "a"]"#],
        ),
        (
            "more attached containers than the store reads fail the row",
            |r| {
                r.attach.len = Ok(Some(17));
                r.attach.json = Ok(None);
            },
            Some("attach lists 17 entries: at most 16 are allowed"),
            &["attach=[]"],
        ),
        (
            "a NULL attach list fails the row",
            |r| r.attach.len = Ok(None),
            Some("attach is NULL"),
            &["attach=[]"],
        ),
        (
            "an attach array starting at index 2 fails the row",
            |r| r.attach.lower = Ok(Some(2)),
            Some("attach is not a one-dimensional list starting at index 1"),
            &["attach=[]"],
        ),
        (
            "an attach array holding NULL fails the row",
            |r| r.attach.json = Ok(Some("[null]".into())),
            Some("attach contains NULL"),
            &["attach=[]"],
        ),
        (
            "an attach array that is not a list of text fails the row",
            |r| r.attach.json = Ok(Some("[7]".into())),
            Some("attach cannot be read as a list of text"),
            &["attach=[]"],
        ),
        (
            "an empty attach list is fine",
            |r| r.attach = list(&[]),
            None,
            &["attach=[]"],
        ),
        // --- times ---------------------------------------------------------
        (
            "an expiry that is not a finite time fails the row and the sandbox does not expire",
            |r| {
                r.has_expiry = Ok(true);
                r.expires_at = Ok(None);
            },
            Some("expires_at is not a finite time before the year 10000 (e.g. 'infinity')"),
            &["expires=None"],
        ),
        (
            "an unreadable expiry is named by its column",
            |r| {
                r.has_expiry = Ok(true);
                r.expires_at = Err(Unreadable);
            },
            Some(
                "column expires_at cannot be read; \
                 expires_at is not a finite time before the year 10000 (e.g. 'infinity')",
            ),
            &["expires=None"],
        ),
        (
            "an unreadable has_expiry is named and counts as no expiry",
            |r| r.has_expiry = Err(Unreadable),
            Some("column has_expiry cannot be read"),
            &["expires=None"],
        ),
        (
            "an updated_at that is not a finite time fails the row",
            |r| r.updated_at_ok = Ok(false),
            Some("updated_at is not a finite time before the year 10000"),
            &["updated=10"],
        ),
        (
            "an unreadable updated_at_ok counts as an updated_at that is not finite",
            |r| r.updated_at_ok = Err(Unreadable),
            Some(
                "column updated_at_ok cannot be read; \
                 updated_at is not a finite time before the year 10000",
            ),
            &[],
        ),
        (
            "an unreadable updated_at reads as the epoch",
            |r| r.updated_at = Err(Unreadable),
            Some("column updated_at cannot be read"),
            &["updated=epoch"],
        ),
        (
            "a missing last use counts as the last change",
            |r| r.last_used_at = Ok(None),
            None,
            &["last_used=10"],
        ),
        (
            "an unreadable last use is named and counts as the last change",
            |r| r.last_used_at = Err(Unreadable),
            Some("column last_used_at cannot be read"),
            &["last_used=10"],
        ),
        (
            "a missing created_at counts as the last change",
            |r| r.created_at = Ok(None),
            None,
            &["created=10"],
        ),
        (
            "an unreadable created_at counts as the last change and is no problem",
            |r| r.created_at = Err(Unreadable),
            None,
            &["created=10"],
        ),
        // --- generation and incarnation -------------------------------------
        (
            "an unreadable generation is named and reads as 0",
            |r| r.generation = Err(Unreadable),
            Some("column generation cannot be read"),
            &["generation=0"],
        ),
        (
            "an incarnation that is not a uuid fails the row",
            |r| r.incarnation = Ok(Some("not-a-uuid".into())),
            Some("incarnation is not a uuid"),
            &["incarnation=none"],
        ),
        (
            "a NULL incarnation fails the row",
            |r| r.incarnation = Ok(None),
            Some("incarnation is not a uuid"),
            &["incarnation=none"],
        ),
        (
            "an unreadable incarnation is named and is not a uuid",
            |r| r.incarnation = Err(Unreadable),
            Some("column incarnation cannot be read; incarnation is not a uuid"),
            &["incarnation=none"],
        ),
        // --- idle timeout ---------------------------------------------------
        (
            "an idle timeout of 0 means never",
            |r| r.idle_timeout_secs = Ok(Some(0.0)),
            None,
            &["idle_timeout=Some(0ns)"],
        ),
        (
            "an idle timeout of a year is the longest allowed",
            |r| r.idle_timeout_secs = Ok(Some(31_536_000.0)),
            None,
            &["idle_timeout=Some(31536000s)"],
        ),
        (
            "an idle timeout longer than a year fails the row and the default applies",
            |r| r.idle_timeout_secs = Ok(Some(31_536_000.5)),
            Some("idle_timeout must be between 0 (never) and 31536000 seconds"),
            &["idle_timeout=None"],
        ),
        (
            "a negative idle timeout fails the row",
            |r| r.idle_timeout_secs = Ok(Some(-1.0)),
            Some("idle_timeout must be between 0 (never) and 31536000 seconds"),
            &["idle_timeout=None"],
        ),
        (
            "an idle timeout that is not a number fails the row",
            |r| r.idle_timeout_secs = Ok(Some(f64::NAN)),
            Some("idle_timeout must be between 0 (never) and 31536000 seconds"),
            &["idle_timeout=None"],
        ),
        (
            "an infinite idle timeout fails the row",
            |r| r.idle_timeout_secs = Ok(Some(f64::INFINITY)),
            Some("idle_timeout must be between 0 (never) and 31536000 seconds"),
            &["idle_timeout=None"],
        ),
        (
            "an unreadable idle timeout is named and the default applies",
            |r| r.idle_timeout_secs = Err(Unreadable),
            Some("column idle_timeout_secs cannot be read"),
            &["idle_timeout=None"],
        ),
        // --- persistent, idle action, owner container -----------------------
        (
            "a NULL persistent fails the row and reads as false",
            |r| r.persistent = Ok(None),
            Some("persistent is NULL: set it to true or false"),
            &["persistent=false"],
        ),
        (
            "an unreadable persistent is named and also NULL",
            |r| r.persistent = Err(Unreadable),
            Some("column persistent cannot be read; persistent is NULL: set it to true or false"),
            &["persistent=false"],
        ),
        (
            "an unknown idle action fails the row and releases",
            |r| r.idle_action = Ok(Some("hibernate\n".into())),
            Some(r#"idle_action is "hibernate\n": use 'release' or 'pause'"#),
            &["idle_action=release"],
        ),
        (
            "a NULL idle action fails the row and releases",
            |r| r.idle_action = Ok(None),
            Some("idle_action is NULL: use 'release' or 'pause'"),
            &["idle_action=release"],
        ),
        (
            "an unreadable idle action is named and also NULL",
            |r| r.idle_action = Err(Unreadable),
            Some(
                "column idle_action cannot be read; idle_action is NULL: use 'release' or 'pause'",
            ),
            &["idle_action=release"],
        ),
        (
            "an owner container that is not a Docker name fails the row and is dropped",
            |r| r.owner_container = Ok(Some("agent/7".into())),
            Some(r#"owner_container holds "agent/7", which is not a Docker container name"#),
            &["owner_container=None"],
        ),
        (
            "an unreadable owner container is named and there is none",
            |r| r.owner_container = Err(Unreadable),
            Some("column owner_container cannot be read"),
            &["owner_container=None"],
        ),
        // --- isolation -----------------------------------------------------
        (
            "an isolation of 'container' is kept",
            |r| r.isolation = Ok(Some("container".into())),
            None,
            &[r#"isolation=Some("container")"#],
        ),
        (
            "an isolation this binary does not know fails the row (never run under less)",
            |r| r.isolation = Ok(Some("microvm".into())),
            Some(
                r#"isolation is "microvm": use 'container', 'gvisor' or NULL (the controller's --runtime)"#,
            ),
            &["isolation=None"],
        ),
        (
            "an unreadable isolation is named and there is none",
            |r| r.isolation = Err(Unreadable),
            Some("column isolation cannot be read"),
            &["isolation=None"],
        ),
        // --- several problems -----------------------------------------------
        (
            "every problem of a row is told, in column order",
            |r| {
                r.owner = Ok(Some("a\u{7}".into()));
                r.services.ndims = Ok(Some(2));
                r.features = Ok(Some("[]".into()));
                r.attach.lower = Ok(Some(0));
                r.updated_at_ok = Ok(false);
                r.persistent = Ok(None);
            },
            Some(
                "owner must be text of at most 200 characters without control characters; \
                 services is not a one-dimensional list starting at index 1; \
                 features is not a JSON object mapping engine to an array of feature names, \
                 e.g. {\"postgres\":[\"pg_trgm\"]}; \
                 attach is not a one-dimensional list starting at index 1; \
                 updated_at is not a finite time before the year 10000; \
                 persistent is NULL: set it to true or false",
            ),
            &[r#"owner="a""#],
        ),
    ]
}

#[test]
fn the_row_table_holds() {
    let mut failures = Vec::new();
    for (name, edit, invalid, facts) in table() {
        let mut row = good();
        edit(&mut row);
        let d = read(row);
        let summary = summary(&d);
        let missing: Vec<&&str> = facts
            .iter()
            .filter(|f| !summary.iter().any(|s| s == *f))
            .collect();
        if d.invalid.as_deref() != invalid || !missing.is_empty() {
            failures.push(format!(
                "{name}\n  expected invalid: {invalid:?}\n  got:              {:?}\n  \
                 missing facts: {missing:?}\n  read: {summary:#?}",
                d.invalid
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn row_table_names_are_unique() {
    let names: BTreeSet<&str> = table().iter().map(|case| case.0).collect();
    assert_eq!(names.len(), table().len());
}

// ---------------------------------------------------------------------------
// Focused tests
// ---------------------------------------------------------------------------

#[test]
fn an_owner_over_the_limit_is_cut_to_the_limit() {
    let mut row = good();
    row.owner = Ok(Some("o".repeat(201)));
    assert_eq!(read(row).owner, "o".repeat(200));
}

#[test]
fn the_id_is_the_one_the_row_was_stored_under() {
    let id = SandboxId::parse("agent-7-sb").unwrap();
    assert_eq!(desired_from_row(&id, good(), engines).id, id);
}

#[test]
fn an_engine_is_resolved_once_per_name_in_services_and_features() {
    let asked = std::cell::RefCell::new(Vec::new());
    let counting = |name: &str| {
        asked.borrow_mut().push(name.to_owned());
        engines(name)
    };
    desired_from_row(&SandboxId::parse("sb").unwrap(), good(), counting);
    assert_eq!(*asked.borrow(), ["postgres", "mongo", "postgres"]);
}

#[test]
fn docker_names_follow_dockers_rule() {
    for ok in ["a", "agent-7", "Agent_8.x", "0", &"a".repeat(128)] {
        assert!(docker_name(ok), "{ok}");
    }
    for bad in [
        "",
        "-a",
        ".a",
        "_a",
        "a/b",
        "a b",
        "a\u{1b}[31m",
        "é",
        &"a".repeat(129),
    ] {
        assert!(!docker_name(bad), "{bad:?}");
    }
}

#[test]
fn values_shown_in_messages_are_cut_and_carry_no_control_characters() {
    assert_eq!(shown("agent"), "\"agent\"");
    assert_eq!(shown("a\u{1b}[31m\n"), "\"a\\u{1b}[31m\\n\"");
    assert_eq!(shown(&"x".repeat(200)).len(), 82);
}

/// Every column takes each of a handful of hostile values, in a
/// deterministic mix of many rows: reading never panics, and what it
/// keeps always obeys the rules (whatever `invalid` says).
#[test]
fn no_row_shape_panics_and_what_is_kept_obeys_the_rules() {
    let texts: Vec<Cell<Option<String>>> = vec![
        Err(Unreadable),
        Ok(None),
        Ok(Some(String::new())),
        Ok(Some("\u{0}\u{1b}\n\u{7f}".into())),
        Ok(Some("é".repeat(300))),
        Ok(Some("-".into())),
        Ok(Some("agent-7".into())),
        Ok(Some("pause".into())),
        Ok(Some(ROW.into())),
        Ok(Some(
            r#"{"postgres":["pg_trgm","x"],"mongo":[],"redis":["a"]}"#.into(),
        )),
        Ok(Some(r#"{"postgres":null}"#.into())),
        Ok(Some(r#"["postgres","postgres",null,"redis"]"#.into())),
        Ok(Some(r#"["a","a","-b"]"#.into())),
        Ok(Some("[[[]]]".into())),
        Ok(Some("{".into())),
    ];
    let ints: Vec<Cell<Option<i32>>> = vec![
        Err(Unreadable),
        Ok(None),
        Ok(Some(i32::MIN)),
        Ok(Some(-1)),
        Ok(Some(0)),
        Ok(Some(1)),
        Ok(Some(2)),
        Ok(Some(64)),
        Ok(Some(65)),
        Ok(Some(i32::MAX)),
    ];
    let times: Vec<Cell<Option<DateTime<Utc>>>> = vec![
        Err(Unreadable),
        Ok(None),
        Ok(Some(DateTime::<Utc>::MIN_UTC)),
        Ok(Some(DateTime::<Utc>::MAX_UTC)),
        Ok(Some(at(7))),
    ];
    let floats: Vec<Cell<Option<f64>>> = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        f64::MIN_POSITIVE,
        1e300,
        31_536_000.0,
        -1e-300,
    ]
    .into_iter()
    .map(|f| Ok(Some(f)))
    .chain([Err(Unreadable), Ok(None)])
    .collect();
    let bools: Vec<Cell<Option<bool>>> =
        vec![Err(Unreadable), Ok(None), Ok(Some(true)), Ok(Some(false))];

    // A small linear congruential generator: the same rows every run.
    let mut state: u64 = 0x5eed;
    let mut pick = |n: usize| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as usize % n
    };
    for _ in 0..20_000 {
        // Half the lists are shaped right, so their text is read too.
        let mut list_column = || {
            let mut column = ListColumn {
                len: ints[pick(ints.len())],
                ndims: ints[pick(ints.len())],
                lower: ints[pick(ints.len())],
                json: texts[pick(texts.len())].clone(),
            };
            if pick(2) == 0 {
                column.len = Ok(Some(1 + pick(4) as i32));
                (column.ndims, column.lower) = (Ok(Some(1)), Ok(Some(1)));
            }
            column
        };
        let services = list_column();
        let attach = list_column();
        let bool_cell = |b: Cell<Option<bool>>| b.map(|b| b.unwrap_or(false));
        let row = DesiredRow {
            owner: texts[pick(texts.len())].clone(),
            services,
            features: texts[pick(texts.len())].clone(),
            attach,
            has_expiry: bool_cell(bools[pick(bools.len())]),
            expires_at: times[pick(times.len())],
            updated_at_ok: bool_cell(bools[pick(bools.len())]),
            updated_at: times[pick(times.len())].map(|t| t.unwrap_or(at(9))),
            generation: ints[pick(ints.len())].map(|i| i64::from(i.unwrap_or(0))),
            incarnation: texts[pick(texts.len())].clone(),
            last_used_at: times[pick(times.len())],
            idle_timeout_secs: floats[pick(floats.len())],
            persistent: bools[pick(bools.len())],
            idle_action: texts[pick(texts.len())].clone(),
            owner_container: texts[pick(texts.len())].clone(),
            created_at: times[pick(times.len())],
            isolation: texts[pick(texts.len())].clone(),
            seeds: texts[pick(texts.len())].clone(),
            fork_of: texts[pick(texts.len())].clone(),
            fork_of_incarnation: texts[pick(texts.len())].clone(),
        };
        let shape = format!("{row:?}");
        let d = read(row);
        let ok = |what: &str, holds: bool| assert!(holds, "{what}: {shape}");
        ok(
            "owner",
            d.owner.chars().count() <= MAX_OWNER_CHARS && !d.owner.chars().any(char::is_control),
        );
        ok("services", d.services.len() <= MAX_SERVICES as usize);
        ok(
            "services once",
            d.services.iter().collect::<BTreeSet<_>>().len() == d.services.len(),
        );
        ok(
            "features",
            d.features
                .iter()
                .all(|(e, set)| d.services.contains(e) && set.len() <= MAX_FEATURES),
        );
        ok(
            "attach",
            d.attach.len() <= MAX_ATTACH as usize
                && d.attach.iter().all(|n| docker_name(n))
                && d.attach.iter().collect::<BTreeSet<_>>().len() == d.attach.len(),
        );
        ok(
            "owner container",
            d.owner_container.as_deref().is_none_or(docker_name),
        );
        ok(
            "idle timeout",
            d.idle_timeout
                .is_none_or(|t| t.as_secs_f64() <= MAX_IDLE_TIMEOUT_SECS),
        );
        ok(
            "a row without an incarnation is invalid",
            d.incarnation.is_some() || d.invalid.is_some(),
        );
    }
}
