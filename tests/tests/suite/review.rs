//! The moderator console's store (`host/src/store/review.rs`) on SQLite and
//! on a real PostgreSQL: review claims are exclusive under concurrency,
//! expire, come back to their holder and pass over what a moderator
//! skipped; sessions expire and end; the queue's filters and order.

use super::store::{append, commit, commit_of, create, decision, open, request, snapshot};
use gavel::domain::{Actor, EventKind, ItemStatus};
use gavel::store::*;
use gavel_tests::server::Setup;
use std::collections::BTreeSet;

const TEN_MIN: i64 = 600_000;

/// `n` items held by an applied `hold` of `plugin` (labels `["x"]`), held
/// in order: the first was held longest.
async fn held(store: &SharedStore, prefix: &str, n: usize, plugin: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = format!("{prefix}-{i}");
        create(store, &id).await;
        let mut c = commit_of(&snapshot(store, &id).await, Some(ItemStatus::HeldForReview));
        c.decisions = vec![decision(plugin)];
        assert!(matches!(commit(store, c).await, CommitOutcome::Transitioned { .. }));
        ids.push(id);
        // Distinct `updated_at`, so "oldest first" has one answer.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    ids
}

/// A session of `moderator` with CSRF token `csrf` (and a binding of its own).
fn session(moderator: &str, csrf: &str) -> ConsoleSession {
    ConsoleSession {
        moderator: moderator.into(),
        token_binding: format!("bound-to-{moderator}"),
        csrf: csrf.into(),
    }
}

/// Items held by `plugin`.
fn only(plugin: &str) -> QueueFilter {
    QueueFilter {
        plugin: Some(plugin.into()),
        ..QueueFilter::default()
    }
}

/// Items an enforcing decision labelled `label`.
fn labelled(label: &str) -> QueueFilter {
    QueueFilter {
        label: Some(label.into()),
        ..QueueFilter::default()
    }
}

/// Claims the next item, oldest first.
async fn claim(store: &SharedStore, moderator: &str, filter: &QueueFilter, ttl_ms: i64) -> StoreResult<Option<String>> {
    store.claim_next(moderator, filter, QueueSort::Oldest, ttl_ms).await
}

/// Many moderators claiming at once never share an item: 24 concurrent
/// claims on 10 held items give 10 distinct items and 14 "nothing left".
async fn concurrent_claims_never_share_an_item(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let ids = held(&store, "c", 10, "link-spam").await;
    let mut tasks = tokio::task::JoinSet::new();
    for m in 0..24 {
        let store = store.clone();
        tasks.spawn(async move {
            claim(&store, &format!("mod-{m}"), &QueueFilter::default(), TEN_MIN)
                .await
                .unwrap()
        });
    }
    let claimed: Vec<String> = tasks.join_all().await.into_iter().flatten().collect();
    let distinct: BTreeSet<&String> = claimed.iter().collect();
    assert_eq!(claimed.len(), 10, "every item claimed once: {claimed:?}");
    assert_eq!(distinct.len(), 10, "no item claimed twice: {claimed:?}");
    assert_eq!(distinct, ids.iter().collect());
}

/// A moderator gets their own live claim back; a renewal holds only for the
/// holder; an expired claim goes to the next moderator; a decided item is
/// never claimed.
async fn claims_return_to_their_holder_and_expire(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let ids = held(&store, "e", 3, "link-spam").await;
    let all = QueueFilter::default();
    assert_eq!(
        claim(&store, "ann", &all, TEN_MIN).await.unwrap().as_ref(),
        Some(&ids[0])
    );
    assert_eq!(
        claim(&store, "ann", &all, TEN_MIN).await.unwrap().as_ref(),
        Some(&ids[0]),
        "the holder's own claim first, not a second item"
    );
    assert!(store.renew_claim(&ids[0], "ann", TEN_MIN).await.unwrap());
    assert!(!store.renew_claim(&ids[0], "bob", TEN_MIN).await.unwrap());
    assert_eq!(store.claim_of(&ids[0]).await.unwrap().unwrap().moderator, "ann");
    // Bob gets the next item, not Ann's.
    assert_eq!(
        claim(&store, "bob", &all, TEN_MIN).await.unwrap().as_ref(),
        Some(&ids[1])
    );
    // A claim that has expired is free for anyone.
    assert_eq!(claim(&store, "cyd", &all, -1).await.unwrap().as_ref(), Some(&ids[2]));
    assert_eq!(store.claim_of(&ids[2]).await.unwrap(), None, "expired");
    assert_eq!(
        claim(&store, "dan", &all, TEN_MIN).await.unwrap().as_ref(),
        Some(&ids[2])
    );
    assert!(
        !store.renew_claim(&ids[2], "cyd", TEN_MIN).await.unwrap(),
        "cyd's claim lapsed"
    );
    // Released after a decision: the item is no longer held, so nobody gets it.
    let details = store.item_details(&ids[0]).await.unwrap().unwrap();
    let decide = request(
        &ids[0],
        details.item.version,
        ItemStatus::HeldForReview,
        ItemStatus::Visible,
        Actor::Moderator,
    );
    assert!(matches!(
        store.transition(&decide).await.unwrap(),
        Transition::Applied { .. }
    ));
    store.release_claim(&ids[0], "ann").await.unwrap();
    assert_eq!(store.claim_of(&ids[0]).await.unwrap(), None);
    assert_eq!(
        claim(&store, "ann", &all, TEN_MIN).await.unwrap(),
        None,
        "nothing left for ann"
    );
}

