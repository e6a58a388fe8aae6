//! Rebuilds when a migration or a file of sql/ is added or changed:
//! `sqlx::migrate!` embeds the `migrations/` directory and
//! `adapters::postgres::schema` the files of `sql/` at compile time, and
//! without this a new file alone would not trigger a rebuild.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=sql");
}
