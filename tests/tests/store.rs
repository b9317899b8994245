//! The store conformance suite, run on SQLite and on a real PostgreSQL:
//! conditional writes, the audit trail, idempotency keys (RELIABILITY.md P2).

use gavel::rules::Phase;
use gavel::status::{Actor, ItemStatus};
use gavel::store::*;
use gavel_tests::servers::{Backend, database_url};

struct Opened {
    store: SharedStore,
    _dir: tempfile::TempDir,
}

async fn open(backend: Backend) -> Opened {
    let dir = tempfile::tempdir().unwrap();
    let url = database_url(backend, dir.path()).await;
    Opened {
        store: gavel::store::open(&url, 16).await.unwrap(),
        _dir: dir,
    }
}

fn new_item(id: &str) -> NewItem {
    NewItem {
        id: id.into(),
        client: "web".into(),
        external_id: None,
        kind: "post".into(),
        author: "alice".into(),
        body: "hello".into(),
        context: "{}".into(),
        fingerprint: gavel::fingerprint::fingerprint("hello"),
        status: ItemStatus::PendingScan,
        sync_verdict: None,
        needs_eval: true,
        cause: "submitted".into(),
        reason: String::new(),
        correlation_id: "test".into(),
        now: now_ms(),
    }
}

async fn create(store: &SharedStore, id: &str) -> Item {
    create_with(store, new_item(id)).await
}

async fn create_with(store: &SharedStore, item: NewItem) -> Item {
    match store.create_item(&item, &[], None).await.unwrap() {
        CreateOutcome::Created(item) => item,
        other => panic!("{other:?}"),
    }
}

fn request(id: &str, version: i64, from: ItemStatus, to: ItemStatus, actor: Actor) -> TransitionRequest {
    TransitionRequest {
        item_id: id.into(),
        expected_version: version,
        from,
        to,
        actor,
        actor_name: (actor == Actor::Moderator).then(|| "mod".into()),
        cause: "test".into(),
        reason: "test".into(),
        correlation_id: "test".into(),
        now: now_ms(),
        reversed_decisions: Vec::new(),
    }
}

fn decision(plugin: &str) -> NewDecision {
    NewDecision {
        plugin: plugin.into(),
        plugin_version: "1.0.0".into(),
        plugin_digest: "ab".repeat(32),
        phase: Phase::Async.into(),
        verdict: Some(gavel::verdict::Verdict::Hold),
        score: 0.5,
        labels: vec!["x".into()],
        reason: "because".into(),
        mode: Mode::Enforce,
        applied: true,
        duration_us: 12,
        outcome: gavel::rules::Outcome::Ok,
        error: None,
        decided_at: now_ms(),
    }
}

/// P2: 32 concurrent moderator and automated transitions from one state:
/// exactly one succeeds, exactly one audit row.
async fn concurrent_transitions_from_one_state_have_one_winner(store: SharedStore) {
    for round in 0..5 {
        let id = format!("item-p2-{round}");
        create(&store, &id).await;
        let targets = [ItemStatus::Visible, ItemStatus::HeldForReview, ItemStatus::Rejected];
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..32 {
            let store = store.clone();
            let actor = if i % 2 == 0 { Actor::Moderator } else { Actor::Rules };
            let req = request(&id, 1, ItemStatus::PendingScan, targets[i % 3], actor);
            tasks.spawn(async move { store.transition(&req).await.unwrap() });
        }
        let results = tasks.join_all().await;
        let applied: Vec<_> = results
            .iter()
            .filter(|r| matches!(r, Transition::Applied { .. }))
            .collect();
        assert_eq!(applied.len(), 1, "round {round}: {results:?}");
        assert_eq!(applied[0], &Transition::Applied { version: 2 });
        let details = store.item_details(&id).await.unwrap().unwrap();
        assert_eq!(details.transitions.len(), 2, "creation + exactly one transition");
        assert_eq!(details.item.version, 2);
        assert_eq!(details.transitions[1].to_status, details.item.status);
        // Exactly one outbox event per transition: the losers wrote none.
        let events: Vec<_> = changes_of(&store, &id, 2)
            .await
            .into_iter()
            .map(|c| (c.event_id, c.item_version, c.to_status))
            .collect();
        assert_eq!(
            events,
            vec![
                (format!("{id}:1"), 1, ItemStatus::PendingScan),
                (format!("{id}:2"), 2, details.item.status)
            ]
        );
    }
}