/// A skipped item goes to another moderator, never back to the one who skipped it.
async fn a_skipped_item_goes_to_someone_else(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let ids = held(&store, "s", 2, "link-spam").await;
    let all = QueueFilter::default();
    assert_eq!(
        claim(&store, "ann", &all, TEN_MIN).await.unwrap().as_ref(),
        Some(&ids[0])
    );
    store.skip(&ids[0], "ann").await.unwrap();
    store.skip(&ids[0], "ann").await.unwrap();
    assert_eq!(
        store.claim_of(&ids[0]).await.unwrap(),
        None,
        "skipping releases the claim"
    );
    assert_eq!(
        claim(&store, "ann", &all, TEN_MIN).await.unwrap().as_ref(),
        Some(&ids[1])
    );
    store.skip(&ids[1], "ann").await.unwrap();
    assert_eq!(claim(&store, "ann", &all, TEN_MIN).await.unwrap(), None);
    assert_eq!(
        claim(&store, "bob", &all, TEN_MIN).await.unwrap().as_ref(),
        Some(&ids[0])
    );
}

/// Sessions are found by their hash while unexpired, and end on sign-out.
async fn sessions_expire_and_end(setup: Setup) {
    let (store, _dir) = open(setup).await;
    store
        .create_session("live", &session("ann", "csrf-1"), TEN_MIN)
        .await
        .unwrap();
    store
        .create_session("gone", &session("bob", "csrf-2"), -1)
        .await
        .unwrap();
    let s = store.session("live").await.unwrap().unwrap();
    assert_eq!(s, session("ann", "csrf-1"));
    assert_eq!(store.session("gone").await.unwrap(), None);
    assert_eq!(store.session("unknown").await.unwrap(), None);
    store.end_session("live").await.unwrap();
    assert_eq!(store.session("live").await.unwrap(), None);
}

/// Filters by plugin, label, kind and author; order by flags; the figures
/// at the top of the queue; claims and "held by" on each row.
async fn the_queue_filters_sorts_and_counts(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let spam = held(&store, "q-spam", 3, "link-spam").await;
    let words = held(&store, "q-words", 2, "banned-terms").await;
    let ids = |rows: Vec<QueueRow>| rows.into_iter().map(|r| r.item.id).collect::<Vec<_>>();
    let by_spam = store
        .queue_page(&only("link-spam"), QueueSort::Oldest, 0)
        .await
        .unwrap();
    assert_eq!(ids(by_spam.clone()), spam);
    assert_eq!(by_spam[0].held_by.as_deref(), Some("link-spam: because"));
    let by_words = store
        .queue_page(&only("banned-terms"), QueueSort::Oldest, 0)
        .await
        .unwrap();
    assert_eq!(ids(by_words), words);
    assert_eq!(
        store
            .queue_page(&labelled("x"), QueueSort::Oldest, 0)
            .await
            .unwrap()
            .len(),
        5
    );
    assert!(
        store
            .queue_page(&labelled("%"), QueueSort::Oldest, 0)
            .await
            .unwrap()
            .is_empty()
    );
    let kind = QueueFilter {
        kind: Some("comment".into()),
        ..QueueFilter::default()
    };
    assert!(store.queue_page(&kind, QueueSort::Oldest, 0).await.unwrap().is_empty());
    // The newest held item has the most flags: first when sorted by flags.
    for actor in ["u1", "u2"] {
        append(&store, &words[1], EventKind::Flag, actor).await;
    }
    append(&store, &spam[2], EventKind::Report, "u3").await;
    let by_flags = store
        .queue_page(&QueueFilter::default(), QueueSort::Flags, 0)
        .await
        .unwrap();
    assert_eq!(by_flags[0].item.id, words[1]);
    assert_eq!(by_flags[0].flags, 2);
    assert_eq!(by_flags[1].item.id, spam[2]);
    // A claim shows on its row; filters apply to claiming too.
    let claimed = claim(&store, "ann", &only("banned-terms"), TEN_MIN).await.unwrap();
    assert_eq!(claimed.as_ref(), Some(&words[0]));
    let rows = store
        .queue_page(&only("banned-terms"), QueueSort::Oldest, 0)
        .await
        .unwrap();
    assert_eq!(rows[0].claimed_by.as_deref(), Some("ann"));
    let o = store.queue_overview(gavel::clock::now_ms()).await.unwrap();
    assert_eq!((o.held, o.awaiting_provider, o.decided_hour), (5, 0, 0));
    assert!(o.oldest_held_at.is_some());
}

