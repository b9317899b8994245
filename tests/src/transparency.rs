//! The DSA Transparency Database's validation of a statement of reasons,
//! restated rule by rule from the Commission's own validator (the Laravel
//! rules of `StatementStoreRequest` and, for batches,
//! `StatementMultipleAPIController` / `GroupedSubmissionsService` in
//! github.com/digital-services-act/transparency-database), over the JSON as
//! sent. It shares nothing with gavel's serializer: the enumerations are
//! the database's keys, copied from its `Statement` model.

use serde_json::{Map, Value};

const DECISION_VISIBILITIES: &[&str] = &[
    "DECISION_VISIBILITY_CONTENT_REMOVED",
    "DECISION_VISIBILITY_CONTENT_DISABLED",
    "DECISION_VISIBILITY_CONTENT_DEMOTED",
    "DECISION_VISIBILITY_CONTENT_AGE_RESTRICTED",
    "DECISION_VISIBILITY_CONTENT_INTERACTION_RESTRICTED",
    "DECISION_VISIBILITY_CONTENT_LABELLED",
    "DECISION_VISIBILITY_OTHER",
];
const DECISION_MONETARIES: &[&str] = &[
    "DECISION_MONETARY_SUSPENSION",
    "DECISION_MONETARY_TERMINATION",
    "DECISION_MONETARY_OTHER",
];
const DECISION_PROVISIONS: &[&str] = &[
    "DECISION_PROVISION_PARTIAL_SUSPENSION",
    "DECISION_PROVISION_TOTAL_SUSPENSION",
    "DECISION_PROVISION_PARTIAL_TERMINATION",
    "DECISION_PROVISION_TOTAL_TERMINATION",
];
const DECISION_ACCOUNTS: &[&str] = &["DECISION_ACCOUNT_SUSPENDED", "DECISION_ACCOUNT_TERMINATED"];
const ACCOUNT_TYPES: &[&str] = &["ACCOUNT_TYPE_BUSINESS", "ACCOUNT_TYPE_PRIVATE"];
const DECISION_GROUNDS: &[&str] = &[
    "DECISION_GROUND_ILLEGAL_CONTENT",
    "DECISION_GROUND_INCOMPATIBLE_CONTENT",
];
const INCOMPATIBLE_CONTENT_ILLEGALS: &[&str] = &["Yes", "No"];
const CONTENT_TYPES: &[&str] = &[
    "CONTENT_TYPE_APP",
    "CONTENT_TYPE_AUDIO",
    "CONTENT_TYPE_IMAGE",
    "CONTENT_TYPE_PRODUCT",
    "CONTENT_TYPE_SYNTHETIC_MEDIA",
    "CONTENT_TYPE_TEXT",
    "CONTENT_TYPE_VIDEO",
    "CONTENT_TYPE_OTHER",
];
const CATEGORIES: &[&str] = &[
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
const EUROPEAN_COUNTRY_CODES: &[&str] = &[
    "AT", "BE", "BG", "CY", "CZ", "DE", "DK", "EE", "ES", "FI", "FR", "GR", "HR", "HU", "IE", "IS", "IT", "LI", "LT",
    "LU", "LV", "MT", "NL", "NO", "PL", "PT", "RO", "SE", "SI", "SK",
];
const SOURCE_TYPES: &[&str] = &[
    "SOURCE_ARTICLE_16",
    "SOURCE_TRUSTED_FLAGGER",
    "SOURCE_TYPE_OTHER_NOTIFICATION",
    "SOURCE_VOLUNTARY",
];
const AUTOMATED_DETECTIONS: &[&str] = &["Yes", "No"];
const AUTOMATED_DECISIONS: &[&str] = &[
    "AUTOMATED_DECISION_FULLY",
    "AUTOMATED_DECISION_PARTIALLY",
    "AUTOMATED_DECISION_NOT_AUTOMATED",
];

/// Laravel's `required`: present, not null, not an empty (or blank) string,
/// not an empty array.
fn present(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.trim().is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    }
}

/// Laravel's `max:N` on a string: at most N characters.
fn max_chars(v: Option<&Value>, n: usize) -> bool {
    match v {
        Some(Value::String(s)) => s.chars().count() <= n,
        None | Some(Value::Null) => true,
        Some(_) => false,
    }
}

/// `in:` a list (each element, for an array), `null` allowed when `nullable`.
fn is_in(v: Option<&Value>, list: &[&str], nullable: bool) -> bool {
    match v {
        None => true,
        Some(Value::Null) => nullable,
        Some(Value::String(s)) => list.contains(&s.as_str()),
        Some(Value::Array(a)) => a.iter().all(|e| e.as_str().is_some_and(|s| list.contains(&s))),
        Some(_) => false,
    }
}