/// Deliveries of one item to one endpoint are claimed in version order: a
/// later version waits while an earlier one is pending (even when it is
/// failing), and goes once the earlier one is delivered or dead.
async fn deliveries_are_claimed_in_version_order(store: SharedStore) {
    create(&store, "item-d").await;
    let statuses = [ItemStatus::Visible, ItemStatus::HeldForReview, ItemStatus::Rejected];
    let mut from = ItemStatus::PendingScan;
    for (i, to) in statuses.into_iter().enumerate() {
        let req = request("item-d", i as i64 + 1, from, to, Actor::Moderator);
        assert!(matches!(
            store.transition(&req).await.unwrap(),
            Transition::Applied { .. }
        ));
        from = to;
    }
    let endpoints = [
        EndpointFilter {
            name: "all".into(),
            statuses: vec![],
            kinds: vec![],
        },
        EndpointFilter {
            name: "rejections".into(),
            statuses: vec![ItemStatus::Rejected],
            kinds: vec![],
        },
    ];
    let now = now_ms();
    assert_eq!(store.fan_out(&endpoints, now, 100).await.unwrap(), 4);
    assert_eq!(store.fan_out(&endpoints, now, 100).await.unwrap(), 0, "fanned out once");
    let claim = |at: i64| {
        let store = store.clone();
        async move {
            let mut c: Vec<(String, i64)> = store
                .claim_deliveries(at, at + 1_000, 100)
                .await
                .unwrap()
                .into_iter()
                .map(|d| (d.endpoint, d.change.item_version))
                .collect();
            c.sort();
            c
        }
    };
    // Version 1 for "all"; "rejections" only wants version 4, its first.
    let first = claim(now).await;
    assert_eq!(first, vec![("all".to_string(), 1), ("rejections".to_string(), 4)]);
    assert!(claim(now).await.is_empty(), "claimed deliveries are leased");
    let all = store.deliveries(true, 100).await.unwrap();
    let id_of = |v: i64| {
        all.iter()
            .find(|d| d.endpoint == "all" && d.item_version == v)
            .unwrap()
            .id
    };
    // Version 1 fails and is retried later: version 2 must still wait.
    store
        .delivery_failed(id_of(1), "HTTP 500", Some(now + 10))
        .await
        .unwrap();
    assert_eq!(claim(now + 5).await, Vec::<(String, i64)>::new());
    assert_eq!(claim(now + 20).await, vec![("all".to_string(), 1)]);
    store.delivery_succeeded(id_of(1), now + 21).await.unwrap();
    assert_eq!(claim(now + 22).await, vec![("all".to_string(), 2)]);
    // A dead delivery no longer holds the item back; replay makes it pending again.
    store.delivery_failed(id_of(2), "HTTP 410", None).await.unwrap();
    assert_eq!(claim(now + 23).await, vec![("all".to_string(), 3)]);
    let dead = store.deliveries(false, 100).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].item_version, dead[0].last_error.as_deref()),
        (2, Some("HTTP 410"))
    );
    assert!(store.replay_delivery(dead[0].id, now + 24).await.unwrap());
    assert!(
        !store.replay_delivery(dead[0].id, now + 24).await.unwrap(),
        "only a dead one"
    );
}

