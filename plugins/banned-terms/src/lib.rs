//! Banned terms from the sidecar config (`terms`, comma-separated; a term
//! may be several words). Matching is on whole words, ignoring case and
//! accents (`Fóo` matches `foo`, `foobar` does not). `verdict` sets what a
//! match means (`flag`, `hold` or `reject`; default `reject`).

use gavel_plugin_sdk::{Decision, Phase, PluginInfo, Rule, Snapshot, Verdict, export_rule};
// The host's `terms` lists fold text with the same function.
use gavel_plugin_sdk::text::fold_words;

pub struct BannedTerms;

impl Rule for BannedTerms {
    fn info() -> PluginInfo {
        PluginInfo::new(
            "banned-terms",
            "1.0.0",
            "Terms the community bans, matched on whole words",
        )
        // Cheap enough to run inline at submission, and again after edits.
        .phases(&[Phase::Sync, Phase::Async])
    }

    fn evaluate(snapshot: &Snapshot) -> Result<Decision, String> {
        let verdict: Verdict = snapshot.config_or("verdict", Verdict::Reject)?;
        if verdict == Verdict::Allow {
            return Err("config `verdict` must be flag, hold or reject".into());
        }
        let terms: Vec<Vec<String>> = snapshot
            .config_list("terms", &[])
            .iter()
            .map(|t| fold_words(t))
            .filter(|t| !t.is_empty())
            .collect();
        if terms.is_empty() {
            return Ok(Decision::allow());
        }
        let words = fold_words(&snapshot.item.text);
        let hits: Vec<String> = terms
            .iter()
            .filter(|term| words.windows(term.len()).any(|w| w == term.as_slice()))
            .map(|term| term.join(" "))
            .collect();
        if hits.is_empty() {
            return Ok(Decision::allow());
        }
        Ok(Decision::new(verdict, format!("banned terms: {}", hits.join(", ")))
            .label("banned-term")
            .score(1.0))
    }
}

export_rule!(BannedTerms);

#[cfg(test)]
mod tests {
    use super::*;
    use gavel_plugin_sdk::testing::{SnapshotBuilder, run_cases};

    #[test]
    fn shared_cases() {
        run_cases::<BannedTerms>(include_str!("../cases.json"));
    }

    #[test]
    fn folding() {
        assert_eq!(
            fold_words("Ça VA, Señor? ｆｕｌｌ-width"),
            vec!["ca", "va", "senor", "full", "width"]
        );
    }

    #[test]
    fn allow_is_not_a_valid_verdict() {
        let s = SnapshotBuilder::new()
            .text("x")
            .config("terms", "x")
            .config("verdict", "allow")
            .build();
        assert!(BannedTerms::evaluate(&s).is_err());
    }
}
