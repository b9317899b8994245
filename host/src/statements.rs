//! Statements of reasons (DSA Art. 17), derived from the record: every
//! restrictive transition of an item (rejected, held for review, deleted by
//! a moderator) is one decision and has one statement, in the DSA
//! Transparency Database's field set ([`crate::domain::statements`]). The
//! statement is a function of the stored transition, the decisions made
//! before it and the configured policies, so the API, the webhook event and
//! `gavel export statements` always say the same thing.
//!
//! Who decided is read from the record, not claimed: a transition by the
//! rules, the system or a classifier is fully automated; a moderator's is
//! partially automated when an automated action it confirms stands behind
//! it (the moderator left in force a `flag`, `hold` or `reject` the rules
//! applied before), and not automated otherwise.

use crate::domain::statements::{AutomatedDecision, DecisionGround, Policies, PolicyConfig, Statement, bounded, date};
use crate::domain::{Actor, DecisionPhase, EventKind, ItemStatus, Mode, Outcome, Verdict};
use crate::store::{DecisionRecord, ItemDetails, TransitionRecord};
use serde::Serialize;

/// The code behind an automated decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RuleRef {
    pub plugin: String,
    pub version: String,
    /// sha256 of the component, hex.
    pub digest: String,
}

/// A statement with what gavel knows of its decision.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ItemStatement {
    pub item_id: String,
    /// The item version the decision made (`puid` is `ITEM_ID-VERSION`).
    pub item_version: i64,
    pub status: ItemStatus,
    pub actor: Actor,
    /// The policy the decision is stated under.
    pub policy: String,
    /// The rules whose actions the decision applied or confirmed.
    pub rules: Vec<RuleRef>,
    /// When the decision was taken (ms since the epoch).
    pub decided_at: i64,
    /// Until when it may be appealed (ms); `null` for a decision that
    /// cannot be (a deletion is final).
    pub appealable_until: Option<i64>,
    pub statement: Statement,
}

/// Statuses a decision restricts content with.
pub fn is_restrictive(status: ItemStatus) -> bool {
    matches!(
        status,
        ItemStatus::Rejected | ItemStatus::HeldForReview | ItemStatus::Deleted
    )
}

/// Whether a transition is a decision that gets a statement: a restriction
/// by anyone but the author (who deletes their own content).
pub fn has_statement(t: &TransitionRecord) -> bool {
    is_restrictive(t.to_status) && t.actor != Actor::Author
}

/// An automated action: an applied, enforced `flag`, `hold` or `reject`
/// that ran to completion.
fn is_action(d: &DecisionRecord) -> bool {
    d.applied
        && d.mode == Mode::Enforce
        && d.outcome == Outcome::Ok
        && matches!(d.verdict, Some(Verdict::Flag | Verdict::Hold | Verdict::Reject))
}

/// The statements of an item's decisions, oldest first.
pub fn for_item(details: &ItemDetails, policies: &Policies) -> Vec<ItemStatement> {
    details
        .transitions
        .iter()
        .filter(|t| has_statement(t))
        .map(|t| derive(details, t, policies))
        .collect()
}

