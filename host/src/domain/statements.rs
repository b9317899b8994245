//! Policies and statements of reasons (docs/ARCHITECTURE.md, "Statements
//! of reasons and appeals"): the `[[policies]]` a platform moderates by,
//! each mapped to a category of the DSA Transparency Database, and the
//! database's field set a restrictive decision is described in. Which
//! decisions get a statement, and what it says, is `crate::statements`'.

use serde::{Deserialize, Serialize};

/// The Transparency Database's `category` values (its `STATEMENT_CATEGORIES`).
pub const CATEGORIES: &[&str] = &[
    "STATEMENT_CATEGORY_ANIMAL_WELFARE",
    "STATEMENT_CATEGORY_CONSUMER_INFORMATION",
    "STATEMENT_CATEGORY_CYBER_VIOLENCE",
    "STATEMENT_CATEGORY_CYBER_VIOLENCE_AGAINST_WOMEN",
    "STATEMENT_CATEGORY_DATA_PROTECTION_AND_PRIVACY_VIOLATIONS",
    "STATEMENT_CATEGORY_ILLEGAL_OR_HARMFUL_SPEECH",
    "STATEMENT_CATEGORY_INTELLECTUAL_PROPERTY_INFRINGEMENTS",
    "STATEMENT_CATEGORY_NEGATIVE_EFFECTS_ON_CIVIC_DISCOURSE_OR_ELECTIONS",
    "STATEMENT_CATEGORY_NOT_SPECIFIED_NOTICE",
    "STATEMENT_CATEGORY_OTHER_VIOLATION_TC",
    "STATEMENT_CATEGORY_PROTECTION_OF_MINORS",
    "STATEMENT_CATEGORY_RISK_FOR_PUBLIC_SECURITY",
    "STATEMENT_CATEGORY_SCAMS_AND_FRAUD",
    "STATEMENT_CATEGORY_SELF_HARM",
    "STATEMENT_CATEGORY_UNSAFE_AND_PROHIBITED_PRODUCTS",
    "STATEMENT_CATEGORY_VIOLENCE",
];

/// The countries a statement's `territorial_scope` may name (EU and EEA).
pub const COUNTRIES: &[&str] = &[
    "AT", "BE", "BG", "CY", "CZ", "DE", "DK", "EE", "ES", "FI", "FR", "GR", "HR", "HU", "IE", "IS", "IT", "LI", "LT",
    "LU", "LV", "MT", "NL", "NO", "PL", "PT", "RO", "SE", "SI", "SK",
];

/// The policy a decision without one is stated under when no
/// `[statements] default_policy` is configured.
pub const FALLBACK_POLICY: &str = "terms-of-service";

/// Why content is restricted, as the Transparency Database has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionGround {
    /// Against the platform's terms and conditions.
    IncompatibleContent,
    /// Against the law.
    IllegalContent,
}

/// One `[[policies]]` entry: a rule of the platform that decisions are
/// taken under.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// What decisions, the API and exports call it: 1-64 of `a-z 0-9 - _ .`.
    pub id: String,
    pub title: String,
    /// The Transparency Database category ([`CATEGORIES`]).
    pub category: String,
    pub decision_ground: DecisionGround,
    /// The clause of the terms (incompatible content) or the law (illegal
    /// content) relied on; at most 500 characters.
    pub ground: String,
    /// Why content of this kind is restricted under that ground; the
    /// decision's own reason follows it. At most 1,000 characters.
    #[serde(default)]
    pub explanation: Option<String>,
    /// Where the terms or the law can be read.
    #[serde(default)]
    pub url: Option<String>,
    /// Rule labels stated under this policy: a rule's restrictive decision
    /// carrying one of them is stated under it (the first label that maps
    /// decides).
    #[serde(default)]
    pub labels: Vec<String>,
}

/// `[statements]`: what every statement of reasons shares, and appeals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatementsConfig {
    /// Countries the decisions apply in ([`COUNTRIES`]); empty leaves
    /// `territorial_scope` out.
    pub territorial_scope: Vec<String>,
    /// Actors (an event's `actor`) whose `report` events are notices of
    /// trusted flaggers (DSA Art. 22).
    pub trusted_flaggers: Vec<String>,
    /// The policy of a decision whose rule labels map to none and of a
    /// moderator's decision that names none; when unset, a built-in
    /// `terms-of-service` policy ("other violation of terms and conditions").
    pub default_policy: Option<String>,
    /// How long after a decision its statement may be appealed (DSA Art.
    /// 20: at least six months).
    pub appeal_window_days: u32,
}

impl Default for StatementsConfig {
    fn default() -> Self {
        StatementsConfig {
            territorial_scope: Vec::new(),
            trusted_flaggers: Vec::new(),
            default_policy: None,
            appeal_window_days: 183,
        }
    }
}

impl StatementsConfig {
    pub fn appeal_window_ms(&self) -> i64 {
        i64::from(self.appeal_window_days) * 86_400_000
    }
}

