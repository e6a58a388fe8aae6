//! The tests docs/security.md cites as the proof of each fix exist: a
//! table that names a test renamed or removed would claim a proof that no
//! longer runs. Checked on the text: each backticked `module::…::name`
//! whose last part reads like a test's name (four words or more, all
//! lowercase) must be a `fn name` in the module's file, under
//! `tests/integration/` or, for `controller::tests::…`, under `src/`.

use std::path::{Path, PathBuf};

/// Where a cited path's module lives, if it names a test module: the files
/// to look in (a module is `NAME.rs` or a folder `NAME/`).
fn module_files(root: &Path, path: &[&str]) -> Vec<PathBuf> {
    let module = &path[..path.len() - 1];
    let base = if module.first() == Some(&"controller") {
        root.join("src").join(module.join("/"))
    } else {
        root.join("tests/integration").join(module.join("/"))
    };
    let mut files = vec![base.with_extension("rs")];
    if let Ok(dir) = std::fs::read_dir(&base) {
        files.extend(dir.flatten().map(|e| e.path()));
    }
    files.into_iter().filter(|f| f.is_file()).collect()
}

/// Backticked spans of `text` that look like a test's path:
/// `a::b::a_name_of_four_words`.
fn cited(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            let parts: Vec<&str> = span.split("::").collect();
            parts.len() >= 2
                && parts.iter().all(|p| {
                    !p.is_empty()
                        && p.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                })
                && parts[parts.len() - 1].matches('_').count() >= 3
        })
        .collect()
}

#[test]
fn every_test_docs_security_md_cites_exists() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/security.md")).expect("docs/security.md");
    let cites = cited(&doc);
    assert!(cites.len() >= 20, "too few cited tests found: {cites:?}");
    let missing: Vec<&str> = cites
        .into_iter()
        .filter(|cite| {
            let path: Vec<&str> = cite.split("::").collect();
            let name = format!("fn {}(", path[path.len() - 1]);
            !module_files(&root, &path)
                .iter()
                .any(|f| std::fs::read_to_string(f).is_ok_and(|text| text.contains(&name)))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/security.md cites tests that do not exist (renamed or removed? cite the test that proves the fix now): {missing:?}"
    );
}

#[test]
fn a_cited_path_is_a_backticked_module_path_ending_in_a_test_like_name() {
    let text = "see `a::b_c_d_e` and `domain::attach`, `x_y_z_w` and `A::b_c_d_e`, `m::n::one_two_three_four`";
    assert_eq!(cited(text), ["a::b_c_d_e", "m::n::one_two_three_four"]);
}
