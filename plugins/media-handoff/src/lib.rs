//! Media hand-off. Text rules cannot judge an image or a video; an external
//! classifier can, but it answers later, by callback. This rule defers items
//! that carry media (a non-empty `context` value under `media_key`, default
//! `media`) to the provider named `provider` (default `classifier`, as
//! configured in the host's `[providers.NAME]`). Items without media are
//! allowed: the other rules judge their text.

use gavel_plugin_sdk::{Decision, PluginInfo, Rule, Snapshot, export_rule};

pub struct MediaHandoff;

impl Rule for MediaHandoff {
    fn info() -> PluginInfo {
        PluginInfo::new(
            "media-handoff",
            "1.0.0",
            "Hands items with images or video to an external classifier",
        )
    }

    fn evaluate(snapshot: &Snapshot) -> Result<Decision, String> {
        let media_key = snapshot.config("media_key").unwrap_or("media");
        let provider = snapshot.config("provider").unwrap_or("classifier");
        match snapshot.context(media_key).map(str::trim) {
            Some(media) if !media.is_empty() => {
                Ok(Decision::defer(provider, format!("media to classify: {media}")).label("media"))
            }
            _ => Ok(Decision::allow()),
        }
    }
}

export_rule!(MediaHandoff);

#[cfg(test)]
mod tests {
    use super::*;
    use gavel_plugin_sdk::testing::run_cases;

    #[test]
    fn shared_cases() {
        run_cases::<MediaHandoff>(include_str!("../cases.json"));
    }
}
