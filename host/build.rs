//! `sqlx::migrate!` embeds `migrations/` at compile time, but on stable
//! Rust nothing tells Cargo that the crate depends on that directory: a
//! migration added or edited alone would leave a binary without it.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
