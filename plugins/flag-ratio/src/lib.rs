//! Flag ratio with a quorum. Hiding a post because of a handful of flags
//! lets a small group suspend anything (the false-suspension case); ignoring
//! flags lets abuse stay up. This rule acts only once enough people flagged
//! (`quorum`, default 5 flags + reports), and then on the share of flags
//! among all reactions: `hold_ratio` (default 0.3) holds the item for review,
//! `flag_ratio` (default 0.1) surfaces it to moderators.

use gavel_plugin_sdk::{Decision, PluginInfo, Rule, Snapshot, export_rule};

pub struct FlagRatio;

impl Rule for FlagRatio {
    fn info() -> PluginInfo {
        PluginInfo::new(
            "flag-ratio",
            "1.0.0",
            "Holds items that many people flag relative to how many endorse them",
        )
    }

    fn evaluate(snapshot: &Snapshot) -> Result<Decision, String> {
        let quorum: u64 = snapshot.config_or("quorum", 5)?;
        let hold_ratio: f64 = snapshot.config_or("hold_ratio", 0.3)?;
        let flag_ratio: f64 = snapshot.config_or("flag_ratio", 0.1)?;

        let flags = snapshot.counter("flag") + snapshot.counter("report");
        let endorsements = snapshot.counter("upvote");
        if flags < quorum {
            return Ok(Decision::allow());
        }
        let ratio = flags as f64 / (flags + endorsements) as f64;
        let reason = format!("{flags} flags against {endorsements} upvotes ({:.0}%)", ratio * 100.0);
        if ratio >= hold_ratio {
            return Ok(Decision::hold(reason).label("community-flags").score(ratio as f32));
        }
        if ratio >= flag_ratio {
            return Ok(Decision::flag(reason).label("community-flags").score(ratio as f32));
        }
        Ok(Decision::allow())
    }
}

export_rule!(FlagRatio);

#[cfg(test)]
mod tests {
    use super::*;
    use gavel_plugin_sdk::Verdict;
    use gavel_plugin_sdk::testing::{SnapshotBuilder, run_cases};

    #[test]
    fn shared_cases() {
        run_cases::<FlagRatio>(include_str!("../cases.json"));
    }

    #[test]
    fn reports_count_as_flags() {
        let s = SnapshotBuilder::new().counter("flag", 3).counter("report", 3).build();
        assert_eq!(FlagRatio::evaluate(&s).unwrap().verdict, Verdict::Hold);
    }
}
