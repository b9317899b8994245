//! What gavel decides, as pure functions of their inputs: the status a
//! submission is stored in, and what an evaluation does to an item. The
//! HTTP handlers and the worker only gather the inputs, call these, and
//! commit the result with the store's conditional writes.

use super::{Actor, ItemStatus, Verdict, can_transition};

super::string_enum! {
    /// Why a transition happened (the audit row's `cause`).
    pub enum Cause("cause") {
        /// Stored, waiting for the asynchronous rules.
        Submitted = "submitted",
        /// A sync-phase rule decided at submission.
        SyncRules = "sync_rules",
        /// The same text from the same author, too often.
        DuplicateText = "duplicate_text",
        /// Evaluation lags: new content waits hidden until judged.
        Degraded = "degraded",
        /// The author's account state decides at submission.
        AuthorStanding = "author_standing",
        /// The asynchronous rules decided.
        Evaluation = "evaluation",
        /// A moderator decided.
        Moderation = "moderation",
        /// A moderator decided an appeal of an earlier decision.
        Appeal = "appeal",
        /// A restriction a moderator set until a time reached it.
        RestrictionEnded = "restriction_ended",
        /// The author deleted the item.
        AuthorDeleted = "author_deleted",
        /// An external classifier's answer.
        ProviderCallback = "provider_callback",
        /// An external classifier never answered.
        ProviderTimeout = "provider_timeout",
    }
}

/// What the submission path knows when it decides.
#[derive(Debug, Clone, PartialEq)]
pub struct SubmissionInputs {
    /// The most severe verdict of the enforcing sync-phase rules, if any decided.
    pub sync_verdict: Option<Verdict>,
    /// Which sync rules drove it (for the audit row).
    pub sync_reason: String,
    /// Earlier items by this author with the same normalised text, in the window.
    pub duplicates: i64,
    /// This many copies (including this one) hold the item.
    pub duplicate_hold_at: u32,
    /// Evaluation is far behind (the queue lag is over `degraded_lag_ms`).
    pub degraded: bool,
    /// What the author's account state does to new submissions, if anything.
    pub standing: Option<StandingEffect>,
}

/// What an author's account state does to a new submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandingEffect {
    /// `hold` or `reject`.
    pub verdict: Verdict,
    /// The account state that decided, e.g. `restricted`.
    pub state: String,
}

/// The status a submission is stored in, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct SubmissionDecision {
    pub status: ItemStatus,
    pub cause: Cause,
    pub reason: String,
    /// The verdict of the submission-time checks; later evaluations never
    /// settle below it.
    pub sync_verdict: Option<Verdict>,
    /// Whether the asynchronous rules still judge it (not after a rejection).
    pub needs_eval: bool,
    /// The duplicate-text check held it.
    pub duplicate: bool,
}

/// Decides a submission: a rejection or hold by the sync rules, the
/// duplicate-text check or the author's standing is final at once; a
/// degraded queue holds new content; otherwise it waits for the rules.
pub fn submission(i: &SubmissionInputs) -> SubmissionDecision {
    let duplicate = i.duplicates + 1 >= i64::from(i.duplicate_hold_at.max(1));
    let standing = i.standing.as_ref().map(|s| s.verdict);
    let sync_verdict = [i.sync_verdict, duplicate.then_some(Verdict::Hold), standing]
        .into_iter()
        .flatten()
        .filter(|v| *v != Verdict::Defer)
        .max();
    let (status, cause, reason) = match sync_verdict {
        // The rules' own reason wins where they were the strictest.
        Some(v @ (Verdict::Reject | Verdict::Hold)) if i.sync_verdict == Some(v) => {
            (ItemStatus::for_verdict(v), Cause::SyncRules, i.sync_reason.clone())
        }
        Some(v @ (Verdict::Reject | Verdict::Hold)) if standing == Some(v) => {
            let state = i.standing.as_ref().map_or("", |s| s.state.as_str());
            let reason = format!(
                "the author's account is {state}: new content is {}",
                ItemStatus::for_verdict(v)
            );
            (ItemStatus::for_verdict(v), Cause::AuthorStanding, reason)
        }
        Some(Verdict::Hold) => (
            ItemStatus::HeldForReview,
            Cause::DuplicateText,
            format!(
                "same text from this author {} times in the duplicate window",
                i.duplicates + 1
            ),
        ),
        _ if i.degraded => (
            ItemStatus::HeldForReview,
            Cause::Degraded,
            "evaluation queue is behind; held until judged".to_string(),
        ),
        _ => (ItemStatus::PendingScan, Cause::Submitted, String::new()),
    };
    SubmissionDecision {
        status,
        cause,
        reason,
        sync_verdict,
        // A rejection at submission is final for automation; anything else
        // gets the full asynchronous judgement.
        needs_eval: status != ItemStatus::Rejected,
        duplicate,
    }
}

