//! Lists: named, typed sets of entries that moderators edit at runtime
//! (`/v1/lists`), each edit an immutable version with its sha256 digest,
//! author, reason and time.
//!
//! # Layout
//!
//! - `entries`: the kinds, each entry's canonical form, the limits, the
//!   digest and the diff between two versions.
//! - `matcher`: a version compiled once into the matcher of its kind.
//! - `served`: the compiled version of every list this process serves,
//!   swapped on an edit, and the poll that picks up other processes' edits.

mod entries;
mod matcher;
mod served;

pub use entries::{Diff, Entry, EntryError, ListKind, Renote, canonical, diff, digest, normalise};
pub use matcher::{CompiledList, Matcher, WrongKind};
pub use served::{Served, ServedLists};

use serde::{Deserialize, Serialize};

/// `[lists]`: the limits of lists and how often a process looks for edits
/// made by others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListsConfig {
    /// Lists per deployment; creating one more is refused with 422.
    pub max_lists: usize,
    /// Entries per list; more is refused with 413.
    pub max_entries: usize,
    /// Characters per entry value; a longer one is refused with 422.
    pub max_entry_chars: usize,
    /// Characters per entry note.
    pub max_note_chars: usize,
    /// The body of `PUT` and `PATCH /v1/lists/{name}` (a list is bigger
    /// than an item); a bigger body is refused with 413.
    pub max_body_bytes: usize,
    /// Bytes one compiled pattern may take (the `regex` crate's own
    /// default); a pattern over it is refused with 422 naming it.
    pub pattern_size_limit: usize,
    /// Bytes the compiled set of a `patterns` list may take, and the lazy
    /// DFA's cache per search: matching stays linear in the text and
    /// bounded in memory.
    pub pattern_set_size_limit: usize,
    /// How often every process compares the versions it serves with the
    /// store's (an edit is served everywhere within about this long).
    pub poll_interval_ms: u64,
}

impl Default for ListsConfig {
    fn default() -> Self {
        ListsConfig {
            max_lists: 1_000,
            max_entries: 100_000,
            max_entry_chars: 1_024,
            max_note_chars: 256,
            max_body_bytes: 16 << 20,
            pattern_size_limit: 10 << 20,
            pattern_set_size_limit: 64 << 20,
            poll_interval_ms: 250,
        }
    }
}
