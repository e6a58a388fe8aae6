//! `sandboxd seed put` and `seed delete`: register seed content under its
//! hash, or remove it; and the `--seed ENGINE=HASH` values of `apply` and
//! `request`.

use super::CliError;
use crate::client::Client;
use clap::{Args, Subcommand};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `sandboxd seed` subcommands.
#[derive(Debug, Subcommand)]
pub enum SeedCommand {
    /// Registers FILE's content as a seed for ENGINE and prints its hash
    /// (`sha256:…`), to name in a sandbox's `--seed ENGINE=HASH`. The same
    /// content again prints the same hash. Postgres: SQL text (a plain
    /// `pg_dump` too) or a `pg_dump -Fc` archive, run as the agent; redis
    /// and valkey: commands, one per line (`SET k "a b"`), or an RDB file
    /// (what `SAVE` writes), which the server starts from.
    Put(PutArgs),
    /// Deletes the seed HASH (what `seed put` printed). Refused while a
    /// sandbox row of its owner names it: release those or name another
    /// seed in them first. Says whether there was one.
    Delete(DeleteArgs),
}

/// Flags of `sandboxd seed delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// The seed's hash (`sha256:…`).
    pub hash: String,
    /// Whose seed it is (default: the database role the command connects
    /// as).
    #[arg(long)]
    pub owner: Option<String>,
}

/// Flags of `sandboxd seed put`.
#[derive(Debug, Args)]
pub struct PutArgs {
    /// The file (`-`: standard input); at most 16 MiB.
    pub file: PathBuf,
    /// The engine it seeds: postgres, redis or valkey.
    #[arg(long)]
    pub engine: String,
    /// Whose seed it is: rows may name only their owner's seeds (default:
    /// the database role the command connects as).
    #[arg(long)]
    pub owner: Option<String>,
}

/// Runs `sandboxd seed …`.
pub(super) async fn run(url: &str, command: SeedCommand) -> Result<(), CliError> {
    let args = match command {
        SeedCommand::Put(args) => args,
        SeedCommand::Delete(args) => {
            let client = Client::connect(url).await?;
            let deleted = client
                .delete_seed(&args.hash, args.owner.as_deref())
                .await?;
            say!(
                "{}",
                if deleted {
                    format!("seed {} deleted", args.hash)
                } else {
                    format!("no seed {} (deleted already?)", args.hash)
                }
            );
            return Ok(());
        }
    };
    let content = if args.file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
            .map_err(|e| CliError::SeedFile("standard input".into(), e))?;
        buf
    } else {
        std::fs::read(&args.file)
            .map_err(|e| CliError::SeedFile(args.file.display().to_string(), e))?
    };
    let client = Client::connect(url).await?;
    let hash = client
        .put_seed(&args.engine, &content, args.owner.as_deref())
        .await?;
    say!("{hash}");
    Ok(())
}

/// Parses `--seed` values (`ENGINE=HASH`) into the seed per engine.
pub(super) fn parse_seeds(values: &[String]) -> Result<BTreeMap<String, String>, CliError> {
    let mut seeds = BTreeMap::new();
    for v in values {
        match v.split_once('=') {
            Some((engine, hash)) if !engine.is_empty() && !hash.is_empty() => {
                if seeds.insert(engine.to_owned(), hash.to_owned()).is_some() {
                    return Err(CliError::Seed(v.clone()));
                }
            }
            _ => return Err(CliError::Seed(v.clone())),
        }
    }
    Ok(seeds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_values_are_engine_equals_hash_once_per_engine() {
        let ok = parse_seeds(&["postgres=sha256:ab".into(), "redis=sha256:cd".into()]).unwrap();
        assert_eq!(ok["postgres"], "sha256:ab");
        assert_eq!(ok["redis"], "sha256:cd");
        for bad in [
            "postgres",
            "=sha256:ab",
            "postgres=",
            "postgres=a,postgres=b",
        ] {
            let values: Vec<String> = bad.split(',').map(str::to_owned).collect();
            assert!(parse_seeds(&values).is_err(), "{bad}");
        }
    }
}
