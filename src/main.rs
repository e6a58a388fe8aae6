use clap::Parser;
use sandboxd::cli::{self, Cli, LogFormat};
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

fn main() -> std::process::ExitCode {
    // An empty SANDBOXD_* variable (compose's `${VAR:-}`) means "unset",
    // so the flag keeps its default. Done before any thread exists.
    for (key, value) in std::env::vars_os() {
        if value.is_empty() && key.to_string_lossy().starts_with("SANDBOXD_") {
            std::env::remove_var(key);
        }
    }
    let cli = Cli::parse();
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandboxd: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandboxd: {e}");
            std::process::ExitCode::from(e.exit_code())
        }
    }
}
