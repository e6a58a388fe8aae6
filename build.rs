//! Rebuilds when a migration is added or changed: `sqlx::migrate!` embeds
//! the `migrations/` directory at compile time, and without this a new file
//! alone would not trigger a rebuild.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
