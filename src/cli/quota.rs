//! `sandboxd quota`: the operator's per-owner limits (`sandbox_quotas`),
//! set, unset and listed with their use.

use super::{table, CliError};
use crate::adapters::postgres::{QuotaLine, QuotaSetting, QuotaSettings};
use crate::adapters::PgStore;
use crate::domain::admission::{parse_bytes, Bytes};
use clap::{Args, Subcommand};

/// `sandboxd quota` subcommands.
#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Sets an owner's limits (`*`: the default for every owner without a
    /// row of its own; an owner's row replaces the default as a whole).
    /// A limit not given keeps its value (unlimited for a new row). A lower
    /// limit evicts nothing: it holds back new sandboxes only.
    Set(SetArgs),
    /// Deletes an owner's row: the default applies to it again.
    Unset {
        /// The owner (`*`: the default row).
        owner: String,
    },
    /// Every owner with a limit, a desired row or a seed: the limits that
    /// apply and its use as the status rows (and its stored seeds) show it
    /// (sandboxd's metrics
    /// sandboxd_quota_used and sandboxd_quota_limit are the controller's
    /// own view).
    List(ListArgs),
}

/// Flags of `sandboxd quota set`.
#[derive(Debug, Args)]
pub struct SetArgs {
    /// The owner (`*`: the default row).
    pub owner: String,
    /// Sandboxes the owner may hold at once: a number or `unlimited`.
    #[arg(long, value_parser = parse_count)]
    pub sandboxes: Option<QuotaSetting>,
    /// The sum of the memory caps of the owner's sandboxes (each engine
    /// counts its --memory-mb cap): a size such as 4GiB, or `unlimited`.
    #[arg(long, value_parser = parse_memory)]
    pub memory: Option<QuotaSetting>,
    /// Seeds (sandbox_seed_put) the owner may store at once: a number or
    /// `unlimited` (a new row: 16).
    #[arg(long, value_parser = parse_seeds)]
    pub seeds: Option<QuotaSetting>,
    /// The bytes of the owner's seeds together: a size such as 64MiB, or
    /// `unlimited` (a new row: 64 MiB).
    #[arg(long, value_parser = parse_seed_bytes)]
    pub seed_bytes: Option<QuotaSetting>,
}

/// Flags of `sandboxd quota list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// `table` or `json`.
    #[arg(short, long, default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
    /// The controller's memory cap per engine container, MiB (to show
    /// memory use).
    #[arg(long, env = "SANDBOXD_MEMORY_MB", default_value_t = 512)]
    pub memory_mb: u64,
}

fn count_of(flag: &str, s: &str) -> Result<QuotaSetting, String> {
    match s {
        "unlimited" | "none" => Ok(QuotaSetting::Unlimited),
        _ => s
            .parse()
            .map(QuotaSetting::To)
            .map_err(|_| format!("invalid {flag} {s:?}: use a number (0 or more) or `unlimited`")),
    }
}

fn size_of(flag: &str, s: &str) -> Result<QuotaSetting, String> {
    match s {
        "unlimited" | "none" => Ok(QuotaSetting::Unlimited),
        _ => parse_bytes(s).map(QuotaSetting::To).ok_or_else(|| {
            format!("invalid {flag} {s:?}: use a size such as 4GiB or 512MiB, or `unlimited`")
        }),
    }
}

fn parse_count(s: &str) -> Result<QuotaSetting, String> {
    count_of("--sandboxes", s)
}

fn parse_memory(s: &str) -> Result<QuotaSetting, String> {
    size_of("--memory", s)
}

fn parse_seeds(s: &str) -> Result<QuotaSetting, String> {
    count_of("--seeds", s)
}

fn parse_seed_bytes(s: &str) -> Result<QuotaSetting, String> {
    size_of("--seed-bytes", s)
}

fn check_owner(owner: &str) -> Result<(), CliError> {
    if owner.is_empty() || owner.chars().count() > 200 || owner.chars().any(char::is_control) {
        return Err(CliError::Quota(format!(
            "invalid owner {owner:?}: use 1 to 200 printable characters (`*` for the default)"
        )));
    }
    Ok(())
}

fn limit(v: Option<u64>, show: impl Fn(u64) -> String) -> String {
    v.map_or_else(|| "unlimited".to_owned(), show)
}

/// Runs one `sandboxd quota` subcommand.
pub(super) async fn run(url: &str, command: QuotaCommand) -> Result<(), CliError> {
    let store = PgStore::connect(url, 1, crate::engine::REGISTRY).await?;
    match command {
        QuotaCommand::Set(args) => {
            check_owner(&args.owner)?;
            let keep = |s: Option<QuotaSetting>| s.unwrap_or(QuotaSetting::Keep);
            let set = QuotaSettings {
                sandboxes: keep(args.sandboxes),
                memory: keep(args.memory),
                seeds: keep(args.seeds),
                seed_bytes: keep(args.seed_bytes),
            };
            let quota = store.set_limits(&args.owner, set).await?;
            say!(
                "quota of {:?}: sandboxes={} memory={} seeds={} seed-bytes={}",
                args.owner,
                limit(quota.admission.sandboxes, |n| n.to_string()),
                limit(quota.admission.memory_bytes, |b| Bytes(b).to_string()),
                limit(quota.seeds, |n| n.to_string()),
                limit(quota.seed_bytes, |b| Bytes(b).to_string())
            );
        }
        QuotaCommand::Unset { owner } => {
            check_owner(&owner)?;
            if store.delete_quota(&owner).await? {
                say!("quota of {owner:?} deleted: the default (`*`) applies");
            } else {
                say!("{owner:?} had no quota of its own");
            }
        }
        QuotaCommand::List(args) => {
            let lines = store.quota_lines().await?;
            if args.output == "json" {
                say!("{}", serde_json::to_string_pretty(&lines).expect("JSON"));
            } else {
                say!("{}", render(&lines, args.memory_mb << 20).trim_end());
            }
        }
    }
    Ok(())
}

fn render(lines: &[QuotaLine], engine_bytes: u64) -> String {
    let mut t = table::Table::new(&[
        "OWNER",
        "LIMIT FROM",
        "SANDBOXES",
        "MEMORY",
        "WAITING",
        "SEEDS",
        "SEED BYTES",
    ]);
    for l in lines {
        t.row(vec![
            l.owner.clone(),
            l.source.clone().unwrap_or_else(|| "-".into()),
            format!(
                "{}/{}",
                l.sandboxes,
                limit(l.max_sandboxes, |n| n.to_string())
            ),
            format!(
                "{}/{}",
                Bytes(l.engines * engine_bytes),
                limit(l.max_memory_bytes, |b| Bytes(b).to_string())
            ),
            l.waiting.to_string(),
            format!("{}/{}", l.seeds, limit(l.max_seeds, |n| n.to_string())),
            format!(
                "{}/{}",
                Bytes(l.seed_bytes),
                limit(l.max_seed_bytes, |b| Bytes(b).to_string())
            ),
        ]);
    }
    t.render()
}
