//! `sandboxd request`: ask for a sandbox, adding to what it already has.

use super::apply::parse_features;
use super::args::RequestArgs;
use super::get::{export_lines, print_status};
use super::{progress, CliError};
use crate::client::{Client, Request};

/// Asks for the sandbox `args` describe; with `--wait`, prints its status
/// (or `export` lines) once ready.
pub(super) async fn request(url: &str, args: RequestArgs) -> Result<(), CliError> {
    let req = Request {
        owner: args.owner,
        services: args.services,
        features: parse_features(&args.features)?,
        idle_timeout: args.idle_timeout,
        persistent: args.persistent,
        owner_container: args.owner_container,
        attach: args.attach,
        idle_action: args.idle_action.map(Into::into),
        isolation: args.isolation.map(Into::into),
        seeds: super::seed::parse_seeds(&args.seed)?,
    };
    let client = Client::connect(url).await?;
    let revision = client.request(&args.id, &req).await?;
    match args.wait {
        Some(timeout) => {
            let status =
                progress::wait(&client, &args.id, &revision, timeout, args.progress).await?;
            if args.export {
                for line in export_lines(&status)? {
                    say!("{line}");
                }
            } else {
                print_status(&status);
            }
        }
        None => say!(
            "requested {} at generation {}",
            args.id,
            revision.generation
        ),
    }
    Ok(())
}