/// Search finds an item by id, external id or author, for the clients named.
async fn search_finds_ids_external_ids_and_authors(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let item = create(&store, "find-me").await;
    assert_eq!(store.search_items("find-me", &["web"]).await.unwrap().len(), 1);
    let by_author = store.search_items(&item.author, &["web"]).await.unwrap();
    assert!(by_author.iter().any(|i| i.id == "find-me"));
    assert!(store.search_items(&item.author, &["other"]).await.unwrap().is_empty());
    assert!(store.search_items("nothing", &["web"]).await.unwrap().is_empty());
}

/// "Start reviewing" follows the queue's order and filters, for a fresh
/// claim and for the moderator's own open one; labels match exactly, with
/// case, on both stores.
async fn claims_follow_the_queue_order_and_filters(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let spam = held(&store, "o-spam", 3, "link-spam").await;
    let words = held(&store, "o-words", 1, "banned-terms").await;
    append(&store, &spam[2], EventKind::Flag, "u1").await;
    let all = QueueFilter::default();
    let by_flags = store.claim_next("ann", &all, QueueSort::Flags, TEN_MIN).await.unwrap();
    assert_eq!(by_flags.as_ref(), Some(&spam[2]), "most flags first");
    let words_only = only("banned-terms");
    assert_eq!(
        claim(&store, "ann", &words_only, TEN_MIN).await.unwrap().as_ref(),
        Some(&words[0]),
        "ann's open claim does not match the filter: a matching item instead"
    );
    assert_eq!(
        store
            .queue_page(&labelled("x"), QueueSort::Oldest, 0)
            .await
            .unwrap()
            .len(),
        4
    );
    assert!(
        store
            .queue_page(&labelled("X"), QueueSort::Oldest, 0)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Retention removes expired sessions and claims, and skips of items that
/// are no longer held; live ones stay.
async fn retention_removes_spent_console_state(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let ids = held(&store, "p", 2, "link-spam").await;
    store.create_session("old", &session("ann", "c"), -1).await.unwrap();
    store
        .create_session("new", &session("ann", "c"), TEN_MIN)
        .await
        .unwrap();
    assert_eq!(
        claim(&store, "ann", &QueueFilter::default(), -1)
            .await
            .unwrap()
            .as_ref(),
        Some(&ids[0])
    );
    store.skip(&ids[0], "bob").await.unwrap();
    store.skip(&ids[1], "bob").await.unwrap();
    let details = store.item_details(&ids[1]).await.unwrap().unwrap();
    let decide = request(
        &ids[1],
        details.item.version,
        ItemStatus::HeldForReview,
        ItemStatus::Rejected,
        Actor::Moderator,
    );
    store.transition(&decide).await.unwrap();
    let policy = RetentionPolicy::default();
    let pruned = store.prune(&policy, gavel::clock::now_ms() + 1).await.unwrap();
    assert_eq!(
        (pruned.console_sessions, pruned.review_claims, pruned.review_skips),
        (1, 1, 1)
    );
    assert!(store.session("new").await.unwrap().is_some());
    // Bob's skip of the still-held item stands.
    assert_eq!(
        claim(&store, "bob", &QueueFilter::default(), TEN_MIN).await.unwrap(),
        None
    );
}

gavel_tests::both!(
    claims_follow_the_queue_order_and_filters,
    retention_removes_spent_console_state,
    concurrent_claims_never_share_an_item,
    claims_return_to_their_holder_and_expire,
    a_skipped_item_goes_to_someone_else,
    sessions_expire_and_end,
    the_queue_filters_sorts_and_counts,
    search_finds_ids_external_ids_and_authors,
);
