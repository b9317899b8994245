//! The only `bindgen!` site: host-side bindings of the `gavel:rules/rule`
//! world. Everything outside `rules/` uses the re-exports in `rules/mod.rs`.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "rule",
});

pub use self::gavel::rules::lists::ListError;
pub use self::gavel::rules::signals::SignalError;
pub use self::gavel::rules::types::{AuthorStats, Event, Item, Level, Phase, Standing, Verdict};