/// The changes feed's events of item `id`, once it shows at least `n` (on
/// PostgreSQL the feed shows a commit once every older transaction in the
/// cluster has ended, so it may lag a moment behind).
async fn changes_of(store: &SharedStore, id: &str, n: usize) -> Vec<Change> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let events: Vec<Change> = store
            .changes(None, ChangeCursor::default(), 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|c| c.item_id == id)
            .collect();
        if events.len() >= n || std::time::Instant::now() > deadline {
            return events;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A manual decision wins: later automated transitions and evaluation
/// commits are refused by the conditional update itself.
async fn automated_changes_are_refused_after_a_moderator_decided(store: SharedStore) {
    create(&store, "item-m").await;
    let manual = request(
        "item-m",
        1,
        ItemStatus::PendingScan,
        ItemStatus::Visible,
        Actor::Moderator,
    );
    assert_eq!(
        store.transition(&manual).await.unwrap(),
        Transition::Applied { version: 2 }
    );
    let auto = request("item-m", 2, ItemStatus::Visible, ItemStatus::Rejected, Actor::Rules);
    assert_eq!(store.transition(&auto).await.unwrap(), Transition::Stale);
    let commit = EvaluationCommit {
        item_id: "item-m".into(),
        snapshot_version: 2,
        snapshot_event_seq: 0,
        from: ItemStatus::Visible,
        to: Some(ItemStatus::Rejected),
        decisions: vec![decision("r")],
        reason: "r".into(),
        correlation_id: "c".into(),
        now: now_ms(),
        handoff: None,
    };
    assert_eq!(store.commit_evaluation(&commit).await.unwrap(), CommitOutcome::Stale);
    let d = store.item_details("item-m").await.unwrap().unwrap();
    assert_eq!(d.item.status, ItemStatus::Visible);
    assert_eq!(d.item.decided_by, Some(Actor::Moderator));
    assert!(d.decisions.is_empty(), "a refused commit writes nothing");
    // The moderator may still change their mind.
    let again = request("item-m", 2, ItemStatus::Visible, ItemStatus::Rejected, Actor::Moderator);
    assert_eq!(
        store.transition(&again).await.unwrap(),
        Transition::Applied { version: 3 }
    );
}

/// Evaluation commits are fenced by the snapshot version; an event after
/// the snapshot keeps the item scheduled.
async fn evaluation_commits_are_fenced_and_keep_late_events_scheduled(store: SharedStore) {
    create(&store, "item-e").await;
    for actor in ["u1", "u2", "u3"] {
        let e = NewEvent {
            item_id: "item-e".into(),
            kind: EventKind::Flag,
            actor: actor.into(),
            text: None,
            fingerprint: None,
            now: now_ms(),
        };
        assert!(matches!(
            store.append_event(&e, None).await.unwrap(),
            EventOutcome::Appended { .. }
        ));
    }
    let data = store.snapshot_data("item-e", 0, 0).await.unwrap().unwrap();
    assert_eq!(data.counters, vec![("flag".to_string(), 3)]);
    assert_eq!(data.trigger.len(), 3);
    assert_eq!(data.item.event_seq, 3);
    // An event lands while the evaluation runs.
    let late = NewEvent {
        item_id: "item-e".into(),
        kind: EventKind::Upvote,
        actor: "u4".into(),
        text: None,
        fingerprint: None,
        now: now_ms(),
    };
    store.append_event(&late, None).await.unwrap();
    let commit = EvaluationCommit {
        item_id: "item-e".into(),
        snapshot_version: 1,
        snapshot_event_seq: data.item.event_seq,
        from: ItemStatus::PendingScan,
        to: Some(ItemStatus::HeldForReview),
        decisions: vec![decision("a"), decision("b")],
        reason: "held".into(),
        correlation_id: "c".into(),
        now: now_ms(),
        handoff: None,
    };
    assert_eq!(
        store.commit_evaluation(&commit).await.unwrap(),
        CommitOutcome::Transitioned { version: 2 }
    );
    let item = store.item("item-e").await.unwrap().unwrap();
    assert!(
        item.needs_eval_since.is_some(),
        "the late event still needs an evaluation"
    );
    assert_eq!(
        store.pending_evaluations(now_ms(), 10).await.unwrap(),
        vec!["item-e".to_string()]
    );
    // The same snapshot committed again (a second worker after lease loss) is refused.
    assert_eq!(store.commit_evaluation(&commit).await.unwrap(), CommitOutcome::Stale);
    let d = store.item_details("item-e").await.unwrap().unwrap();
    assert_eq!(d.decisions.len(), 2);
    assert_eq!(d.transitions.len(), 2);
    // A follow-up that saw every event clears the mark without a transition.
    let data = store.snapshot_data("item-e", 0, 0).await.unwrap().unwrap();
    assert_eq!(data.trigger.len(), 1, "only the event since the last evaluation");
    let follow_up = EvaluationCommit {
        snapshot_version: 2,
        snapshot_event_seq: data.item.event_seq,
        from: ItemStatus::HeldForReview,
        to: None,
        ..commit
    };
    assert_eq!(
        store.commit_evaluation(&follow_up).await.unwrap(),
        CommitOutcome::Recorded
    );
    assert_eq!(store.item("item-e").await.unwrap().unwrap().needs_eval_since, None);
}

/// Idempotency keys: claimed by the unique constraint, replayed, expired.
async fn idempotency_keys_claim_replay_and_expire(store: SharedStore) {
    let claim = |hash: &str, now: i64| IdempotencyClaim {
        scope: "web".into(),
        key: "k-1".into(),
        request_hash: hash.into(),
        now,
        lock_ms: 1_000,
        ttl_ms: 10_000,
    };
    let t0 = now_ms();
    assert_eq!(
        store.idempotency_start(&claim("h1", t0)).await.unwrap(),
        IdempotencyStart::Started
    );
    assert_eq!(
        store.idempotency_start(&claim("h1", t0)).await.unwrap(),
        IdempotencyStart::InFlight
    );
    assert_eq!(
        store.idempotency_start(&claim("h2", t0)).await.unwrap(),
        IdempotencyStart::Mismatch
    );
    // The first request died: after the lock, the same request takes over.
    assert_eq!(
        store.idempotency_start(&claim("h1", t0 + 1_500)).await.unwrap(),
        IdempotencyStart::Started
    );
    let response = IdempotencyResponse {
        scope: "web".into(),
        key: "k-1".into(),
        status: 202,
        body: r#"{"id":"item-i"}"#.into(),
    };
    store
        .create_item(&new_item("item-i"), &[], Some(&response))
        .await
        .unwrap();
    assert_eq!(
        store.idempotency_start(&claim("h1", t0 + 2_000)).await.unwrap(),
        IdempotencyStart::Replay {
            status: 202,
            body: r#"{"id":"item-i"}"#.into()
        }
    );
    // Another scope is another key.
    let other = IdempotencyClaim {
        scope: "app".into(),
        ..claim("h1", t0)
    };
    assert_eq!(
        store.idempotency_start(&other).await.unwrap(),
        IdempotencyStart::Started
    );
    // After the TTL the key is free again, for any request.
    assert_eq!(
        store.idempotency_start(&claim("h9", t0 + 20_000)).await.unwrap(),
        IdempotencyStart::Started
    );
    assert!(store.idempotency_expire(t0 + 100_000).await.unwrap() >= 2);
}

/// `external_id` is unique per client, decided by the constraint.
async fn external_ids_are_unique_per_client(store: SharedStore) {
    let mut a = new_item("item-x1");
    a.external_id = Some("post-1".into());
    assert!(matches!(
        store.create_item(&a, &[], None).await.unwrap(),
        CreateOutcome::Created(_)
    ));
    let mut b = new_item("item-x2");
    b.external_id = Some("post-1".into());
    assert_eq!(
        store.create_item(&b, &[], None).await.unwrap(),
        CreateOutcome::DuplicateExternalId {
            existing_id: "item-x1".into()
        }
    );
    assert!(store.item("item-x2").await.unwrap().is_none());
    let mut c = new_item("item-x3");
    c.external_id = Some("post-1".into());
    c.client = "app".into();
    assert!(matches!(
        store.create_item(&c, &[], None).await.unwrap(),
        CreateOutcome::Created(_)
    ));
}

/// The review queue pages through held items, oldest first, without gaps.
async fn review_queue_pages_without_gaps(store: SharedStore) {
    for i in 0..7 {
        let id = format!("item-r{i}");
        create(&store, &id).await;
        let hold = request(&id, 1, ItemStatus::PendingScan, ItemStatus::HeldForReview, Actor::Rules);
        store.transition(&hold).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = store.review_queue(cursor.as_ref(), 3).await.unwrap();
        if page.is_empty() {
            break;
        }
        cursor = page.last().map(|i| (i.updated_at, i.id.clone()));
        seen.extend(page.into_iter().map(|i| i.id));
    }
    let mut expected: Vec<String> = (0..7).map(|i| format!("item-r{i}")).collect();
    expected.sort();
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(sorted, expected);
    assert_eq!(seen.len(), 7, "no item twice");
}

/// Group commit: a batch of submissions in one transaction gives each its
/// own outcome, in order; a duplicate `external_id` (even one earlier in
/// the same batch) writes nothing and does not stop the others.
async fn batched_submissions_keep_each_outcome(store: SharedStore) {
    let mut taken = new_item("item-b0");
    taken.external_id = Some("ext-0".into());
    create_with(&store, taken).await;
    let write = |id: &str, external: Option<&str>| ItemWrite {
        item: NewItem {
            external_id: external.map(Into::into),
            ..new_item(id)
        },
        decisions: vec![decision("sync")],
        response: None,
    };
    let batch = [
        write("item-b1", Some("ext-1")),
        write("item-b2", Some("ext-0")),
        write("item-b3", None),
        write("item-b4", Some("ext-1")),
    ];
    let outcomes = store.create_items(&batch).await.unwrap();
    assert_eq!(outcomes.len(), 4);
    assert!(matches!(&outcomes[0], CreateOutcome::Created(i) if i.id == "item-b1"));
    assert_eq!(
        outcomes[1],
        CreateOutcome::DuplicateExternalId {
            existing_id: "item-b0".into()
        }
    );
    assert!(matches!(&outcomes[2], CreateOutcome::Created(i) if i.id == "item-b3"));
    assert_eq!(
        outcomes[3],
        CreateOutcome::DuplicateExternalId {
            existing_id: "item-b1".into()
        }
    );
    for (id, exists) in [
        ("item-b1", true),
        ("item-b2", false),
        ("item-b3", true),
        ("item-b4", false),
    ] {
        let details = store.item_details(id).await.unwrap();
        assert_eq!(details.is_some(), exists, "{id}");
        if let Some(d) = details {
            assert_eq!(d.transitions.len(), 1, "{id}: one creation audit row");
            assert_eq!(d.decisions.len(), 1, "{id}: its sync decision");
        }
    }
    // Each created item has its own outbox event.
    assert_eq!(changes_of(&store, "item-b1", 1).await.len(), 1);
    assert_eq!(changes_of(&store, "item-b3", 1).await.len(), 1);
}

/// Group commit: a batch of evaluation commits keeps every fence; a stale
/// one in the middle writes nothing and the others apply.
async fn batched_evaluation_commits_are_each_fenced(store: SharedStore) {
    for id in ["item-e1", "item-e2", "item-e3"] {
        create(&store, id).await;
    }
    // item-e2 moved on (a moderator) since its snapshot.
    let manual = request(
        "item-e2",
        1,
        ItemStatus::PendingScan,
        ItemStatus::Visible,
        Actor::Moderator,
    );
    assert_eq!(
        store.transition(&manual).await.unwrap(),
        Transition::Applied { version: 2 }
    );
    let commit = |id: &str, to: Option<ItemStatus>| EvaluationCommit {
        item_id: id.into(),
        snapshot_version: 1,
        snapshot_event_seq: 0,
        from: ItemStatus::PendingScan,
        to,
        decisions: vec![decision("r")],
        reason: "r".into(),
        correlation_id: format!("c-{id}"),
        now: now_ms(),
        handoff: None,
    };
    let outcomes = store
        .commit_evaluations(&[
            commit("item-e1", Some(ItemStatus::HeldForReview)),
            commit("item-e2", Some(ItemStatus::Rejected)),
            commit("item-e3", None),
        ])
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [
            CommitOutcome::Transitioned { version: 2 },
            CommitOutcome::Stale,
            CommitOutcome::Recorded
        ]
    );
    let e1 = store.item_details("item-e1").await.unwrap().unwrap();
    assert_eq!(e1.item.status, ItemStatus::HeldForReview);
    assert_eq!(e1.transitions.len(), 2);
    assert_eq!(e1.decisions.len(), 1);
    let e2 = store.item_details("item-e2").await.unwrap().unwrap();
    assert_eq!(e2.item.status, ItemStatus::Visible);
    assert!(e2.decisions.is_empty(), "a stale commit in a batch writes nothing");
    let e3 = store.item_details("item-e3").await.unwrap().unwrap();
    assert_eq!(e3.item.status, ItemStatus::PendingScan);
    assert_eq!(e3.item.needs_eval_since, None);
    assert_eq!(e3.decisions.len(), 1);
}