/// The statement of transition `t` of `details`' item.
pub fn derive(details: &ItemDetails, t: &TransitionRecord, policies: &Policies) -> ItemStatement {
    let item = &details.item;
    // The actions taken before the decision: an evaluation judges the
    // version before the one its transition makes, so every action on a
    // lower version came first; the submission's rules judge version 1,
    // which their own transition (from `received`) makes.
    let creation = t.from_status == ItemStatus::Received;
    let before: Vec<&DecisionRecord> = details
        .decisions
        .iter()
        .filter(|d| is_action(d))
        .filter(|d| {
            d.item_version < t.version || (creation && d.item_version == t.version && d.phase == DecisionPhase::Sync)
        })
        .collect();
    let (automated_decision, behind): (AutomatedDecision, Vec<&DecisionRecord>) = if t.actor.is_automated() {
        // The actions of the newest evaluation before the transition that
        // set this very status.
        let setting: Vec<&DecisionRecord> = before
            .iter()
            .copied()
            .filter(|d| d.verdict.map(ItemStatus::for_verdict) == Some(t.to_status))
            .collect();
        let newest = setting.iter().map(|d| d.item_version).max();
        let behind = setting.into_iter().filter(|d| Some(d.item_version) == newest).collect();
        (AutomatedDecision::Fully, behind)
    } else {
        // The actions a moderator leaving the item in this status confirms.
        let overturned = t.to_status.overturned_verdicts();
        let confirmed: Vec<&DecisionRecord> = before
            .iter()
            .copied()
            .filter(|d| d.verdict.is_some_and(|v| !overturned.contains(&v)))
            .collect();
        match confirmed.is_empty() {
            true => (AutomatedDecision::NotAutomated, confirmed),
            false => (AutomatedDecision::Partially, confirmed),
        }
    };
    let policy: &PolicyConfig = t
        .policy
        .as_deref()
        .and_then(|id| policies.get(id))
        .or_else(|| policies.for_labels(behind.iter().flat_map(|d| d.labels.iter().map(String::as_str))))
        .unwrap_or(&policies.default);
    let mut rules: Vec<RuleRef> = behind
        .iter()
        .map(|d| RuleRef {
            plugin: d.plugin.clone(),
            version: d.plugin_version.clone(),
            digest: d.plugin_digest.clone(),
        })
        .collect();
    rules.dedup();
    // A notice: someone reported the item before the decision.
    let reporters: Vec<&str> = details
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Report && e.created_at <= t.created_at)
        .map(|e| e.actor.as_str())
        .collect();
    let source_type = if reporters
        .iter()
        .any(|r| policies.statements.trusted_flaggers.iter().any(|f| f == r))
    {
        "SOURCE_TRUSTED_FLAGGER"
    } else if !reporters.is_empty() {
        "SOURCE_ARTICLE_16"
    } else {
        "SOURCE_VOLUNTARY"
    };
    let detected = t.actor.is_automated() || !before.is_empty();
    let facts = facts(t, automated_decision, &rules, &behind);
    let ground = Ground::of(policy, &t.reason);
    let visibility = match t.to_status {
        // Held: hidden until a human decides.
        ItemStatus::HeldForReview => "DECISION_VISIBILITY_CONTENT_DISABLED",
        _ => "DECISION_VISIBILITY_CONTENT_REMOVED",
    };
    let appealable = matches!(t.to_status, ItemStatus::Rejected | ItemStatus::HeldForReview);
    ItemStatement {
        item_id: item.id.clone(),
        item_version: t.version,
        status: t.to_status,
        actor: t.actor,
        policy: policy.id.clone(),
        rules,
        decided_at: t.created_at,
        appealable_until: appealable.then(|| t.created_at + policies.statements.appeal_window_ms()),
        statement: Statement {
            decision_visibility: Some(vec![visibility.to_string()]),
            decision_provision: None,
            decision_account: None,
            decision_ground: ground.decision_ground,
            decision_ground_reference_url: ground.reference_url,
            illegal_content_legal_ground: ground.illegal.0,
            illegal_content_explanation: ground.illegal.1,
            incompatible_content_ground: ground.incompatible.0,
            incompatible_content_explanation: ground.incompatible.1,
            content_type: vec!["CONTENT_TYPE_TEXT".to_string()],
            category: policy.category.clone(),
            territorial_scope: territorial_scope(policies),
            content_date: date(item.created_at),
            application_date: date(t.created_at),
            end_date_visibility_restriction: t.ends_at.map(date),
            end_date_account_restriction: None,
            decision_facts: facts,
            source_type: source_type.to_string(),
            automated_detection: if detected { "Yes" } else { "No" }.to_string(),
            automated_decision,
            puid: puid(&item.id, t.version),
        },
    }
}

/// The fields a statement takes from its policy: the ground, the clause
/// or law relied on, and the explanation (the policy's, then the
/// decision's own reason), in the pair of fields its ground calls for.
struct Ground {
    decision_ground: String,
    reference_url: Option<String>,
    illegal: (Option<String>, Option<String>),
    incompatible: (Option<String>, Option<String>),
}

