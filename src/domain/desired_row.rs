//! Reading a desired row: from the values of its columns, as the store read
//! them, to a [`DesiredSandbox`].
//!
//! The database checks every row it is given, but a row can still get past
//! those checks (a superuser with triggers disabled, a row written for a
//! newer sandboxd). So the rules are enforced again here, and a row that
//! breaks one is never refused or a cause of a panic: it comes back with
//! [`DesiredSandbox::invalid`] saying what is wrong (every problem, in
//! column order, joined with "; "), its usable parts kept so its
//! containers can still be found and left untouched.
//!
//! The store selects each column in a form that always decodes (arrays as
//! JSON text with their shape alongside, times only when finite and in
//! range, long text cut one past its limit); a value it still cannot
//! decode arrives as [`Unreadable`]. Which engines exist is not known
//! here: the caller passes a resolver from an engine's name in `services`
//! to what the rules need of it ([`KnownEngine`]).

use super::fork::ForkOf;
use super::id::{EngineName, Incarnation, SandboxId};
use super::isolation::Isolation;
use super::sandbox::{DesiredSandbox, IdleAction};
use super::seed::SeedHash;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Most characters of `owner` (as the database's check).
pub(crate) const MAX_OWNER_CHARS: usize = 200;
/// Most entries of `services` read (no registry has this many engines).
pub(crate) const MAX_SERVICES: i32 = 64;
/// Most features per engine (as the database's check).
pub(crate) const MAX_FEATURES: usize = 16;
/// Most bytes of stored `features` read.
pub(crate) const MAX_FEATURES_BYTES: i32 = 65_536;
/// Most containers in `attach` (as the database's check).
pub(crate) const MAX_ATTACH: i32 = 16;
/// The longest idle timeout a row may set (a year, as the database checks).
pub(crate) const MAX_IDLE_TIMEOUT_SECS: f64 = 31_536_000.0;

/// A column the store could not decode; reported as "column NAME cannot be
/// read" when the rules look at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unreadable;

/// One column's value as read, or [`Unreadable`].
pub(crate) type Cell<T> = Result<T, Unreadable>;

/// A text array column, read as four columns `<name>_len`
/// (`cardinality`), `<name>_ndims`, `<name>_lower` and `<name>` (the
/// array as JSON text, `NULL` when it has more entries than the store's
/// limit, so an oversized array is never decoded).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ListColumn {
    pub(crate) len: Cell<Option<i32>>,
    pub(crate) ndims: Cell<Option<i32>>,
    pub(crate) lower: Cell<Option<i32>>,
    pub(crate) json: Cell<Option<String>>,
}

/// The columns of one `sandbox_desired` row as the store read them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DesiredRow {
    /// Cut to one more character than [`MAX_OWNER_CHARS`].
    pub(crate) owner: Cell<Option<String>>,
    pub(crate) services: ListColumn,
    /// The JSON text, `None` when larger than [`MAX_FEATURES_BYTES`].
    pub(crate) features: Cell<Option<String>>,
    pub(crate) attach: ListColumn,
    /// Whether `expires_at` is set at all (finite or not).
    pub(crate) has_expiry: Cell<bool>,
    /// `None` when unset or not a finite time before the year 10000.
    pub(crate) expires_at: Cell<Option<DateTime<Utc>>>,
    /// Whether `updated_at` is a finite time before the year 10000.
    pub(crate) updated_at_ok: Cell<bool>,
    /// The time when it is one, else the time of the read.
    pub(crate) updated_at: Cell<DateTime<Utc>>,
    pub(crate) generation: Cell<i64>,
    /// The uuid as text.
    pub(crate) incarnation: Cell<Option<String>>,
    /// `None` when unset or not a finite time before the year 10000.
    pub(crate) last_used_at: Cell<Option<DateTime<Utc>>>,
    /// `idle_timeout` in seconds.
    pub(crate) idle_timeout_secs: Cell<Option<f64>>,
    pub(crate) persistent: Cell<Option<bool>>,
    /// Cut to 16 characters.
    pub(crate) idle_action: Cell<Option<String>>,
    /// Cut to one more character than a Docker name may have.
    pub(crate) owner_container: Cell<Option<String>>,
    /// `None` when unset or not a finite time before the year 10000.
    pub(crate) created_at: Cell<Option<DateTime<Utc>>>,
    /// Cut to 16 characters.
    pub(crate) isolation: Cell<Option<String>>,
    /// The JSON text, `None` when larger than [`MAX_FEATURES_BYTES`].
    pub(crate) seeds: Cell<Option<String>>,
    /// Cut to one more character than a sandbox id may have.
    pub(crate) fork_of: Cell<Option<String>>,
    /// The uuid as text.
    pub(crate) fork_of_incarnation: Cell<Option<String>>,
}