/// What a provider already said about an item's current content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderAnswer {
    pub provider: String,
    pub verdict: Verdict,
}

/// What an evaluation knows when it decides.
#[derive(Debug, Clone, PartialEq)]
pub struct EvaluationInputs<'a> {
    pub status: ItemStatus,
    /// A moderator decided: nothing automated applies any more.
    pub manual: bool,
    /// The submission-time verdict; the rules never settle below it.
    pub sync_verdict: Option<Verdict>,
    /// The most severe verdict of the enforcing async rules, if any decided.
    pub verdict: Option<Verdict>,
    /// With a `defer` verdict: the provider the rules named.
    pub provider: Option<&'a str>,
    /// Which rules drove the verdict (for the audit row).
    pub reason: String,
    /// Whether this deployment has a provider of that name configured.
    pub provider_known: bool,
    /// Answers providers gave for the item's current content.
    pub answers: &'a [ProviderAnswer],
    /// The provider of the item's outstanding request for its current
    /// content, if one is still waiting.
    pub waiting_on: Option<&'a str>,
}

/// What an evaluation does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvaluationDecision {
    /// The verdict that counts: the rules', never below the submission's,
    /// with a provider's answer standing in for a repeated deferral.
    pub verdict: Verdict,
    /// The status that verdict means.
    pub target: ItemStatus,
    /// The status to move to, when the item changes (`None`: record only).
    pub to: Option<ItemStatus>,
    /// With `to = awaiting_provider`: the provider to ask.
    pub handoff: Option<String>,
    pub reason: String,
    /// Whether the decisions count towards the status (not after a moderator).
    pub applied: bool,
}

