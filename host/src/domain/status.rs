//! The item state machine (docs/ARCHITECTURE.md, "Item state machine"):
//! the one transition table in code. The migrations' CHECK constraints
//! mirror [`ItemStatus::ALL`]; status strings exist only here.

use super::Verdict;

super::string_enum! {
    /// Where an item is in its life.
    pub enum ItemStatus("item status") {
        /// Accepted by the API, not yet stored (only ever the `from` of the first transition).
        Received = "received",
        /// Stored; waiting for the asynchronous rules.
        PendingScan = "pending_scan",
        /// Shown on the platform.
        Visible = "visible",
        /// Hidden until a human decides.
        HeldForReview = "held_for_review",
        /// Rejected.
        Rejected = "rejected",
        /// A rule handed the item to an external classifier; waiting for its callback.
        AwaitingProvider = "awaiting_provider",
        /// Deleted by its author or a moderator. Terminal.
        Deleted = "deleted",
    }
}

super::string_enum! {
    /// Who causes a transition.
    pub enum Actor("actor") {
        /// gavel itself: the submission path, timeouts.
        System = "system",
        /// The automated rules (a worker's evaluation).
        Rules = "rules",
        /// An external classifier's callback.
        Provider = "provider",
        /// A human moderator. A moderator's decision is final for automation.
        Moderator = "moderator",
        /// The item's author (deletion only).
        Author = "author",
    }
}

impl ItemStatus {
    /// The status an automated verdict settles an item in.
    pub fn for_verdict(verdict: Verdict) -> ItemStatus {
        match verdict {
            Verdict::Allow | Verdict::Flag => ItemStatus::Visible,
            Verdict::Defer => ItemStatus::AwaitingProvider,
            Verdict::Hold => ItemStatus::HeldForReview,
            Verdict::Reject => ItemStatus::Rejected,
        }
    }

    /// The automated verdicts a moderator who leaves an item in this
    /// status overturns: making it visible overturns every action (`flag`,
    /// `hold`, `reject`); holding it overturns rejections and confirms the
    /// rest; rejecting or deleting it confirms them all. Only the item's
    /// latest moderator decision counts (`store/items.rs` recomputes the
    /// reversals on each one), so the strikes and the reversal rates are a
    /// function of where the moderators left the item, not of the path.
    pub fn overturned_verdicts(self) -> &'static [Verdict] {
        match self {
            ItemStatus::Visible => &[Verdict::Flag, Verdict::Hold, Verdict::Reject],
            ItemStatus::HeldForReview => &[Verdict::Reject],
            _ => &[],
        }
    }

    /// Statuses a moderator may set.
    pub fn is_moderator_target(self) -> bool {
        matches!(
            self,
            ItemStatus::Visible | ItemStatus::HeldForReview | ItemStatus::Rejected
        )
    }

    /// Statuses the automated rules settle an item in.
    fn is_settled(self) -> bool {
        matches!(
            self,
            ItemStatus::Visible | ItemStatus::HeldForReview | ItemStatus::Rejected
        )
    }
}

impl Actor {
    /// Automated actors never override a moderator's decision; the store's
    /// conditional update enforces this, not an `if` in the caller.
    pub fn is_automated(self) -> bool {
        matches!(self, Actor::System | Actor::Rules | Actor::Provider)
    }
}