/// What the rules need of an engine this binary runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KnownEngine {
    /// Its name (as the registry spells it).
    pub(crate) name: EngineName,
    /// The feature names a row may request for it.
    pub(crate) allowed_features: &'static [&'static str],
}

/// The sandbox that `row` (stored under `id`) asks for, resolving its
/// engine names once, here, with `engines`: names it does not resolve end
/// up in `unknown_services`. Never fails: what cannot be used is described
/// in `invalid`.
///
/// Each step reads one column (or the columns of one rule) and adds its
/// problems in turn, so the steps run in column order.
pub(crate) fn desired_from_row(
    id: &SandboxId,
    row: DesiredRow,
    engines: impl Fn(&str) -> Option<KnownEngine>,
) -> DesiredSandbox {
    let mut problems = Problems::default();
    let owner = read_owner(row.owner, &mut problems);
    let (services, unknown_services) = read_services(row.services, &engines, &mut problems);
    let features = features(
        row.features,
        &engines,
        &services,
        &unknown_services,
        &mut problems,
    );
    let attach = read_attach(row.attach, &mut problems);
    let expires_at = read_expiry(row.has_expiry, row.expires_at, &mut problems);
    let updated_at = read_updated_at(row.updated_at_ok, row.updated_at, &mut problems);
    let generation = problems.cell("generation", row.generation).unwrap_or(0);
    let incarnation = read_incarnation(row.incarnation, &mut problems);
    // A missing or unreadable time of last use counts as the last change.
    let last_used_at = problems
        .cell("last_used_at", row.last_used_at)
        .flatten()
        .unwrap_or(updated_at);
    let idle_timeout = read_idle_timeout(row.idle_timeout_secs, &mut problems);
    let persistent = read_persistent(row.persistent, &mut problems);
    let idle_action = read_idle_action(row.idle_action, &mut problems);
    let owner_container = read_owner_container(row.owner_container, &mut problems);
    // Only admission's arrival order reads it: an unreadable one counts
    // as the last change, and is no problem.
    let created_at = row.created_at.ok().flatten().unwrap_or(updated_at);
    let isolation = read_isolation(row.isolation, &mut problems);
    let seeds = read_seeds(
        row.seeds,
        &engines,
        &services,
        &unknown_services,
        &mut problems,
    );
    if persistent && !seeds.is_empty() {
        problems.push(
            "seeds are for throwaway sandboxes, and this one is persistent: a persistent \
             sandbox keeps its data, load it once from the agent's side"
                .into(),
        );
    }
    let fork_of = read_fork_of(row.fork_of, row.fork_of_incarnation, &mut problems);
    if fork_of.is_some() && (persistent || !seeds.is_empty()) {
        problems.push(
            "a fork starts with its source's data on tmpfs: it can be neither persistent nor seeded"
                .into(),
        );
    }

    DesiredSandbox {
        id: id.clone(),
        owner,
        services,
        unknown_services,
        features,
        attach,
        invalid: problems.into_reason(),
        expires_at,
        generation,
        incarnation,
        updated_at,
        created_at,
        last_used_at,
        idle_timeout,
        persistent,
        idle_action,
        owner_container,
        isolation,
        seeds,
        fork_of,
    }
}

