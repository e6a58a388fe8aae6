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

/// `sandboxd list`: every sandbox with a status or a desired row.
pub(super) async fn run(url: &str, args: ListArgs) -> Result<(), CliError> {
    let client = Client::connect(url).await?;
    let entries = client.summaries().await?;
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