/// Group commit through [`Writes`]: many concurrent submissions share
/// transactions; one that cannot commit (its id is taken) fails alone, and
/// every other one is stored with its audit row.
async fn a_failing_write_fails_alone_in_a_group_commit(store: SharedStore) {
    create(&store, "item-g-taken").await;
    let writes = Writes::start(store.clone(), &gavel::metrics::Metrics::new());
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let writes = writes.clone();
        let id = if i == 100 {
            "item-g-taken".to_string()
        } else {
            format!("item-g{i}")
        };
        tasks.spawn(async move {
            let outcome = writes
                .create_item(ItemWrite {
                    item: new_item(&id),
                    decisions: Vec::new(),
                    response: None,
                })
                .await;
            (id, outcome)
        });
    }
    let mut failed = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let (id, outcome) = r.unwrap();
        match outcome {
            Ok(CreateOutcome::Created(item)) => assert_eq!(item.id, id),
            Ok(other) => panic!("{id}: {other:?}"),
            Err(_) => failed.push(id),
        }
    }
    assert_eq!(failed, ["item-g-taken"]);
    let (batches, writes_taken) = writes.item_counts();
    assert_eq!(writes_taken, 200);
    assert!(
        batches < 200,
        "concurrent writes shared transactions ({batches} batches)"
    );
    for i in (0..200).filter(|i| *i != 100) {
        let d = store.item_details(&format!("item-g{i}")).await.unwrap().unwrap();
        assert_eq!(d.transitions.len(), 1);
    }
    let taken = store.item_details("item-g-taken").await.unwrap().unwrap();
    assert_eq!(taken.transitions.len(), 1, "the first item is untouched");
}

macro_rules! store_suite {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    super::$test(super::open(super::Backend::Sqlite).await.store).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    super::$test(super::open(super::Backend::Postgres).await.store).await
                }
            )*
        }
    };
}

store_suite!(
    concurrent_transitions_from_one_state_have_one_winner,
    deliveries_are_claimed_in_version_order,
    automated_changes_are_refused_after_a_moderator_decided,
    evaluation_commits_are_fenced_and_keep_late_events_scheduled,
    idempotency_keys_claim_replay_and_expire,
    external_ids_are_unique_per_client,
    review_queue_pages_without_gaps,
    batched_submissions_keep_each_outcome,
    batched_evaluation_commits_are_each_fenced,
    a_failing_write_fails_alone_in_a_group_commit,
);