/// The `fork_of` and `fork_of_incarnation` columns: both unset, or a
/// sandbox id and a uuid.
fn read_fork_of(
    id: Cell<Option<String>>,
    incarnation: Cell<Option<String>>,
    problems: &mut Problems,
) -> Option<ForkOf> {
    let id = problems.cell("fork_of", id).flatten();
    let incarnation = problems.cell("fork_of_incarnation", incarnation).flatten();
    match (id, incarnation) {
        (None, None) => None,
        (Some(id), Some(incarnation)) => {
            let Ok(sandbox) = SandboxId::parse(&id) else {
                problems.push("fork_of is not a sandbox id".into());
                return None;
            };
            let Ok(incarnation) = Incarnation::parse(&incarnation) else {
                problems.push("fork_of_incarnation is not a uuid".into());
                return None;
            };
            Some(ForkOf {
                sandbox,
                incarnation,
            })
        }
        _ => {
            problems.push(
                "fork_of and fork_of_incarnation must be set together (sandbox_fork sets both)"
                    .into(),
            );
            None
        }
    }
}

/// The `seeds` column: an object of engine (one `services` requests) to a
/// seed hash. An entry that breaks the rule is dropped and reported.
fn read_seeds(
    column: Cell<Option<String>>,
    engines: &impl Fn(&str) -> Option<KnownEngine>,
    services: &[EngineName],
    unknown_services: &[String],
    problems: &mut Problems,
) -> BTreeMap<EngineName, SeedHash> {
    let mut seeds = BTreeMap::new();
    let Some(raw) = engine_object::<String>(
        "seeds",
        column,
        "name one seed hash per engine",
        "a seed hash, e.g. {\"postgres\":\"sha256:…\"}",
        problems,
    ) else {
        return seeds;
    };
    for (name, hash) in raw {
        let Some(engine) = requested_engine(
            "seeds",
            &name,
            engines,
            services,
            unknown_services,
            problems,
        ) else {
            continue;
        };
        match SeedHash::parse(&hash) {
            Some(hash) => {
                seeds.insert(engine.name, hash);
            }
            None => problems.push(format!(
                "the seed of engine {} is {}, not a hash (sha256: and 64 hex digits)",
                shown(&name),
                shown(&hash)
            )),
        }
    }
    seeds
}

/// The `owner` column: text of at most [`MAX_OWNER_CHARS`] characters
/// without control characters (an unset one reads as empty).
fn read_owner(column: Cell<Option<String>>, problems: &mut Problems) -> String {
    let owner = problems.cell("owner", column).flatten().unwrap_or_default();
    if owner.chars().count() <= MAX_OWNER_CHARS && !owner.chars().any(char::is_control) {
        return owner;
    }
    problems.push(format!(
        "owner must be text of at most {MAX_OWNER_CHARS} characters without control characters"
    ));
    // It may reach labels and logs: never with control characters.
    owner
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_OWNER_CHARS)
        .collect()
}

/// The `services` column: at least one engine, none named twice. Each name
/// is looked up once, in the row's order; the engines this binary runs come
/// back first, the names it does not know second.
fn read_services(
    column: ListColumn,
    engines: &impl Fn(&str) -> Option<KnownEngine>,
    problems: &mut Problems,
) -> (Vec<EngineName>, Vec<String>) {
    let raw_services = problems.list("services", column, MAX_SERVICES);
    if raw_services.as_ref().is_some_and(Vec::is_empty) {
        problems.push("services is empty: name at least one engine".into());
    }
    let mut services = Vec::new();
    let mut unknown_services = Vec::new();
    for name in raw_services.unwrap_or_default() {
        if services.iter().any(|e: &EngineName| e.as_str() == name)
            || unknown_services.contains(&name)
        {
            problems.push(format!("services name {} twice", shown(&name)));
            continue;
        }
        match engines(&name) {
            Some(engine) => services.push(engine.name),
            None => unknown_services.push(name),
        }
    }
    (services, unknown_services)
}

