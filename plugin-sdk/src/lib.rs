//! Write gavel moderation rules in Rust.
//!
//! A rule is a type implementing [`Rule`], exported with [`export_rule!`] and
//! built for `wasm32-wasip2`. It judges a [`Snapshot`] (the item, its
//! counters, the author's recent history and account [`Standing`], the
//! sidecar config) and returns a [`Decision`]. It has no network, no files
//! and no clock: everything it may judge is in the snapshot.
//!
//! ```
//! use gavel_plugin_sdk::{export_rule, Decision, Phase, PluginInfo, Rule, Snapshot};
//!
//! /// Holds posts that shout in capitals.
//! pub struct Shouting;
//!
//! impl Rule for Shouting {
//!     fn info() -> PluginInfo {
//!         PluginInfo::new("shouting", "0.1.0", "Holds posts written in capitals")
//!             .phases(&[Phase::Async])
//!     }
//!
//!     fn evaluate(snapshot: &Snapshot) -> Result<Decision, String> {
//!         let min_letters: usize = snapshot.config_or("min_letters", 20)?;
//!         let text = &snapshot.item.text;
//!         let letters = text.chars().filter(|c| c.is_alphabetic()).count();
//!         let upper = text.chars().filter(|c| c.is_uppercase()).count();
//!         if letters >= min_letters && upper * 10 >= letters * 9 {
//!             return Ok(Decision::hold("written in capitals").label("shouting").score(0.7));
//!         }
//!         Ok(Decision::allow())
//!     }
//! }
//!
//! export_rule!(Shouting);
//!
//! // Unit tests run natively with plain `cargo test`, no wasm needed:
//! use gavel_plugin_sdk::testing::SnapshotBuilder;
//! use gavel_plugin_sdk::Verdict;
//!
//! let loud = SnapshotBuilder::new().text("THIS IS THE BEST OFFER YOU WILL EVER SEE").build();
//! assert_eq!(Shouting::evaluate(&loud).unwrap().verdict, Verdict::Hold);
//! let calm = SnapshotBuilder::new().text("a calm sentence about gardening").build();
//! assert_eq!(Shouting::evaluate(&calm).unwrap().verdict, Verdict::Allow);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2` and drop the
//! `.wasm` file into gavel's plugin directory.
//!
//! # Layout
//!
//! - [`bindings`]: the generated bindings of the `gavel:rules` WIT contract.
//! - `helpers` (re-exported at the root): typed accessors on [`Snapshot`]
//!   and builders for [`Decision`] and [`PluginInfo`].
//! - [`log`]: the host's log import, captured by the harness when native.
//! - [`spec`] (feature `spec`): snapshots and test cases as JSON.
//! - [`lists`]: the lists moderators edit at runtime, consulted through
//!   the host (`find_terms`, `match_patterns`, `match_domain`, `contains`,
//!   `in_cidrs`).
//! - [`signals`]: entity signals the rule's sidecar declares (counts across
//!   items by link domain, IP, author, ...), as of the snapshot.
//! - [`text`] (feature `text`): the word folding whole-word matching uses,
//!   shared by the host's `terms` lists and the banned-terms example.
//! - [`testing`] (native targets only): the test harness; with feature
//!   `spec` it also runs JSON case files, the same files the host's
//!   integration tests run through the real runtime.

/// The generated bindings of the `gavel:rules/rule` world. Rule authors use
/// the re-exports at the crate root instead.
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "rule",
        pub_export_macro: true,
        export_macro_name: "__export_rule_world",
        default_bindings_module: "gavel_plugin_sdk::bindings",
        additional_derives: [PartialEq],
    });
}

mod helpers;
pub mod lists;
pub mod log;
pub mod signals;
#[cfg(feature = "spec")]
pub mod spec;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;
#[cfg(feature = "text")]
pub mod text;

pub use bindings::gavel::rules::types::{
    AuthorStats, Decision, Event, Item, Level, Phase, PluginInfo, Snapshot, Standing, Verdict,
};
/// Re-exported so rule crates need no direct dependency on wit-bindgen.
pub use wit_bindgen;

/// A moderation rule. Implement it on a unit struct and export it with
/// [`export_rule!`].
pub trait Rule {
    /// Name, version, description and phases; read once when the plugin loads.
    fn info() -> PluginInfo;

    /// Judges one snapshot. Return `Err` only when the rule cannot decide
    /// (for example, a malformed config value); the host records it with
    /// outcome `error` and lets the other rules decide.
    fn evaluate(snapshot: &Snapshot) -> Result<Decision, String>;
}

/// Exports a [`Rule`] as the component's `info` and `evaluate` functions.
/// Use it exactly once per plugin crate.
#[macro_export]
macro_rules! export_rule {
    ($rule:ty) => {
        // Exported from the component only: a native build (unit tests, the
        // benchmarks' native baseline) calls `Rule` directly, and several
        // rules can then link into one binary.
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct GavelRuleExport;

            impl $crate::bindings::Guest for GavelRuleExport {
                fn info() -> $crate::PluginInfo {
                    <$rule as $crate::Rule>::info()
                }

                fn evaluate(
                    input: $crate::Snapshot,
                ) -> ::core::result::Result<$crate::Decision, ::std::string::String> {
                    <$rule as $crate::Rule>::evaluate(&input)
                }
            }

    $crate::bindings::__export_rule_world!(GavelRuleExport with_types_in $crate::bindings);
        };
    };
}
