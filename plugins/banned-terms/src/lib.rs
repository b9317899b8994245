//! Banned terms, matched on whole words ignoring case and accents (`Fóo`
//! matches `foo`, `foobar` does not; a term may be several words).
//!
//! The terms are the `terms` list named by config `list` (default
//! `banned-terms`), which moderators edit at runtime (`/v1/lists`, the
//! console): the decision records the list version it used. While the
//! host has no list of that name, the sidecar config's `terms`
//! (comma-separated) are used instead. `verdict` sets what a match means
//! (`flag`, `hold` or `reject`; default `reject`).

use gavel_plugin_sdk::lists::{self, ListError};
use gavel_plugin_sdk::{Decision, Phase, PluginInfo, Rule, Snapshot, Verdict, export_rule};
// The host's `terms` lists fold text with the same function.
use gavel_plugin_sdk::text::fold_words;

pub struct BannedTerms;

/// The list consulted unless config `list` names another.
const DEFAULT_LIST: &str = "banned-terms";

/// The sidecar `terms` found in `text`: the fallback while the host has
/// no list.
fn configured_terms(snapshot: &Snapshot, text: &str) -> Vec<String> {
    let terms: Vec<Vec<String>> = snapshot
        .config_list("terms", &[])
        .iter()
        .map(|t| fold_words(t))
        .filter(|t| !t.is_empty())
        .collect();
    if terms.is_empty() {
        return Vec::new();
    }
    let words = fold_words(text);
    terms
        .iter()
        .filter(|term| words.windows(term.len()).any(|w| w == term.as_slice()))
        .map(|term| term.join(" "))
        .collect()
}

impl Rule for BannedTerms {
    fn info() -> PluginInfo {
        PluginInfo::new(
            "banned-terms",
            "1.1.0",
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
        let list = snapshot.config("list").unwrap_or(DEFAULT_LIST);
        let text = &snapshot.item.text;
        let hits = match lists::find_terms(list, text) {
            Ok(hits) => hits,
            Err(ListError::Unknown) => configured_terms(snapshot, text),
            Err(ListError::WrongKind(kind)) => return Err(format!("list `{list}` holds {kind}, not terms")),
            Err(ListError::Invalid(why)) => return Err(format!("list `{list}`: {why}")),
        };
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
    fn without_the_hosts_list_the_sidecar_terms_count() {
        // Natively there is no host: every list is unknown.
        let s = SnapshotBuilder::new()
            .text("Free... money!")
            .config("terms", "free money")
            .build();
        assert_eq!(BannedTerms::evaluate(&s).unwrap().verdict, Verdict::Reject);
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