/// `date_format:Y-m-d` with bounds (inclusive), compared as dates.
fn date_between(v: Option<&Value>, after_or_equal: Option<&str>, before_or_equal: &str) -> bool {
    let Some(s) = v.and_then(Value::as_str) else {
        return false;
    };
    let b = s.as_bytes();
    let shape = b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit());
    if !shape {
        return false;
    }
    let (m, d): (u32, u32) = (s[5..7].parse().unwrap(), s[8..10].parse().unwrap());
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return false;
    }
    after_or_equal.is_none_or(|a| s >= a) && s <= before_or_equal
}

/// The errors the database would answer `statement` with (empty: accepted).
pub fn statement_errors(statement: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let Some(s) = statement.as_object() else {
        return vec!["the statement is not an object".into()];
    };
    let get = |k: &str| s.get(k);
    let mut check = |ok: bool, what: &str| {
        if !ok {
            errors.push(what.to_string());
        }
    };
    let any_of = |keys: &[&str]| keys.iter().any(|k| present(get(k)));
    // The four restriction fields: arrays/enumerations, at least one given.
    check(
        get("decision_visibility").is_none_or(|v| v.is_array() || v.is_null()),
        "decision_visibility must be an array",
    );
    check(
        is_in(get("decision_visibility"), DECISION_VISIBILITIES, true),
        "decision_visibility: not in the list",
    );
    check(
        is_in(get("decision_monetary"), DECISION_MONETARIES, true),
        "decision_monetary: not in the list",
    );
    check(
        is_in(get("decision_provision"), DECISION_PROVISIONS, true),
        "decision_provision: not in the list",
    );
    check(
        is_in(get("decision_account"), DECISION_ACCOUNTS, true),
        "decision_account: not in the list",
    );
    check(
        any_of(&[
            "decision_visibility",
            "decision_monetary",
            "decision_provision",
            "decision_account",
        ]),
        "one of decision_visibility, decision_monetary, decision_provision, decision_account is required",
    );
    let visibility_other = get("decision_visibility")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|v| v == "DECISION_VISIBILITY_OTHER"));
    if visibility_other {
        check(
            present(get("decision_visibility_other")),
            "decision_visibility_other is required",
        );
        check(
            max_chars(get("decision_visibility_other"), 500),
            "decision_visibility_other: max 500",
        );
    }
    if get("decision_monetary").and_then(Value::as_str) == Some("DECISION_MONETARY_OTHER") {
        check(
            present(get("decision_monetary_other")),
            "decision_monetary_other is required",
        );
        check(
            max_chars(get("decision_monetary_other"), 500),
            "decision_monetary_other: max 500",
        );
    }
    check(
        is_in(get("account_type"), ACCOUNT_TYPES, true),
        "account_type: not in the list",
    );
    // The ground, and the fields each ground requires.
    check(present(get("decision_ground")), "decision_ground is required");
    check(
        is_in(get("decision_ground"), DECISION_GROUNDS, false),
        "decision_ground: not in the list",
    );
    if let Some(url) = get("decision_ground_reference_url").filter(|v| !v.is_null()) {
        let ok = url.as_str().is_some_and(|u| {
            (u.starts_with("http://") || u.starts_with("https://")) && u.len() > 8 && !u.contains(' ')
        });
        check(ok, "decision_ground_reference_url must be a URL");
        check(max_chars(Some(url), 500), "decision_ground_reference_url: max 500");
    }
    match get("decision_ground").and_then(Value::as_str) {
        Some("DECISION_GROUND_ILLEGAL_CONTENT") => {
            check(
                present(get("illegal_content_legal_ground")),
                "illegal_content_legal_ground is required",
            );
            check(
                max_chars(get("illegal_content_legal_ground"), 500),
                "illegal_content_legal_ground: max 500",
            );
            check(
                present(get("illegal_content_explanation")),
                "illegal_content_explanation is required",
            );
            check(
                max_chars(get("illegal_content_explanation"), 2000),
                "illegal_content_explanation: max 2000",
            );
        }
        Some("DECISION_GROUND_INCOMPATIBLE_CONTENT") => {
            check(
                present(get("incompatible_content_ground")),
                "incompatible_content_ground is required",
            );
            check(
                max_chars(get("incompatible_content_ground"), 500),
                "incompatible_content_ground: max 500",
            );
            check(
                present(get("incompatible_content_explanation")),
                "incompatible_content_explanation is required",
            );
            check(
                max_chars(get("incompatible_content_explanation"), 2000),
                "incompatible_content_explanation: max 2000",
            );
            check(
                is_in(
                    get("incompatible_content_illegal"),
                    INCOMPATIBLE_CONTENT_ILLEGALS,
                    false,
                ),
                "incompatible_content_illegal: not in the list",
            );
        }
        _ => {}
    }
    // What the content is.
    check(
        get("content_type").is_some_and(Value::is_array) && present(get("content_type")),
        "content_type is required (an array)",
    );
    check(
        is_in(get("content_type"), CONTENT_TYPES, false),
        "content_type: not in the list",
    );
    let content_other = get("content_type")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|v| v == "CONTENT_TYPE_OTHER"));
    if content_other {
        check(present(get("content_type_other")), "content_type_other is required");
        check(max_chars(get("content_type_other"), 500), "content_type_other: max 500");
    }
    check(present(get("category")), "category is required");
    check(is_in(get("category"), CATEGORIES, false), "category: not in the list");
    if let Some(v) = get("category_addition") {
        check(
            v.is_array() && is_in(Some(v), CATEGORIES, false),
            "category_addition: not in the list",
        );
    }
    if let Some(v) = get("territorial_scope").filter(|v| !v.is_null()) {
        check(
            v.is_array() && is_in(Some(v), EUROPEAN_COUNTRY_CODES, false),
            "territorial_scope: not EU/EEA country codes",
        );
    }
    // Dates.
    check(
        date_between(get("content_date"), Some("2000-01-01"), "2038-01-01"),
        "content_date: Y-m-d from 2000-01-01 to 2038-01-01",
    );
    check(
        date_between(get("application_date"), Some("2020-01-01"), "2038-01-01"),
        "application_date: Y-m-d from 2020-01-01 to 2038-01-01",
    );
    for end in [
        "end_date_account_restriction",
        "end_date_monetary_restriction",
        "end_date_service_restriction",
        "end_date_visibility_restriction",
    ] {
        if get(end).is_some_and(|v| !v.is_null()) {
            check(
                date_between(get(end), None, "2038-01-01"),
                &format!("{end}: Y-m-d up to 2038-01-01"),
            );
        }
    }
    // The facts, the source, automation, the id.
    check(present(get("decision_facts")), "decision_facts is required");
    check(max_chars(get("decision_facts"), 5000), "decision_facts: max 5000");
    check(present(get("source_type")), "source_type is required");
    check(
        is_in(get("source_type"), SOURCE_TYPES, false),
        "source_type: not in the list",
    );
    if get("source_type").and_then(Value::as_str) != Some("SOURCE_VOLUNTARY") {
        check(max_chars(get("source_identity"), 500), "source_identity: max 500");
    }
    check(present(get("automated_detection")), "automated_detection is required");
    check(
        is_in(get("automated_detection"), AUTOMATED_DETECTIONS, false),
        "automated_detection: not in the list",
    );
    check(present(get("automated_decision")), "automated_decision is required");
    check(
        is_in(get("automated_decision"), AUTOMATED_DECISIONS, false),
        "automated_decision: not in the list",
    );
    check(present(get("puid")), "puid is required");
    check(max_chars(get("puid"), 500), "puid: max 500");
    check(
        get("puid")
            .and_then(Value::as_str)
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')),
        "puid: ^[a-zA-Z0-9-_]+$",
    );
    errors
}