/// The built-in policy a decision falls back on.
pub fn fallback_policy() -> PolicyConfig {
    PolicyConfig {
        id: FALLBACK_POLICY.to_string(),
        title: "Terms of service".to_string(),
        category: "STATEMENT_CATEGORY_OTHER_VIOLATION_TC".to_string(),
        decision_ground: DecisionGround::IncompatibleContent,
        ground: "Terms of service".to_string(),
        explanation: None,
        url: None,
        labels: Vec::new(),
    }
}

/// The policies in force: the configured ones and the one decisions fall
/// back on.
#[derive(Debug, Clone, PartialEq)]
pub struct Policies {
    pub list: Vec<PolicyConfig>,
    pub default: PolicyConfig,
    pub statements: StatementsConfig,
}

impl Policies {
    pub fn new(list: &[PolicyConfig], statements: &StatementsConfig) -> Policies {
        let default = statements
            .default_policy
            .as_deref()
            .and_then(|id| list.iter().find(|p| p.id == id))
            .cloned()
            .unwrap_or_else(fallback_policy);
        Policies {
            list: list.to_vec(),
            default,
            statements: statements.clone(),
        }
    }

    /// The policy `id` names, if configured (the fallback's id included).
    pub fn get(&self, id: &str) -> Option<&PolicyConfig> {
        self.list
            .iter()
            .find(|p| p.id == id)
            .or((self.default.id == id).then_some(&self.default))
    }

    /// The policy the first mapped label names.
    pub fn for_labels<'a>(&self, labels: impl IntoIterator<Item = &'a str>) -> Option<&PolicyConfig> {
        labels
            .into_iter()
            .find_map(|l| self.list.iter().find(|p| p.labels.iter().any(|m| m == l)))
    }

    /// Checks `[[policies]]` and `[statements]` together.
    pub fn validate(list: &[PolicyConfig], statements: &StatementsConfig) -> Result<(), String> {
        let mut ids = std::collections::HashSet::new();
        let mut labels = std::collections::HashMap::new();
        for p in list {
            let ok_id = (1..=64).contains(&p.id.len())
                && p.id
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
            if !ok_id {
                return Err(format!(
                    "policies: id {:?} must be 1-64 of a-z, 0-9, '-', '_', '.'",
                    p.id
                ));
            }
            if !ids.insert(p.id.as_str()) {
                return Err(format!("policies: id {:?} is given twice", p.id));
            }
            if !CATEGORIES.contains(&p.category.as_str()) {
                return Err(format!(
                    "policies.{}: category {:?} is not a Transparency Database category (one of {})",
                    p.id,
                    p.category,
                    CATEGORIES.join(", ")
                ));
            }
            let bounded = |what: &str, s: &str, max: usize, required: bool| {
                let n = s.chars().count();
                if (required && s.trim().is_empty()) || n > max {
                    Err(format!("policies.{}: {what} must be 1-{max} characters", p.id))
                } else {
                    Ok(())
                }
            };
            bounded("title", &p.title, 200, true)?;
            bounded("ground", &p.ground, 500, true)?;
            if let Some(e) = &p.explanation {
                bounded("explanation", e, 1_000, true)?;
            }
            if let Some(url) = &p.url {
                let ok = (url.starts_with("https://") || url.starts_with("http://")) && url.len() <= 500;
                if !ok {
                    return Err(format!(
                        "policies.{}: url must be an http(s) URL of at most 500 characters",
                        p.id
                    ));
                }
            }
            for l in &p.labels {
                if let Some(other) = labels.insert(l.as_str(), p.id.as_str()) {
                    return Err(format!(
                        "policies: label {l:?} maps to both {other:?} and {:?}; a label states one policy",
                        p.id
                    ));
                }
            }
        }
        if let Some(d) = &statements.default_policy
            && !ids.contains(d.as_str())
        {
            return Err(format!(
                "statements.default_policy {d:?} is not the id of a [[policies]] entry"
            ));
        }
        for c in &statements.territorial_scope {
            if !COUNTRIES.contains(&c.as_str()) {
                return Err(format!(
                    "statements.territorial_scope: {c:?} is not an EU/EEA country code (one of {})",
                    COUNTRIES.join(", ")
                ));
            }
        }
        if statements.appeal_window_days < 183 {
            return Err("statements.appeal_window_days must be at least 183 (six months, DSA Art. 20(1))".to_string());
        }
        Ok(())
    }
}

/// Who took a decision, as the Transparency Database counts automation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum AutomatedDecision {
    /// A rule (or a classifier) alone.
    #[serde(rename = "AUTOMATED_DECISION_FULLY")]
    Fully,
    /// A moderator confirming what a rule did.
    #[serde(rename = "AUTOMATED_DECISION_PARTIALLY")]
    Partially,
    /// A moderator, with no rule behind the decision.
    #[serde(rename = "AUTOMATED_DECISION_NOT_AUTOMATED")]
    NotAutomated,
}