impl Ground {
    fn of(policy: &PolicyConfig, reason: &str) -> Ground {
        let why = policy.explanation.as_deref().unwrap_or(&policy.title);
        let fields = (
            Some(bounded(&policy.ground, 500)),
            Some(bounded(&format!("{why} {}", sentence(reason)), 2_000)),
        );
        let (decision_ground, illegal, incompatible) = match policy.decision_ground {
            DecisionGround::IncompatibleContent => ("DECISION_GROUND_INCOMPATIBLE_CONTENT", (None, None), fields),
            DecisionGround::IllegalContent => ("DECISION_GROUND_ILLEGAL_CONTENT", fields, (None, None)),
        };
        Ground {
            decision_ground: decision_ground.to_string(),
            reference_url: policy.url.clone(),
            illegal,
            incompatible,
        }
    }
}

/// `territorial_scope`: the configured countries, or left out.
fn territorial_scope(policies: &Policies) -> Option<Vec<String>> {
    let scope = &policies.statements.territorial_scope;
    (!scope.is_empty()).then(|| scope.clone())
}

/// The statement's unique id: `ITEM_ID-VERSION` (item ids are UUIDs, so
/// it matches `^[A-Za-z0-9_-]+$`).
pub fn puid(item_id: &str, version: i64) -> String {
    let clean: String = item_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{clean}-{version}")
}

/// `s` ending in a full stop.
fn sentence(s: &str) -> String {
    let s = s.trim();
    if s.ends_with(['.', '!', '?']) {
        s.to_string()
    } else {
        format!("{s}.")
    }
}

/// `decision_facts`: what was decided, why, and by which code or person.
fn facts(t: &TransitionRecord, who: AutomatedDecision, rules: &[RuleRef], behind: &[&DecisionRecord]) -> String {
    let what = match t.to_status {
        ItemStatus::Rejected => "The content was rejected and is not shown.",
        ItemStatus::HeldForReview => "The content is hidden until a moderator has reviewed it.",
        _ => "The content was removed.",
    };
    let mut out = format!("{what} Reason: {}", sentence(&t.reason));
    let code = |r: &RuleRef| {
        format!(
            "{} {} (sha256 {})",
            r.plugin,
            r.version,
            &r.digest[..r.digest.len().min(12)]
        )
    };
    let reasons: Vec<String> = behind
        .iter()
        .filter(|d| !d.reason.is_empty())
        .map(|d| format!("{}: {}", d.plugin, sentence(&d.reason)))
        .collect();
    match who {
        AutomatedDecision::Fully if !rules.is_empty() => {
            let names: Vec<String> = rules.iter().map(code).collect();
            out.push_str(&format!(" Decided automatically by the rule {}.", names.join(", ")));
        }
        AutomatedDecision::Fully => out.push_str(" Decided automatically."),
        AutomatedDecision::Partially => {
            let names: Vec<String> = rules.iter().map(code).collect();
            out.push_str(&format!(
                " Detected by the rule {}; a moderator reviewed and confirmed the decision.",
                names.join(", ")
            ));
        }
        AutomatedDecision::NotAutomated => out.push_str(" Decided by a moderator."),
    }
    // A rule's own transition already carries its reason; a moderator's
    // says what the rules behind it said.
    if !reasons.is_empty() && who == AutomatedDecision::Partially {
        out.push_str(&format!(" The rules said: {}", reasons.join(" ")));
    }
    bounded(&out, 5_000)
}

/// A statement of an account decision: an author's state moved to (or a
/// moderator set) a tier that restricts them.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct AccountStatement {
    pub client: String,
    pub author: String,
    /// The author's version the decision made.
    pub version: i64,
    /// The account state it set.
    pub status: String,
    pub actor: crate::domain::standing::AuthorActor,
    /// The policy it is stated under: `[statements] default_policy` (an
    /// account decision names none yet).
    pub policy: String,
    pub decided_at: i64,
    pub statement: Statement,
}

