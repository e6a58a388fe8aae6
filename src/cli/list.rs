//! `sandboxd list`: every sandbox with a status or a desired row, as an
//! aligned table (id, phase, engines, age, heals, message) or JSON.

use super::{table, CliError};
use crate::client::Client;
use clap::{Args, ValueEnum};

/// Flags of `sandboxd list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// `table` (aligned columns) or `json` (an array, one object per
    /// sandbox, without credentials).
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: ListOutput,
}

/// `sandboxd list --output` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ListOutput {
    /// Aligned columns.
    Table,
    /// A JSON array.
    Json,
}

/// One line of `sandboxd list` (an object of `--output json`).
#[derive(Debug, serde::Serialize)]
struct Listed {
    id: String,
    phase: String,
    engines: Vec<String>,
    created_at: Option<chrono::DateTime<chrono::Utc>>,
    generation: Option<i64>,
    observed_generation: i64,
    heals: u64,
    network: Option<String>,
    message: String,
}

/// `sandboxd list`: every sandbox with a status or a desired row.
pub(super) async fn run(url: &str, args: ListArgs) -> Result<(), CliError> {
    let client = Client::connect(url).await?;
    let (statuses, mut rows) = tokio::try_join!(client.list_redacted(), client.rows())?;
    let mut entries: Vec<Listed> = statuses
        .into_iter()
        .map(|s| {
            let row = rows.remove(s.id.as_str());
            Listed {
                id: s.id.to_string(),
                phase: s.phase.to_string(),
                engines: match &row {
                    Some(r) => r.services.clone(),
                    None => s.services.keys().cloned().collect(),
                },
                created_at: row.as_ref().map(|r| r.created_at),
                generation: row.as_ref().map(|r| r.generation),
                observed_generation: s.observed_generation,
                heals: s.services.values().map(|v| u64::from(v.heals)).sum(),
                network: s.network,
                message: s.message,
            }
        })
        .collect();
    // Rows no status speaks of yet.
    entries.extend(rows.into_iter().map(|(id, row)| Listed {
        id,
        phase: "pending".into(),
        engines: row.services,
        created_at: Some(row.created_at),
        generation: Some(row.generation),
        observed_generation: 0,
        heals: 0,
        network: None,
        message: "sandboxd has not written a status yet".into(),
    }));
    entries.sort_by(|a, b| a.id.cmp(&b.id));
    match args.output {
        ListOutput::Json => say!("{}", serde_json::to_string_pretty(&entries).expect("JSON")),
        ListOutput::Table => {
            let now = chrono::Utc::now();
            let mut t = table::Table::new(&["ID", "PHASE", "ENGINES", "AGE", "HEALS", "MESSAGE"]);
            for e in entries {
                t.row(vec![
                    e.id,
                    e.phase,
                    e.engines.join(","),
                    e.created_at
                        .map_or_else(|| "-".to_owned(), |c| table::age(c, now)),
                    e.heals.to_string(),
                    table::first_line(&e.message, 80),
                ]);
            }
            say!("{}", t.render().trim_end());
        }
    }
    Ok(())
}
