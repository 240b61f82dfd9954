//! Rebuild when a migration is added or edited: `sqlx::migrate!` embeds the
//! files at compile time, and cargo would not otherwise notice new ones.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