/// The errors the batch endpoint would answer a `{"statements": [...]}`
/// body with: 1-100 statements, each valid, no `puid` twice.
pub fn batch_errors(body: &Value) -> Vec<String> {
    let Some(list) = body.get("statements").and_then(Value::as_array) else {
        return vec!["statements is required (an array)".into()];
    };
    let mut errors = Vec::new();
    if !(1..=100).contains(&list.len()) {
        errors.push(format!("statements must hold 1-100, got {}", list.len()));
    }
    let mut puids = std::collections::HashSet::new();
    for (i, s) in list.iter().enumerate() {
        errors.extend(statement_errors(s).into_iter().map(|e| format!("statement_{i}: {e}")));
        if let Some(p) = s.get("puid").and_then(Value::as_str)
            && !puids.insert(p.to_string())
        {
            errors.push(format!("statement_{i}: puid {p} given twice"));
        }
    }
    errors
}

/// An object with one field changed, for negative cases.
pub fn with(statement: &Value, key: &str, value: Value) -> Value {
    let mut m: Map<String, Value> = statement.as_object().cloned().unwrap_or_default();
    if value.is_null() {
        m.remove(key);
    } else {
        m.insert(key.to_string(), value);
    }
    Value::Object(m)
}

/// Runs `gavel export statements` (the real binary) on the store at
/// `database_url`, continuing after `after`: the batch bodies it wrote, one
/// per line, and the cursor it ended with; `Err` with its standard error
/// when it fails.
pub fn export_statements(database_url: &str, after: Option<&str>) -> Result<(Vec<Value>, String), String> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("statements.ndjson");
    let mut cmd = std::process::Command::new(crate::servers::gavel_binary());
    cmd.args(["export", "statements", "--database-url", database_url, "--out"])
        .arg(&out);
    if let Some(after) = after {
        cmd.args(["--after", after]);
    }
    let run = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    if !run.status.success() {
        return Err(stderr);
    }
    let cursor = stderr
        .split("--after '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .unwrap_or_else(|| panic!("no cursor in {stderr:?}"))
        .to_string();
    let bodies = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    Ok((bodies, cursor))
}