/// The transition table. `from == to` is a transition only for a moderator
/// (confirming an automated outcome makes it a manual decision) and for the
/// rules re-asking a provider (`awaiting_provider` again, a new request).
pub fn can_transition(from: ItemStatus, to: ItemStatus, actor: Actor) -> bool {
    use Actor::*;
    use ItemStatus::*;
    if from == Deleted || to == Received {
        return false;
    }
    match actor {
        // Received is never stored: there is nothing for a person to change yet.
        Moderator => from != Received && (to.is_moderator_target() || to == Deleted),
        Author => from != Received && to == Deleted,
        System => matches!(
            (from, to),
            // Creation: the sync path stores the item pending, or holds or
            // rejects it at once (sync-phase rules, duplicate text, degraded mode).
            (Received, PendingScan | HeldForReview | Rejected)
            // A provider that never called back: a human decides.
            | (AwaitingProvider, HeldForReview)
            // A moderator's restriction set until a time reached it.
            | (HeldForReview | Rejected, Visible)
        ),
        Rules => {
            // awaiting_provider -> awaiting_provider: a re-evaluation after
            // new events deferred again, and the new request supersedes the
            // outstanding one.
            (from != to || from == AwaitingProvider)
                && matches!(
                    from,
                    PendingScan | Visible | HeldForReview | Rejected | AwaitingProvider
                )
                && (to.is_settled() || to == AwaitingProvider)
        }
        Provider => from == AwaitingProvider && to.is_settled(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Actor::*;
    use ItemStatus::*;

    /// The table written out as the architecture document states it; the
    /// test below compares every from × to × actor against it.
    fn expected(from: ItemStatus, to: ItemStatus, actor: Actor) -> bool {
        let settled = [Visible, HeldForReview, Rejected];
        match actor {
            Moderator => from != Deleted && from != Received && (settled.contains(&to) || to == Deleted),
            Author => from != Deleted && from != Received && to == Deleted,
            System => {
                (from == Received && [PendingScan, HeldForReview, Rejected].contains(&to))
                    || (from == AwaitingProvider && to == HeldForReview)
                    || ([HeldForReview, Rejected].contains(&from) && to == Visible)
            }
            Rules => {
                [PendingScan, Visible, HeldForReview, Rejected, AwaitingProvider].contains(&from)
                    && (settled.contains(&to) || to == AwaitingProvider)
                    && (from != to || from == AwaitingProvider)
            }
            Provider => from == AwaitingProvider && settled.contains(&to),
        }
    }

    #[test]
    fn transition_table_is_exhaustively_as_documented() {
        let mut allowed = 0;
        for &from in ItemStatus::ALL {
            for &to in ItemStatus::ALL {
                for &actor in Actor::ALL {
                    assert_eq!(
                        can_transition(from, to, actor),
                        expected(from, to, actor),
                        "{from} -> {to} by {actor}"
                    );
                    allowed += usize::from(can_transition(from, to, actor));
                }
            }
        }
        // 7 × 7 × 5 combinations checked; this many are legal.
        // moderator 5×4, author 5, system 6, rules 17, provider 3.
        assert_eq!(allowed, 51);
    }

    #[test]
    fn deleted_is_terminal_and_received_is_never_a_target() {
        for &to in ItemStatus::ALL {
            for &actor in Actor::ALL {
                assert!(!can_transition(Deleted, to, actor));
                assert!(!can_transition(to, Received, actor));
            }
        }
    }

    #[test]
    fn strings_round_trip() {
        for &s in ItemStatus::ALL {
            assert_eq!(s.as_str().parse::<ItemStatus>(), Ok(s));
        }
        for &a in Actor::ALL {
            assert_eq!(a.as_str().parse::<Actor>(), Ok(a));
        }
    }

    #[test]
    fn verdicts_map_to_statuses() {
        assert_eq!(ItemStatus::for_verdict(Verdict::Allow), Visible);
        assert_eq!(ItemStatus::for_verdict(Verdict::Flag), Visible);
        assert_eq!(ItemStatus::for_verdict(Verdict::Defer), AwaitingProvider);
        assert_eq!(ItemStatus::for_verdict(Verdict::Hold), HeldForReview);
        assert_eq!(ItemStatus::for_verdict(Verdict::Reject), Rejected);
    }

    #[test]
    fn a_moderator_overturns_only_the_verdicts_stricter_than_their_decision() {
        use Verdict::*;
        let overturned = |s: ItemStatus| s.overturned_verdicts().to_vec();
        assert_eq!(overturned(Visible), vec![Flag, Hold, Reject]);
        assert_eq!(overturned(HeldForReview), vec![Reject]);
        assert_eq!(overturned(Rejected), Vec::<Verdict>::new());
        assert_eq!(overturned(Deleted), Vec::<Verdict>::new());
        // What a moderator confirms is never overturned by a stricter decision.
        for &s in ItemStatus::ALL {
            for v in s.overturned_verdicts() {
                assert!(*v > Allow && *v != Defer, "{s} overturns only actions");
            }
        }
    }

    #[test]
    fn check_constraints_mirror_the_enums() {
        let stored: Vec<&str> = ItemStatus::ALL
            .iter()
            .filter(|s| **s != Received)
            .map(|s| s.as_str())
            .collect();
        crate::domain::check_constraints::assert_mirrors("items", "status", &stored);
        crate::domain::check_constraints::assert_mirrors("transitions", "to_status", &stored);
        let all: Vec<&str> = ItemStatus::ALL.iter().map(|s| s.as_str()).collect();
        crate::domain::check_constraints::assert_mirrors("transitions", "from_status", &all);
        let actors: Vec<&str> = Actor::ALL.iter().map(|a| a.as_str()).collect();
        crate::domain::check_constraints::assert_mirrors("transitions", "actor", &actors);
        crate::domain::check_constraints::assert_mirrors("items", "decided_by", &actors);
    }
}

#[cfg(test)]
mod properties {
    //! The transition table walked at random: whatever a sequence of
    //! requests by whichever actors, the table keeps its invariants.
    use super::*;
    use proptest::prelude::*;

    fn status() -> impl Strategy<Value = ItemStatus> {
        proptest::sample::select(ItemStatus::ALL)
    }

    fn actor() -> impl Strategy<Value = Actor> {
        proptest::sample::select(Actor::ALL)
    }

    proptest! {
        #[test]
        fn random_walks_keep_the_invariants(steps in proptest::collection::vec((status(), actor()), 1..64)) {
            let mut at = ItemStatus::Received;
            let mut moved = false;
            for (to, actor) in steps {
                if !can_transition(at, to, actor) {
                    continue;
                }
                // Nothing leaves deleted, nothing returns to received.
                prop_assert_ne!(at, ItemStatus::Deleted);
                prop_assert_ne!(to, ItemStatus::Received);
                // Only the system creates; afterwards nobody acts on received.
                prop_assert_eq!(at == ItemStatus::Received, !moved);
                if at == ItemStatus::Received {
                    prop_assert_eq!(actor, Actor::System);
                }
                // Only people delete.
                if to == ItemStatus::Deleted {
                    prop_assert!(matches!(actor, Actor::Moderator | Actor::Author));
                }
                // A provider only answers an item that waits for it.
                if actor == Actor::Provider {
                    prop_assert_eq!(at, ItemStatus::AwaitingProvider);
                }
                at = to;
                moved = true;
            }
        }

        #[test]
        fn automated_verdicts_are_always_a_legal_rules_target(from in status(), v in proptest::sample::select(Verdict::ALL)) {
            let to = ItemStatus::for_verdict(v);
            let legal_from = !matches!(from, ItemStatus::Received | ItemStatus::Deleted);
            if legal_from && (from != to || to == ItemStatus::AwaitingProvider) {
                prop_assert!(can_transition(from, to, Actor::Rules), "{from} -> {to}");
            }
        }
    }
}
