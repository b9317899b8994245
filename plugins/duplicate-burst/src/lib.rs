//! Duplicate burst: the same normalised text posted again and again by one
//! author within the host's duplicate window (copy-paste spam, brigading).
//! The host counts the duplicates (`snapshot.duplicate_count`); this rule
//! decides what a count means. Config: `hold_at` (default 3 copies),
//! `reject_at` (default 10).

use gavel_plugin_sdk::{Decision, PluginInfo, Rule, Snapshot, export_rule};

pub struct DuplicateBurst;

impl Rule for DuplicateBurst {
    fn info() -> PluginInfo {
        PluginInfo::new(
            "duplicate-burst",
            "1.0.0",
            "The same text posted many times by one author in a short window",
        )
    }

    fn evaluate(snapshot: &Snapshot) -> Result<Decision, String> {
        let hold_at: u32 = snapshot.config_or("hold_at", 3)?;
        let reject_at: u32 = snapshot.config_or("reject_at", 10)?;
        if hold_at == 0 || reject_at < hold_at {
            return Err(format!(
                "config: need 0 < hold_at ({hold_at}) <= reject_at ({reject_at})"
            ));
        }
        // duplicate_count counts the *other* copies; this item is one more.
        let copies = snapshot.duplicate_count.saturating_add(1);
        let score = (copies as f32 / reject_at as f32).min(1.0);
        if copies >= reject_at {
            return Ok(
                Decision::reject(format!("posted {copies} times in the duplicate window"))
                    .label("duplicate-burst")
                    .score(score),
            );
        }
        if copies >= hold_at {
            return Ok(Decision::hold(format!("posted {copies} times in the duplicate window"))
                .label("duplicate-burst")
                .score(score));
        }
        Ok(Decision::allow())
    }
}

export_rule!(DuplicateBurst);

#[cfg(test)]
mod tests {
    use super::*;
    use gavel_plugin_sdk::testing::{SnapshotBuilder, run_cases};

    #[test]
    fn shared_cases() {
        run_cases::<DuplicateBurst>(include_str!("../cases.json"));
    }

    #[test]
    fn inconsistent_thresholds_are_reported() {
        let s = SnapshotBuilder::new()
            .config("hold_at", "5")
            .config("reject_at", "2")
            .build();
        assert!(DuplicateBurst::evaluate(&s).unwrap_err().contains("hold_at"));
    }
}
