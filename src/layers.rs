//! The directions imports may take between the crate's layers, checked on
//! the source text: every `crate::…` path (and `super::…` path that leaves
//! its layer) in each file under `src/`, comments and test code left out.
//!
//! - `domain` is the pure core: it names no other module of the crate,
//!   and no crate that does I/O (tokio, bollard, sqlx, hyper, axum,
//!   rustls, redis).
//! - `ports` are the controller's needs as traits: they name only
//!   `domain`, and no crate that does I/O.
//! - `controller` names no adapter (`adapters`) and not the command line
//!   (`cli`): it is handed its ports, already wrapped.
//! - `adapters` name neither the `controller`, the `cli` nor the `config`:
//!   they take plain values (or types of `ports` or their own), which the
//!   composition root makes of the configuration.
//! - `cli` is the composition root: no other layer names it.
//!
//! Test code is left out: `#[cfg(test)]` modules and items, files named
//! `tests.rs` or under a `tests/` folder, and `testing/` (the fakes and the
//! test wiring, which reach across layers on purpose).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Crates that talk to the world.
const IO_CRATES: [&str; 8] = [
    "tokio",
    "tokio_rustls",
    "bollard",
    "sqlx",
    "hyper",
    "axum",
    "rustls",
    "redis",
];

/// One forbidden direction.
struct Rule {
    /// The layer the rule is about (the first module under `src/`).
    layer: &'static str,
    /// `Some`: the only crate modules it may name (besides itself).
    only: Option<&'static [&'static str]>,
    /// Crate modules it may not name.
    not: &'static [&'static str],
    /// Whether it may name crates that do I/O.
    io: bool,
}

const RULES: [Rule; 4] = [
    Rule {
        layer: "domain",
        only: Some(&[]),
        not: &[],
        io: false,
    },
    Rule {
        layer: "ports",
        only: Some(&["domain"]),
        not: &[],
        io: false,
    },
    Rule {
        layer: "controller",
        only: None,
        not: &["adapters", "cli"],
        io: true,
    },
    Rule {
        layer: "adapters",
        only: None,
        not: &["controller", "cli", "config"],
        io: true,
    },
];

/// The Rust files under `dir`, production code only.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "tests" && name != "testing" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && name != "layers.rs" {
            // (This file is test code too, and quotes forbidden paths.)
            out.push(path);
        }
    }
}

/// The module path of `file` (`src/controller/mod.rs` → `controller`,
/// `src/controller/fence.rs` → `controller::fence`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file
        .strip_prefix(src)
        .expect("under src/")
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// `text` without comments and without `#[cfg(test)]` items (a module
/// block, a `mod x;` or a `use`).
fn production_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            let indent = line.len() - trimmed.len();
            // The item after the attribute, through its end.
            for item in lines.by_ref() {
                let t = item.trim_start();
                if t.starts_with("#[") {
                    continue;
                }
                if t.ends_with('{') {
                    let close = format!("{}}}", " ".repeat(indent));
                    for inner in lines.by_ref() {
                        if inner.trim_end() == close {
                            break;
                        }
                    }
                    break;
                }
                if t.ends_with(';') {
                    break;
                }
                // A `use` over several lines: skip to its `;`.
                for inner in lines.by_ref() {
                    if inner.trim_end().ends_with(';') {
                        break;
                    }
                }
                break;
            }
            continue;
        }
        // A comment starts at the first `//` that does not follow a `:`
        // (that one is a URL in a string).
        let code = line
            .match_indices("//")
            .find(|(i, _)| !line[..*i].ends_with(':'))
            .map_or(line, |(i, _)| &line[..i]);
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The crate's top-level modules `code` (in module `module`) names:
/// `crate::x`, `crate::{x, y}`, and `super::…` paths that climb out of
/// `module`'s layer.
fn named_modules(module: &[String], code: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let word = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        if code[..i].ends_with('$')
            || code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    _ => {}
                }
                if c == ',' && depth == 0 {
                    named.insert(word(item.trim()));
                    item.clear();
                } else {
                    item.push(c);
                }
            }
            named.insert(word(item.trim()));
        } else {
            named.insert(word(rest));
        }
    }
    for (i, _) in code.match_indices("super::") {
        if code[..i].ends_with("super::")
            || code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let mut rest = &code[i..];
        let mut up = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            rest = r;
            up += 1;
        }
        if up >= module.len() {
            named.insert(word(rest));
        }
    }
    named.remove("");
    named
}

/// The crates `code` names with `x::` at the start of a path.
fn named_io_crates(code: &str) -> BTreeSet<&'static str> {
    let mut named = BTreeSet::new();
    for krate in IO_CRATES {
        let path = format!("{krate}::");
        for (i, _) in code.match_indices(&path) {
            let before = code[..i].chars().next_back();
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                named.insert(krate);
            }
        }
    }
    named
}

/// Every forbidden import in `src/`, as `file: what it names`.
fn violations(src: &Path) -> (usize, Vec<String>) {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut found = Vec::new();
    for file in &files {
        let module = module_of(src, file);
        let Some(layer) = module.first() else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read a source file");
        let code = production_code(&text);
        let names = named_modules(&module, &code);
        let shown = file.strip_prefix(src).unwrap_or(file).display();
        if layer != "cli" && names.contains("cli") {
            found.push(format!(
                "{shown}: names cli (only the composition root may)"
            ));
        }
        for rule in RULES.iter().filter(|r| r.layer == layer) {
            for name in names.iter().filter(|n| *n != layer) {
                let allowed = rule.only.is_none_or(|only| only.contains(&name.as_str()));
                if !allowed || rule.not.contains(&name.as_str()) {
                    found.push(format!("{shown}: {layer} names crate::{name}"));
                }
            }
            if !rule.io {
                for krate in named_io_crates(&code) {
                    found.push(format!("{shown}: {layer} names the I/O crate {krate}"));
                }
            }
        }
    }
    (files.len(), found)
}

#[test]
fn imports_go_only_the_allowed_directions() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (files, found) = violations(&src);
    assert!(files >= 100, "found only {files} source files under src/");
    assert!(
        found.is_empty(),
        "forbidden imports (see src/layers.rs for the rules):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checker_sees_the_paths_it_must_refuse() {
    let module = |m: &str| m.split("::").map(String::from).collect::<Vec<_>>();
    let code = production_code(
        "use crate::adapters::http;\n\
         use crate::{ports::Runtime, domain::id::SandboxId};\n\
         // use crate::cli::Cli;\n\
         let url = \"http://x\"; // crate::sched\n\
         fn f() { super::super::config::X; }\n\
         #[cfg(test)]\n\
         mod tests {\n\
             use crate::testing::FakeRuntime;\n\
         }\n\
         #[cfg(test)]\n\
         use crate::watch::Sink;\n\
         tokio::spawn(x); my_tokio::y; sqlx::query(q);\n",
    );
    let names = named_modules(&module("controller::guard"), &code);
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["adapters", "config", "domain", "ports"]
    );
    assert!(named_modules(&module("controller::guard::deep"), "super::super::x").is_empty());
    assert_eq!(
        named_io_crates(&code).into_iter().collect::<Vec<_>>(),
        ["sqlx", "tokio"]
    );
    let file = |p: &str| module_of(Path::new("/r/src"), &Path::new("/r/src").join(p));
    assert_eq!(file("controller/mod.rs"), ["controller"]);
    assert_eq!(file("controller/fence.rs"), ["controller", "fence"]);
    assert!(file("lib.rs").is_empty());
}