/// The `attach` column: distinct Docker container names. What breaks the
/// rule is dropped (and reported once), the rest kept.
fn read_attach(column: ListColumn, problems: &mut Problems) -> Vec<String> {
    let mut attach = problems
        .list("attach", column, MAX_ATTACH)
        .unwrap_or_default();
    if let Some(bad) = attach.iter().find(|n| !docker_name(n)) {
        problems.push(format!(
            "attach holds {}, which is not a Docker container name (1 to 128 characters from \
             a-z, A-Z, 0-9, '_', '.' and '-', starting with a letter or digit)",
            shown(bad)
        ));
        attach.retain(|n| docker_name(n));
    }
    let distinct: BTreeSet<&String> = attach.iter().collect();
    if distinct.len() != attach.len() {
        problems.push("attach names a container twice".into());
        let mut seen = BTreeSet::new();
        attach.retain(|n| seen.insert(n.clone()));
    }
    attach
}

/// The `expires_at` column: unset, or a finite time before the year 10000.
fn read_expiry(
    has_expiry: Cell<bool>,
    expires_at: Cell<Option<DateTime<Utc>>>,
    problems: &mut Problems,
) -> Option<DateTime<Utc>> {
    let has_expiry = problems.cell("has_expiry", has_expiry).unwrap_or(false);
    let expires_at = problems.cell("expires_at", expires_at).flatten();
    if has_expiry && expires_at.is_none() {
        problems
            .push("expires_at is not a finite time before the year 10000 (e.g. 'infinity')".into());
    }
    expires_at
}

/// The `updated_at` column: a finite time before the year 10000 (the time
/// of the read stands in for one that is not, the epoch for an unreadable
/// one).
fn read_updated_at(
    updated_at_ok: Cell<bool>,
    updated_at: Cell<DateTime<Utc>>,
    problems: &mut Problems,
) -> DateTime<Utc> {
    let updated_at_ok = problems
        .cell("updated_at_ok", updated_at_ok)
        .unwrap_or(false);
    if !updated_at_ok {
        problems.push("updated_at is not a finite time before the year 10000".into());
    }
    problems
        .cell("updated_at", updated_at)
        .unwrap_or(DateTime::UNIX_EPOCH)
}

/// The `incarnation` column: a uuid.
fn read_incarnation(column: Cell<Option<String>>, problems: &mut Problems) -> Option<Incarnation> {
    let incarnation = problems
        .cell("incarnation", column)
        .flatten()
        .and_then(|text| Incarnation::parse(&text).ok());
    if incarnation.is_none() {
        problems.push("incarnation is not a uuid".into());
    }
    incarnation
}

/// The `idle_timeout` column: unset, or 0 (never) to
/// [`MAX_IDLE_TIMEOUT_SECS`] seconds.
fn read_idle_timeout(column: Cell<Option<f64>>, problems: &mut Problems) -> Option<Duration> {
    match problems.cell("idle_timeout_secs", column).flatten() {
        None => None,
        Some(secs) if (0.0..=MAX_IDLE_TIMEOUT_SECS).contains(&secs) => {
            Some(Duration::from_secs_f64(secs))
        }
        Some(_) => {
            problems.push(format!(
                "idle_timeout must be between 0 (never) and {MAX_IDLE_TIMEOUT_SECS} seconds"
            ));
            None
        }
    }
}

/// The `persistent` column: true or false (an unset one reads as false).
fn read_persistent(column: Cell<Option<bool>>, problems: &mut Problems) -> bool {
    match problems.cell("persistent", column).flatten() {
        Some(p) => p,
        None => {
            problems.push("persistent is NULL: set it to true or false".into());
            false
        }
    }
}

/// The `idle_action` column: 'release' or 'pause' (anything else reads as
/// release).
fn read_idle_action(column: Cell<Option<String>>, problems: &mut Problems) -> IdleAction {
    match problems
        .cell("idle_action", column)
        .flatten()
        .as_deref()
        .map(|a| (a, IdleAction::parse(a)))
    {
        Some((_, Some(action))) => action,
        Some((bad, None)) => {
            problems.push(format!(
                "idle_action is {}: use 'release' or 'pause'",
                shown(bad)
            ));
            IdleAction::Release
        }
        None => {
            problems.push("idle_action is NULL: use 'release' or 'pause'".into());
            IdleAction::Release
        }
    }
}

