//! Link wave: a link domain that many new accounts posted in a short
//! while, a spam wave no single item shows. The host counts, per link
//! domain, the distinct new authors who posted it in the last ten minutes
//! (the signal `domain-new-authors` this rule's sidecar declares); this
//! rule holds an item whose domains reached more than `max_new_authors`
//! (default 5).
//!
//! Config: `max_new_authors`; `signal` (default `domain-new-authors`: the
//! declared signal to read); `ignore_domains` (comma-separated domains
//! never judged, default a few sites everyone links to).

use gavel_plugin_sdk::signals::{self, SignalError};
use gavel_plugin_sdk::{Decision, PluginInfo, Rule, Snapshot, export_rule};

pub struct LinkWave;

/// Domains so widely shared that a burst of new accounts linking them is
/// no wave.
pub const DEFAULT_IGNORED: &[&str] = &["youtube.com", "wikipedia.org", "github.com"];

impl Rule for LinkWave {
    fn info() -> PluginInfo {
        PluginInfo::new(
            "link-wave",
            "1.0.0",
            "A link domain posted by many new accounts within minutes",
        )
    }

    fn evaluate(snapshot: &Snapshot) -> Result<Decision, String> {
        let max: u64 = snapshot.config_or("max_new_authors", 5)?;
        let signal = snapshot.config("signal").unwrap_or("domain-new-authors");
        let ignored = snapshot.config_list("ignore_domains", DEFAULT_IGNORED);
        let values = match signals::values(signal) {
            Ok(v) => v,
            Err(SignalError::Undeclared) => {
                return Err(format!(
                    "signal `{signal}` is not declared: add it to the sidecar's [[signals]]"
                ));
            }
        };
        let wave = values
            .iter()
            .filter(|(domain, _)| !ignored.iter().any(|i| i == domain))
            .max_by_key(|(_, n)| *n);
        match wave {
            Some((domain, authors)) if *authors > max => {
                let score = (*authors as f32 / (2 * max).max(1) as f32).min(1.0);
                Ok(Decision::hold(format!(
                    "{authors} accounts (signal {signal}) posted links to {domain} (more than {max})"
                ))
                .label("link-wave")
                .score(score))
            }
            _ => Ok(Decision::allow()),
        }
    }
}

export_rule!(LinkWave);

#[cfg(test)]
mod tests {
    use super::*;
    use gavel_plugin_sdk::Verdict;
    use gavel_plugin_sdk::testing::{SnapshotBuilder, run_cases};

    #[test]
    fn shared_cases() {
        run_cases::<LinkWave>(include_str!("../cases.json"));
    }

    #[test]
    fn the_largest_domain_decides_and_ignored_ones_never_do() {
        let s = SnapshotBuilder::new()
            .text("https://youtube.com/x https://cheap.example/y")
            .signal("domain-new-authors", "youtube.com", 50)
            .signal("domain-new-authors", "cheap.example", 6)
            .build();
        let d = LinkWave::evaluate(&s).unwrap();
        assert_eq!(d.verdict, Verdict::Hold);
        assert!(d.reason.contains("cheap.example"), "{}", d.reason);
    }

    #[test]
    fn an_undeclared_signal_is_an_error_naming_it() {
        let s = SnapshotBuilder::new().text("https://cheap.example").build();
        let e = LinkWave::evaluate(&s).unwrap_err();
        assert!(e.contains("domain-new-authors"), "{e}");
    }
}