/// Whether an author transition is a decision with a statement: into a
/// tier whose effect restricts the author, as a change of state or a
/// moderator's (re)decision; an expiry that leaves the state as it was is
/// not a new decision.
pub fn account_has_statement(
    t: &crate::store::AuthorTransitionRecord,
    standing: &crate::domain::standing::StandingPolicy,
) -> bool {
    use crate::domain::standing::{AuthorActor, TierEffect};
    let restricts = standing
        .tier(&t.to_status)
        .is_some_and(|tier| tier.effect != TierEffect::None);
    restricts && (t.from_status != t.to_status || t.actor == AuthorActor::Moderator)
}

/// The statement of author transition `t` of `record`.
pub fn derive_account(
    record: &crate::store::AuthorRecord,
    t: &crate::store::AuthorTransitionRecord,
    standing: &crate::domain::standing::StandingPolicy,
    policies: &Policies,
) -> AccountStatement {
    use crate::domain::standing::{AuthorActor, TierEffect};
    let effect = standing.tier(&t.to_status).map(|tier| tier.effect).unwrap_or_default();
    // What the strikes alone would have set when the decision was taken.
    let strikes_restrict = standing.tier_for(t.strikes).effect != TierEffect::None;
    let automated_decision = match t.actor {
        AuthorActor::Rules => AutomatedDecision::Fully,
        AuthorActor::Moderator if strikes_restrict => AutomatedDecision::Partially,
        AuthorActor::Moderator => AutomatedDecision::NotAutomated,
    };
    let policy = &policies.default;
    let (provision, account, what) = match effect {
        TierEffect::Reject => (
            None,
            Some("DECISION_ACCOUNT_SUSPENDED"),
            "The account is suspended: its new content is rejected.",
        ),
        _ => (
            Some("DECISION_PROVISION_PARTIAL_SUSPENSION"),
            None,
            "The account is restricted: its new content is held until a moderator has reviewed it.",
        ),
    };
    let who = match automated_decision {
        AutomatedDecision::Fully => format!(
            "Decided automatically: {} strikes from the rules' decisions on the account's content reach the state {}.",
            t.strikes, t.to_status
        ),
        AutomatedDecision::Partially => format!(
            "Decided by a moderator; the account's {} strikes from the rules' decisions also reach a restriction.",
            t.strikes
        ),
        AutomatedDecision::NotAutomated => "Decided by a moderator.".to_string(),
    };
    let facts = bounded(&format!("{what} Reason: {} {who}", sentence(&t.reason)), 5_000);
    let ground = Ground::of(policy, &t.reason);
    AccountStatement {
        client: record.client.clone(),
        author: record.author.clone(),
        version: t.version,
        status: t.to_status.clone(),
        actor: t.actor,
        policy: policy.id.clone(),
        decided_at: t.created_at,
        statement: Statement {
            decision_visibility: None,
            decision_provision: provision.map(str::to_string),
            decision_account: account.map(str::to_string),
            decision_ground: ground.decision_ground,
            decision_ground_reference_url: ground.reference_url,
            illegal_content_legal_ground: ground.illegal.0,
            illegal_content_explanation: ground.illegal.1,
            incompatible_content_ground: ground.incompatible.0,
            incompatible_content_explanation: ground.incompatible.1,
            content_type: vec!["CONTENT_TYPE_TEXT".to_string()],
            category: policy.category.clone(),
            territorial_scope: territorial_scope(policies),
            // The account's content began then.
            content_date: date(record.first_seen.min(t.created_at)),
            application_date: date(t.created_at),
            end_date_visibility_restriction: None,
            end_date_account_restriction: t.ends_at.map(date),
            decision_facts: facts,
            source_type: "SOURCE_VOLUNTARY".to_string(),
            automated_detection: if t.strikes > 0.0 { "Yes" } else { "No" }.to_string(),
            automated_decision,
            puid: account_puid(&record.client, &record.author, t.version),
        },
    }
}

/// An account decision's unique id: `acct-` and a hash of client and
/// author (which may hold any character), then the author's version.
pub fn account_puid(client: &str, author: &str, version: i64) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(client.as_bytes());
    h.update([0]);
    h.update(author.as_bytes());
    format!("acct-{}-{version}", &hex::encode(h.finalize())[..24])
}
