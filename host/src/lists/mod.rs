//! Lists: named, typed sets of entries that moderators edit at runtime
//! (`/v1/lists`), each edit an immutable version with its sha256 digest,
//! author, reason and time.
//!
//! # Layout
//!
//! The kinds, each entry's canonical form, the limits, the digest and the
//! diff between two versions are the domain's (`crate::domain::lists`),
//! re-exported here.
//!
//! - `matcher`: a version compiled once into the matcher of its kind.
//! - `served`: the compiled version of every list this process serves,
//!   swapped on an edit, and the poll that picks up other processes' edits.

mod matcher;
mod served;

pub use crate::domain::lists::{
    Diff, Entry, EntryError, ListKind, ListsConfig, Renote, canonical, diff, digest, normalise,
};
pub use matcher::{CompiledList, Matcher, WrongKind};
pub use served::{Served, ServedLists};