/// The `isolation` column: unset (the controller's `--runtime`), or a
/// level this binary knows. Any other value is reported (the row is then
/// invalid and its containers are kept untouched: never run a sandbox under
/// less than it asked for).
fn read_isolation(column: Cell<Option<String>>, problems: &mut Problems) -> Option<Isolation> {
    let text = problems.cell("isolation", column).flatten()?;
    let level = Isolation::parse(&text);
    if level.is_none() {
        problems.push(format!(
            "isolation is {}: use 'container', 'gvisor' or NULL (the controller's --runtime)",
            shown(&text)
        ));
    }
    level
}

/// The `owner_container` column: unset, or a Docker container name (one
/// that is not is reported and dropped).
fn read_owner_container(column: Cell<Option<String>>, problems: &mut Problems) -> Option<String> {
    let owner_container = problems.cell("owner_container", column).flatten();
    if let Some(bad) = owner_container.as_ref().filter(|n| !docker_name(n)) {
        problems.push(format!(
            "owner_container holds {}, which is not a Docker container name",
            shown(bad)
        ));
    }
    owner_container.filter(|n| docker_name(n))
}

/// The `features` column: a JSON object mapping each requested engine to
/// at most [`MAX_FEATURES`] distinct allowlisted feature names.
///
/// Its engines are looked up once each, in the object's (sorted) order.
fn features(
    column: Cell<Option<String>>,
    engines: &impl Fn(&str) -> Option<KnownEngine>,
    services: &[EngineName],
    unknown_services: &[String],
    problems: &mut Problems,
) -> BTreeMap<EngineName, BTreeSet<String>> {
    let mut features = BTreeMap::new();
    let Some(raw) = engine_object::<Vec<String>>(
        "features",
        column,
        &format!("name at most {MAX_FEATURES} features per engine"),
        "an array of feature names, e.g. {\"postgres\":[\"pg_trgm\"]}",
        problems,
    ) else {
        return features;
    };
    for (name, list) in raw {
        let Some(engine) = requested_engine(
            "features",
            &name,
            engines,
            services,
            unknown_services,
            problems,
        ) else {
            continue;
        };
        if let Some(set) = engine_features(&name, engine, &list, problems) {
            features.insert(engine.name, set);
        }
    }
    features
}

/// The shape check of a JSON column keyed by engine (`features`,
/// `seeds`): the column `name` decoded as an object of engine name to a
/// `T`, or `None` and a problem (saying what to do when it is larger than
/// the store reads, and what each engine maps to when it is not such an
/// object).
fn engine_object<T: serde::de::DeserializeOwned>(
    name: &str,
    column: Cell<Option<String>>,
    when_too_large: &str,
    each_maps_to: &str,
    problems: &mut Problems,
) -> Option<BTreeMap<String, T>> {
    let text = match problems.cell(name, column) {
        Some(Some(text)) => text,
        Some(None) => {
            problems.push(format!(
                "{name} is larger than {MAX_FEATURES_BYTES} bytes: {when_too_large}"
            ));
            return None;
        }
        // Already reported.
        None => return None,
    };
    let Ok(raw) = serde_json::from_str::<BTreeMap<String, T>>(&text) else {
        problems.push(format!(
            "{name} is not a JSON object mapping engine to {each_maps_to}"
        ));
        return None;
    };
    Some(raw)
}

/// The engine that the key `name` of the JSON column `column` (`features`,
/// `seeds`) names, when `services` requests it and this binary runs it;
/// else `None` (and a problem when `services` does not request it).
fn requested_engine(
    column: &str,
    name: &str,
    engines: &impl Fn(&str) -> Option<KnownEngine>,
    services: &[EngineName],
    unknown_services: &[String],
    problems: &mut Problems,
) -> Option<KnownEngine> {
    let engine = engines(name);
    let requested = match engine {
        Some(e) => services.contains(&e.name),
        None => unknown_services.iter().any(|u| u == name),
    };
    if !requested {
        problems.push(format!(
            "{column} name engine {}, which services do not request",
            shown(name)
        ));
        return None;
    }
    // An engine this binary does not know: the row is already failed
    // through `unknown_services`.
    engine
}