/// Decides what an evaluation does. A provider's answer for unchanged
/// content stands: a rule deferring again gets that answer instead of a new
/// request; while a request for the current content is outstanding, it is
/// not sent again. A deferral to a provider this deployment does not know
/// goes to a human.
pub fn evaluation(i: &EvaluationInputs<'_>) -> EvaluationDecision {
    let combined = i
        .verdict
        .into_iter()
        .chain(i.sync_verdict)
        .max()
        .unwrap_or(Verdict::Allow);
    let mut reason = i.reason.clone();
    let mut verdict = combined;
    let mut handoff = None;
    if combined == Verdict::Defer {
        let provider = i.provider.unwrap_or_default();
        let answered = i.answers.iter().find(|a| a.provider == provider);
        match answered {
            Some(a) => {
                // The answer for this content stands; only an edit asks again.
                verdict = [a.verdict, i.sync_verdict.unwrap_or(Verdict::Allow)]
                    .into_iter()
                    .max()
                    .unwrap_or(a.verdict);
                reason = format!("{reason}; {provider} already answered {} for this content", a.verdict);
            }
            None if !i.provider_known => {
                verdict = Verdict::Hold;
                reason = format!("{reason}; provider {provider:?} is not configured, so a human decides");
            }
            None => handoff = Some(provider.to_string()),
        }
    }
    let target = ItemStatus::for_verdict(verdict);
    // Deferring again while a request for this content is outstanding is
    // the same request: nothing changes. Otherwise (the content changed
    // since) it is a new request that supersedes the outstanding one.
    let same_request = target == ItemStatus::AwaitingProvider
        && i.status == ItemStatus::AwaitingProvider
        && i.waiting_on == handoff.as_deref();
    let changes = (i.status != target || target == ItemStatus::AwaitingProvider) && !same_request;
    let to = (!i.manual && changes && can_transition(i.status, target, Actor::Rules)).then_some(target);
    EvaluationDecision {
        verdict,
        target,
        handoff: handoff.filter(|_| to == Some(ItemStatus::AwaitingProvider)),
        to,
        reason,
        applied: !i.manual,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> SubmissionInputs {
        SubmissionInputs {
            sync_verdict: None,
            sync_reason: String::new(),
            duplicates: 0,
            duplicate_hold_at: 5,
            degraded: false,
            standing: None,
        }
    }

    #[test]
    fn a_plain_submission_waits_for_the_rules() {
        let d = submission(&inputs());
        assert_eq!(
            (d.status, d.cause, d.needs_eval),
            (ItemStatus::PendingScan, Cause::Submitted, true)
        );
    }

    #[test]
    fn sync_rejections_are_final_and_sync_holds_keep_their_reason() {
        let reject = submission(&SubmissionInputs {
            sync_verdict: Some(Verdict::Reject),
            sync_reason: "reject by banned-terms".into(),
            ..inputs()
        });
        assert_eq!(
            (reject.status, reject.cause, reject.needs_eval),
            (ItemStatus::Rejected, Cause::SyncRules, false)
        );
        assert_eq!(reject.reason, "reject by banned-terms");
        let hold = submission(&SubmissionInputs {
            sync_verdict: Some(Verdict::Hold),
            sync_reason: "hold by x".into(),
            duplicates: 9,
            ..inputs()
        });
        assert_eq!((hold.status, hold.cause), (ItemStatus::HeldForReview, Cause::SyncRules));
        assert!(hold.duplicate);
    }

    #[test]
    fn duplicates_hold_at_the_threshold() {
        assert!(
            !submission(&SubmissionInputs {
                duplicates: 3,
                ..inputs()
            })
            .duplicate
        );
        let d = submission(&SubmissionInputs {
            duplicates: 4,
            ..inputs()
        });
        assert_eq!((d.status, d.cause), (ItemStatus::HeldForReview, Cause::DuplicateText));
        assert_eq!(d.sync_verdict, Some(Verdict::Hold));
    }

    #[test]
    fn degraded_mode_holds_only_what_would_wait() {
        let d = submission(&SubmissionInputs {
            degraded: true,
            ..inputs()
        });
        assert_eq!((d.status, d.cause), (ItemStatus::HeldForReview, Cause::Degraded));
        assert_eq!(d.sync_verdict, None, "degraded is not a verdict");
        let r = submission(&SubmissionInputs {
            degraded: true,
            sync_verdict: Some(Verdict::Reject),
            ..inputs()
        });
        assert_eq!(r.cause, Cause::SyncRules);
    }

    #[test]
    fn a_sync_defer_is_ignored_and_standing_decides_when_strictest() {
        let d = submission(&SubmissionInputs {
            sync_verdict: Some(Verdict::Defer),
            ..inputs()
        });
        assert_eq!(d.status, ItemStatus::PendingScan);
        let s = submission(&SubmissionInputs {
            standing: Some(StandingEffect {
                verdict: Verdict::Reject,
                state: "suspended".into(),
            }),
            sync_verdict: Some(Verdict::Hold),
            ..inputs()
        });
        assert_eq!((s.status, s.cause), (ItemStatus::Rejected, Cause::AuthorStanding));
        assert!(s.reason.contains("suspended"), "{}", s.reason);
    }

    fn eval<'a>(status: ItemStatus, verdict: Option<Verdict>) -> EvaluationInputs<'a> {
        EvaluationInputs {
            status,
            manual: false,
            sync_verdict: None,
            verdict,
            provider: None,
            reason: "by rules".into(),
            provider_known: true,
            answers: &[],
            waiting_on: None,
        }
    }

    #[test]
    fn the_strictest_verdict_moves_the_item_once() {
        let d = evaluation(&eval(ItemStatus::PendingScan, Some(Verdict::Hold)));
        assert_eq!(d.to, Some(ItemStatus::HeldForReview));
        let same = evaluation(&eval(ItemStatus::HeldForReview, Some(Verdict::Hold)));
        assert_eq!(same.to, None, "no change is a record, not a transition");
        let none = evaluation(&eval(ItemStatus::PendingScan, None));
        assert_eq!(none.to, Some(ItemStatus::Visible));
    }

    #[test]
    fn never_below_the_submission_verdict_and_never_over_a_moderator() {
        let d = evaluation(&EvaluationInputs {
            sync_verdict: Some(Verdict::Hold),
            ..eval(ItemStatus::HeldForReview, Some(Verdict::Allow))
        });
        assert_eq!((d.verdict, d.to), (Verdict::Hold, None));
        let m = evaluation(&EvaluationInputs {
            manual: true,
            ..eval(ItemStatus::Visible, Some(Verdict::Reject))
        });
        assert_eq!((m.to, m.applied), (None, false));
    }

    #[test]
    fn a_provider_answer_for_unchanged_content_stands() {
        let answers = [ProviderAnswer {
            provider: "classifier".into(),
            verdict: Verdict::Allow,
        }];
        let d = evaluation(&EvaluationInputs {
            provider: Some("classifier"),
            answers: &answers,
            ..eval(ItemStatus::Visible, Some(Verdict::Defer))
        });
        assert_eq!((d.verdict, d.to, d.handoff.as_deref()), (Verdict::Allow, None, None));
        assert!(d.reason.contains("already answered allow"), "{}", d.reason);
        // Without an answer (the content changed), the rule's deferral asks.
        let ask = evaluation(&EvaluationInputs {
            provider: Some("classifier"),
            ..eval(ItemStatus::Visible, Some(Verdict::Defer))
        });
        assert_eq!(
            (ask.to, ask.handoff.as_deref()),
            (Some(ItemStatus::AwaitingProvider), Some("classifier"))
        );
        // A stricter rule still wins over the answer.
        let strict = evaluation(&EvaluationInputs {
            provider: Some("classifier"),
            answers: &answers,
            ..eval(ItemStatus::Visible, Some(Verdict::Reject))
        });
        assert_eq!(strict.to, Some(ItemStatus::Rejected));
    }

    #[test]
    fn an_outstanding_request_is_not_sent_again_but_an_edit_supersedes_it() {
        let waiting = EvaluationInputs {
            provider: Some("classifier"),
            waiting_on: Some("classifier"),
            ..eval(ItemStatus::AwaitingProvider, Some(Verdict::Defer))
        };
        assert_eq!(evaluation(&waiting).to, None);
        let edited = EvaluationInputs {
            waiting_on: None,
            ..waiting
        };
        let d = evaluation(&edited);
        assert_eq!(
            (d.to, d.handoff.as_deref()),
            (Some(ItemStatus::AwaitingProvider), Some("classifier"))
        );
    }

    #[test]
    fn an_unknown_provider_means_a_human_decides() {
        let d = evaluation(&EvaluationInputs {
            provider: Some("nobody"),
            provider_known: false,
            ..eval(ItemStatus::PendingScan, Some(Verdict::Defer))
        });
        assert_eq!(
            (d.verdict, d.to, d.handoff),
            (Verdict::Hold, Some(ItemStatus::HeldForReview), None)
        );
        assert!(d.reason.contains("not configured"));
    }
}

#[cfg(test)]
mod properties {
    //! The policies over arbitrary inputs: every decision is a legal
    //! transition, never settles below the submission's verdict, and never
    //! touches an item a moderator decided.
    use super::*;
    use proptest::prelude::*;

    fn verdict() -> impl Strategy<Value = Verdict> {
        proptest::sample::select(Verdict::ALL)
    }

    fn status() -> impl Strategy<Value = ItemStatus> {
        proptest::sample::select(ItemStatus::ALL).prop_filter("stored", |s| *s != ItemStatus::Received)
    }

    fn provider() -> impl Strategy<Value = String> {
        proptest::sample::select(&["vision", "text", "other"][..]).prop_map(str::to_string)
    }

    proptest! {
        #[test]
        fn submissions_are_legal_and_rejections_final(
            sync_verdict in proptest::option::of(verdict()),
            duplicates in 0i64..20,
            duplicate_hold_at in 0u32..10,
            degraded: bool,
            standing in proptest::option::of(proptest::sample::select(&[Verdict::Hold, Verdict::Reject][..])),
        ) {
            let d = submission(&SubmissionInputs {
                sync_verdict,
                sync_reason: "by a rule".into(),
                duplicates,
                duplicate_hold_at,
                degraded,
                standing: standing.map(|verdict| StandingEffect { verdict, state: "restricted".into() }),
            });
            prop_assert!(can_transition(ItemStatus::Received, d.status, Actor::System), "{:?}", d);
            prop_assert_eq!(d.needs_eval, d.status != ItemStatus::Rejected);
            prop_assert_ne!(d.sync_verdict, Some(Verdict::Defer));
            if sync_verdict == Some(Verdict::Reject) || standing == Some(Verdict::Reject) {
                prop_assert_eq!(d.status, ItemStatus::Rejected);
            }
            if d.status == ItemStatus::PendingScan {
                prop_assert!(!degraded && !d.duplicate);
            }
        }

        #[test]
        fn evaluations_are_legal_and_respect_moderators_and_answers(
            status in status(),
            manual: bool,
            sync_verdict in proptest::option::of(verdict().prop_filter("not defer", |v| *v != Verdict::Defer)),
            verdict in proptest::option::of(verdict()),
            named in provider(),
            provider_known: bool,
            answers in proptest::collection::vec((provider(), verdict().prop_filter("an answer", |v| *v != Verdict::Defer)), 0..3),
            waiting_on in proptest::option::of(provider()),
        ) {
            let answers: Vec<ProviderAnswer> =
                answers.into_iter().map(|(provider, verdict)| ProviderAnswer { provider, verdict }).collect();
            let d = evaluation(&EvaluationInputs {
                status,
                manual,
                sync_verdict,
                verdict,
                provider: Some(&named),
                reason: "by a rule".into(),
                provider_known,
                answers: &answers,
                waiting_on: waiting_on.as_deref(),
            });
            if let Some(to) = d.to {
                prop_assert!(can_transition(status, to, Actor::Rules), "{status} -> {to}");
                prop_assert_eq!(to, d.target);
            }
            if manual {
                prop_assert_eq!(d.to, None);
                prop_assert!(!d.applied);
            }
            // Never below what the submission concluded.
            if let Some(s) = sync_verdict {
                prop_assert!(d.verdict >= s, "{:?} below {s}", d.verdict);
            }
            // A provider that answered for this content is not asked again.
            if answers.iter().any(|a| a.provider == named) {
                prop_assert_eq!(d.handoff.clone(), None);
            }
            // A hand-off only to a configured provider, only when moving there.
            if let Some(h) = &d.handoff {
                prop_assert!(provider_known);
                prop_assert_eq!(h, &named);
                prop_assert_eq!(d.to, Some(ItemStatus::AwaitingProvider));
            }
        }
    }
}
