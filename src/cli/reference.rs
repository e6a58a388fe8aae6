//! The reference tables the docs hold, generated from the code: every flag
//! of `sandboxd run` (from clap) in `docs/configuration.md`, every metric
//! (from the metrics registry) in `docs/operations.md`, and the
//! service-level objectives (from `crate::metrics::slo`) in `docs/slo.md`,
//! with the Prometheus rules made from them, `deploy/prometheus/slo.yml`
//! (a whole file).
//!
//! Each table sits between two marker comments, `<!-- generated:NAME -->`
//! and `<!-- /generated:NAME -->`. The tests below fail when the committed
//! text differs from what the code generates; to rewrite it:
//!
//! ```sh
//! SANDBOXD_WRITE_DOCS=1 cargo test --lib reference
//! ```
//!
//! The module exists only in test builds: the tables are checked (and
//! written) by its tests, never by the binary.

use clap::CommandFactory;

/// The flag table: every argument `sandboxd run` accepts (its own and the
/// global ones), with its variable, default and help.
fn flag_table() -> String {
    let root = super::Cli::command();
    let run = root
        .find_subcommand("run")
        .expect("sandboxd has a run subcommand")
        .clone();
    let globals = root.get_arguments().filter(|a| a.is_global_set());
    let mut rows = Vec::new();
    for arg in globals.chain(run.get_arguments()) {
        let Some(long) = arg.get_long() else {
            continue;
        };
        if matches!(long, "help" | "version") {
            continue;
        }
        let env = arg.get_env().map_or_else(
            || "(none)".to_owned(),
            |e| format!("`{}`", e.to_string_lossy()),
        );
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| format!("`{}`", v.to_string_lossy()))
            .collect();
        let default = if defaults.is_empty() {
            if arg.get_action().takes_values() {
                "(none)".to_owned()
            } else {
                "off".to_owned()
            }
        } else {
            defaults.join(", ")
        };
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(ToString::to_string)
            .unwrap_or_default();
        let mut meaning = one_line(&help);
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| format!("`{}`", v.get_name()))
            .collect();
        // A switch's possible values are `true`/`false`: nothing to say.
        if arg.get_action().takes_values() && !values.is_empty() {
            // clap drops a one-line help's final period.
            if !meaning.is_empty() && !meaning.ends_with('.') {
                meaning.push('.');
            }
            meaning.push_str(&format!(" One of {}.", values.join(", ")));
        }
        rows.push(format!(
            "| `--{long}` | {env} | {default} | {} |",
            cell(&meaning)
        ));
    }
    let mut out = String::from("| flag | environment | default | meaning |\n|---|---|---|---|\n");
    for row in rows {
        out.push_str(&row);
        out.push('\n');
    }
    out
}

/// One metric family as its exposition describes it.
struct Family {
    name: String,
    kind: String,
    help: String,
    labels: Vec<String>,
}

/// The metrics table: every family the controller's registry exports but
/// the process collector's.
///
/// A vector metric appears in the exposition only once it has a series, so
/// one series of each is made first through the same typed methods the
/// controller records with (the values do not matter: the table shows the
/// label names, never their values).
fn metric_table() -> String {
    let metrics = crate::metrics::Metrics::new();
    touch_every_series(&metrics);
    let mut families = parse_exposition(&metrics.render());
    // The process collector's families depend on the machine (some appear
    // only where a limit is set); the docs describe them in prose.
    families.retain(|f| !f.name.starts_with("process_"));
    families.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::from("| metric | type | labels | help |\n|---|---|---|---|\n");
    for f in families {
        let labels = f
            .labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ");
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            f.name,
            f.kind,
            labels,
            cell(&f.help)
        ));
    }
    out
}

/// Makes one series of every vector metric that [`Metrics::new`] leaves
/// without one until the controller records something.
///
/// [`Metrics::new`]: crate::metrics::Metrics::new
fn touch_every_series(m: &crate::metrics::Metrics) {
    use crate::domain::plan::{HealCause, ProvisionReason};
    use crate::sched::{FinishedAs, QueueObserver};
    use std::time::Duration;
    let engine = crate::engine::REGISTRY
        .iter()
        .next()
        .expect("the registry holds an engine")
        .name();
    m.queue.set_max_concurrent(1);
    m.lifecycle.provision_finished(
        engine,
        ProvisionReason::Create,
        true,
        Duration::from_secs(1),
    );
    m.lifecycle.request_to_ready(engine, "pool", 1.0);
    m.lifecycle.healed(engine, HealCause::Exited);
    m.lifecycle.rotated(engine);
    m.lifecycle
        .seed_loaded(engine, true, Duration::from_millis(1));
    m.lifecycle
        .fork_copied(engine, true, Duration::from_millis(1));
    m.images.template_built(engine, true);
    m.lifecycle.container_started(engine, "cold");
    m.watch
        .docker_event(crate::ports::runtime::ContainerAction::Die);
    m.fleet.containers(crate::engine::REGISTRY, &[]);
    m.fleet
        .sandboxes_in_heal_loop(&[crate::domain::id::SandboxId::parse("agent-7").unwrap()]);
    m.started(Duration::from_millis(1));
    m.finished(Duration::from_millis(1), &FinishedAs::Success);
    drop(crate::metrics::time_docker_call(
        crate::metrics::DockerCall::List,
    ));
    crate::metrics::set_placement(&[(("local".to_owned(), "running"), 1)].into());
    let owner = "reference".to_owned();
    let limits = [(
        owner.clone(),
        crate::domain::admission::Quota {
            sandboxes: Some(1),
            memory_bytes: Some(1),
        },
    )]
    .into();
    m.quota.set(
        Some(1),
        0,
        0,
        &[(owner, Some(crate::domain::admission::Use::default()))],
        &limits,
    );
}