impl AutomatedDecision {
    /// As people read it.
    pub fn describe(self) -> &'static str {
        match self {
            AutomatedDecision::Fully => "fully automated",
            AutomatedDecision::Partially => "partially automated (a moderator confirmed a rule)",
            AutomatedDecision::NotAutomated => "not automated",
        }
    }
}

/// A statement of reasons in the Transparency Database's field set: the
/// body its API takes, one per decision. Optional fields absent from the
/// JSON are the database's "not given".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Statement {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision_visibility: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision_provision: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision_account: Option<String>,
    /// `DECISION_GROUND_INCOMPATIBLE_CONTENT` or `DECISION_GROUND_ILLEGAL_CONTENT`.
    pub decision_ground: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision_ground_reference_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub illegal_content_legal_ground: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub illegal_content_explanation: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incompatible_content_ground: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incompatible_content_explanation: Option<String>,
    pub content_type: Vec<String>,
    pub category: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub territorial_scope: Option<Vec<String>>,
    /// `YYYY-MM-DD` (UTC): when the content was submitted.
    pub content_date: String,
    /// `YYYY-MM-DD` (UTC): when the decision was taken.
    pub application_date: String,
    /// `YYYY-MM-DD`: when a timed restriction ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_date_visibility_restriction: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_date_account_restriction: Option<String>,
    pub decision_facts: String,
    /// `SOURCE_VOLUNTARY`, `SOURCE_ARTICLE_16` or `SOURCE_TRUSTED_FLAGGER`.
    pub source_type: String,
    /// `Yes` or `No`.
    pub automated_detection: String,
    pub automated_decision: AutomatedDecision,
    /// gavel's id of the decision: `ITEM_ID-VERSION`, stable and unique.
    pub puid: String,
}

/// A UTC date as the Transparency Database writes it (`YYYY-MM-DD`).
pub fn date(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d").to_string())
        .unwrap_or_else(|| "1970-01-01".to_string())
}

/// A UTC time to the minute, for reasons and facts (`2026-12-04 17:30 UTC`).
pub fn date_time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// The latest time a restriction may end: the Transparency Database takes
/// end dates up to 2038-01-01.
pub const LATEST_END_MS: i64 = 2_145_916_800_000;

/// `s` cut to at most `max` characters, with an ellipsis when cut.
pub fn bounded(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max - 1).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(id: &str, labels: &[&str]) -> PolicyConfig {
        PolicyConfig {
            id: id.into(),
            title: "Spam".into(),
            category: "STATEMENT_CATEGORY_SCAMS_AND_FRAUD".into(),
            decision_ground: DecisionGround::IncompatibleContent,
            ground: "Terms §4".into(),
            explanation: None,
            url: Some("https://example.com/terms".into()),
            labels: labels.iter().map(|l| l.to_string()).collect(),
        }
    }

    #[test]
    fn policies_are_checked_together() {
        let ok = StatementsConfig::default();
        assert!(Policies::validate(&[policy("spam", &["spam"])], &ok).is_ok());
        let e = Policies::validate(&[policy("spam", &["x"]), policy("scam", &["x"])], &ok).unwrap_err();
        assert!(e.contains("label \"x\""), "{e}");
        let mut bad = policy("spam", &[]);
        bad.category = "SPAM".into();
        assert!(Policies::validate(&[bad], &ok).unwrap_err().contains("category"));
        assert!(Policies::validate(&[policy("Spam!", &[])], &ok).is_err());
        let unknown_default = StatementsConfig {
            default_policy: Some("nope".into()),
            ..StatementsConfig::default()
        };
        assert!(Policies::validate(&[], &unknown_default).is_err());
        let short = StatementsConfig {
            appeal_window_days: 30,
            ..StatementsConfig::default()
        };
        assert!(Policies::validate(&[], &short).unwrap_err().contains("183"));
        let scope = StatementsConfig {
            territorial_scope: vec!["US".into()],
            ..StatementsConfig::default()
        };
        assert!(Policies::validate(&[], &scope).is_err());
    }

    #[test]
    fn labels_map_to_policies_and_the_default_is_the_fallback() {
        let p = Policies::new(&[policy("spam", &["spam", "link-spam"])], &StatementsConfig::default());
        assert_eq!(
            p.for_labels(["other", "link-spam"]).map(|p| p.id.as_str()),
            Some("spam")
        );
        assert!(p.for_labels(["other"]).is_none());
        assert_eq!(p.default.id, FALLBACK_POLICY);
        assert!(p.get(FALLBACK_POLICY).is_some());
    }

    #[test]
    fn text_is_bounded_and_dates_are_utc_days() {
        assert_eq!(bounded("abcdef", 4), "abc…");
        assert_eq!(bounded("abc", 4), "abc");
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(1_767_225_599_999), "2025-12-31");
    }
}