/// The features `list` asks of `engine` (named `name` in the row): at most
/// [`MAX_FEATURES`], else `None` and a problem. A name listed twice and a
/// feature off the engine's allowlist are reported; the set is kept either
/// way.
fn engine_features(
    name: &str,
    engine: KnownEngine,
    list: &[String],
    problems: &mut Problems,
) -> Option<BTreeSet<String>> {
    if list.len() > MAX_FEATURES {
        problems.push(format!(
            "features for {name} list {} entries: at most {MAX_FEATURES} are allowed",
            list.len()
        ));
        return None;
    }
    let set: BTreeSet<String> = list.iter().cloned().collect();
    if set.len() != list.len() {
        problems.push(format!("features for {name} name a feature twice"));
    }
    check_allowlist(name, engine.allowed_features, &set, problems);
    Some(set)
}

/// The allowlist check: the first feature of `set` that `allowed` does not
/// hold, reported with what `allowed` does hold.
fn check_allowlist(name: &str, allowed: &[&str], set: &BTreeSet<String>, problems: &mut Problems) {
    if let Some(bad) = set.iter().find(|f| !allowed.contains(&f.as_str())) {
        problems.push(format!(
            "feature {} is not allowed for engine {name}: allowed features are {}",
            shown(bad),
            if allowed.is_empty() {
                "(none)".to_owned()
            } else {
                allowed.join(", ")
            }
        ));
    }
}

/// What is wrong with a desired row, collected while reading it.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn push(&mut self, problem: String) {
        self.0.push(problem);
    }

    /// The value of column `name`, or `None` (and a problem) when it could
    /// not be read.
    fn cell<T>(&mut self, name: &str, cell: Cell<T>) -> Option<T> {
        match cell {
            Ok(v) => Some(v),
            Err(Unreadable) => {
                self.push(format!("column {name} cannot be read"));
                None
            }
        }
    }

    /// The elements of list column `name` when it is a one-dimensional list
    /// of at most `max` entries starting at index 1 without NULLs, else
    /// `None` and a problem.
    fn list(&mut self, name: &str, column: ListColumn, max: i32) -> Option<Vec<String>> {
        let Some(len) = self.cell(&format!("{name}_len"), column.len)? else {
            self.push(format!("{name} is NULL"));
            return None;
        };
        if len == 0 {
            return Some(Vec::new());
        }
        if len > max {
            self.push(format!(
                "{name} lists {len} entries: at most {max} are allowed"
            ));
            return None;
        }
        let ndims = self.cell(&format!("{name}_ndims"), column.ndims)?;
        let lower = self.cell(&format!("{name}_lower"), column.lower)?;
        if ndims != Some(1) || lower != Some(1) {
            self.push(format!(
                "{name} is not a one-dimensional list starting at index 1"
            ));
            return None;
        }
        let text = self.cell(name, column.json)??;
        match serde_json::from_str::<Vec<Option<String>>>(&text) {
            Ok(items) if items.iter().all(Option::is_some) => {
                Some(items.into_iter().flatten().collect())
            }
            Ok(_) => {
                self.push(format!("{name} contains NULL"));
                None
            }
            Err(_) => {
                self.push(format!("{name} cannot be read as a list of text"));
                None
            }
        }
    }

    fn into_reason(self) -> Option<String> {
        (!self.0.is_empty()).then(|| self.0.join("; "))
    }
}

/// A value from a row, quoted for a message: at most 80 characters, control
/// characters escaped.
pub(crate) fn shown(value: &str) -> String {
    let cut: String = value.chars().take(80).collect();
    format!("{cut:?}")
}

/// Docker's container name rule: `^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$`.
fn docker_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

#[cfg(test)]
mod tests;