/// The families of a text exposition, with their label names (a
/// histogram's `le` and a summary's `quantile` are part of the type).
fn parse_exposition(text: &str) -> Vec<Family> {
    let mut families: Vec<Family> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.push(Family {
                name: name.to_owned(),
                kind: String::new(),
                help: help.replace("\\n", " ").replace("\\\\", "\\"),
                labels: Vec::new(),
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let (Some(f), Some((_, kind))) = (families.last_mut(), rest.split_once(' ')) {
                kind.clone_into(&mut f.kind);
            }
        } else if let (Some(f), Some((_, labels))) = (families.last_mut(), line.split_once('{')) {
            if f.labels.is_empty() {
                f.labels = labels
                    .split(',')
                    .filter_map(|pair| pair.split_once('=').map(|(k, _)| k.trim().to_owned()))
                    .filter(|k| k != "le" && k != "quantile")
                    .collect();
            }
        }
    }
    families
}

/// Help text on one line: clap keeps the doc comment's line breaks.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Text made safe for a Markdown table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The text between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->`
/// in `doc`, and where it starts and ends.
fn generated_span(doc: &str, name: &str) -> Option<(usize, usize)> {
    let open = format!("<!-- generated:{name} -->\n");
    let close = format!("<!-- /generated:{name} -->");
    let start = doc.find(&open)? + open.len();
    let end = start + doc[start..].find(&close)?;
    Some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn doc_path(file: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("docs")
            .join(file)
    }

    /// Compares (or, with `SANDBOXD_WRITE_DOCS=1`, rewrites) one generated
    /// table of one doc.
    fn check(file: &str, name: &str, generated: &str) {
        let path = doc_path(file);
        let doc = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let (start, end) = generated_span(&doc, name).unwrap_or_else(|| {
            panic!(
                "{} has no `<!-- generated:{name} -->` … `<!-- /generated:{name} -->` markers",
                path.display()
            )
        });
        if doc[start..end] == *generated {
            return;
        }
        if std::env::var_os("SANDBOXD_WRITE_DOCS").is_some_and(|v| v == "1") {
            let rewritten = format!("{}{generated}{}", &doc[..start], &doc[end..]);
            std::fs::write(&path, rewritten)
                .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            return;
        }
        panic!(
            "the {name} table in {} differs from what the code generates; \
             rewrite it with `SANDBOXD_WRITE_DOCS=1 cargo test --lib reference` \
             and commit the result. Generated:\n{generated}",
            path.display()
        );
    }

    #[test]
    fn the_objectives_table_in_docs_slo_is_generated_from_the_objectives() {
        check("slo.md", "objectives", &crate::metrics::slo::table());
    }

    #[test]
    fn the_burn_rate_rules_are_generated_from_the_objectives() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/slo.yml");
        let generated = crate::metrics::slo::rules();
        if std::fs::read_to_string(&path).ok().as_deref() == Some(generated.as_str()) {
            return;
        }
        if std::env::var_os("SANDBOXD_WRITE_DOCS").is_some_and(|v| v == "1") {
            std::fs::write(&path, &generated)
                .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            return;
        }
        panic!(
            "{} differs from what src/metrics/slo.rs generates; rewrite it with \
             `SANDBOXD_WRITE_DOCS=1 cargo test --lib reference` and commit the result",
            path.display()
        );
    }

    #[test]
    fn the_flag_table_in_docs_configuration_is_generated_from_clap() {
        check("configuration.md", "flags", &flag_table());
    }

    #[test]
    fn the_metric_table_in_docs_operations_is_generated_from_the_registry() {
        check("operations.md", "metrics", &metric_table());
    }

    /// Every metric name the metrics module defines is in the table, so a
    /// new vector metric without a series made above cannot go missing.
    #[test]
    fn the_metric_table_lists_every_metric_the_metrics_module_defines() {
        let table = metric_table();
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![src.join("metrics.rs")];
        if let Ok(dir) = std::fs::read_dir(src.join("metrics")) {
            files.extend(dir.filter_map(Result::ok).map(|e| e.path()));
        }
        let mut names = Vec::new();
        for file in files.into_iter().filter(|f| f.is_file()) {
            let text = std::fs::read_to_string(&file).expect("read a metrics source file");
            // Every quoted piece that is a whole metric name (comments
            // may hold quotes too, so no reliance on their parity).
            for piece in text.split('"') {
                let is_name = ["sandboxd_", "controller_runtime_", "workqueue_"]
                    .iter()
                    .any(|p| piece.starts_with(p))
                    && piece.chars().all(|c| c.is_ascii_lowercase() || c == '_');
                if is_name {
                    names.push(piece.to_owned());
                }
            }
        }
        assert!(names.len() > 50, "found only {} metric names", names.len());
        for name in names {
            assert!(
                table.contains(&format!("| `{name}` |")),
                "{name} is defined but not in the generated table: make a series of it in touch_every_series"
            );
        }
    }

    #[test]
    fn the_exposition_parser_reads_names_types_and_label_names() {
        let text = "# HELP a_seconds How long.\n# TYPE a_seconds histogram\n\
                    a_seconds_bucket{op=\"x\",le=\"+Inf\"} 0\n\
                    # HELP b_total Count.\n# TYPE b_total counter\nb_total 3\n";
        let families = parse_exposition(text);
        assert_eq!(families.len(), 2);
        assert_eq!(
            (families[0].name.as_str(), families[0].kind.as_str()),
            ("a_seconds", "histogram")
        );
        assert_eq!(families[0].labels, ["op"]);
        assert!(families[1].labels.is_empty());
        assert_eq!(families[1].help, "Count.");
    }
}
