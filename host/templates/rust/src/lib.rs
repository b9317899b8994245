//! {{name}}: holds posts that mention a watched phrase, for a moderator to
//! look at. Config (sidecar `[config]`): `words`, the phrases to watch,
//! comma-separated (default "free money, click here").

use gavel_plugin_sdk::{Decision, Phase, PluginInfo, Rule, Snapshot, export_rule};

pub struct {{Type}};

const DEFAULT_WORDS: &[&str] = &["free money", "click here"];

impl Rule for {{Type}} {
    fn info() -> PluginInfo {
        PluginInfo::new("{{name}}", "0.1.0", "Holds posts that mention a watched phrase").phases(&[Phase::Async])
    }

    fn evaluate(snapshot: &Snapshot) -> Result<Decision, String> {
        let words = snapshot.config_list("words", DEFAULT_WORDS);
        let text = snapshot.item.text.to_lowercase();
        match words.iter().find(|w| text.contains(&w.to_lowercase())) {
            Some(word) => Ok(Decision::hold(format!("mentions {word:?}"))
                .label("watch-word")
                .score(0.6)),
            None => Ok(Decision::allow()),
        }
    }
}

export_rule!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;
    use gavel_plugin_sdk::Verdict;
    use gavel_plugin_sdk::testing::{SnapshotBuilder, run_cases};

    #[test]
    fn a_watched_phrase_is_held_with_its_label() {
        let s = SnapshotBuilder::new().text("Click HERE for a prize").build();
        let d = {{Type}}::evaluate(&s).unwrap();
        assert_eq!(d.verdict, Verdict::Hold);
        assert_eq!(d.labels, ["watch-word"]);
    }

    #[test]
    fn the_phrases_come_from_config() {
        let s = SnapshotBuilder::new().text("free money!").config("words", "tomato").build();
        assert_eq!({{Type}}::evaluate(&s).unwrap().verdict, Verdict::Allow);
    }

    // The same cases run through the real sandbox with `gavel plugin test`.
    #[test]
    fn shared_cases() {
        run_cases::<{{Type}}>(include_str!("../cases.json"));
    }
}
