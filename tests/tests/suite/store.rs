//! The store conformance suite, run on SQLite and on a real PostgreSQL:
//! conditional writes, the evaluation fence, idempotency claims, the audit
//! trail and the outbox, batches, retention (docs/RELIABILITY.md P2, Q7,
//! I6, S1).

use gavel::clock::now_ms;
use gavel::domain::policy::Cause;
use gavel::domain::{Actor, DeliveryStatus, EventKind, ItemStatus, Mode, Outcome, Phase, Verdict};
use gavel::store::*;
use gavel_tests::server::Setup;
use std::time::Duration;

/// A store on a fresh database of `setup` (dropped with the directory).
pub(crate) async fn open(setup: Setup) -> (SharedStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    (setup.store(dir.path()).await, dir)
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
        fingerprint: gavel::fingerprint::fingerprint(&format!("hello {id}")),
        correlation_id: "test".into(),
        now: now_ms(),
    }
}

fn body(item: &Item) -> String {
    format!(r#"{{"id":"{}","status":"{}"}}"#, item.id, item.status)
}

/// A submission with no sync verdict, no key.
fn write(item: NewItem) -> ItemWrite {
    ItemWrite {
        item,
        sync_verdict: None,
        sync_reason: String::new(),
        decisions: Vec::new(),
        degraded: false,
        duplicates: DuplicateRule {
            window_ms: 3_600_000,
            hold_at: 5,
        },
        standing: Default::default(),
        key: None,
        respond: body,
    }
}

pub(crate) async fn create(store: &SharedStore, id: &str) -> Item {
    created(store.create_items(&[write(new_item(id))]).await.unwrap().remove(0))
}

fn created(outcome: CreateOutcome) -> Item {
    match outcome {
        CreateOutcome::Created { item, .. } => item,
        other => panic!("{other:?}"),
    }
}

fn event(id: &str, kind: EventKind, actor: &str) -> EventWrite {
    EventWrite {
        event: NewEvent {
            item_id: id.into(),
            kind,
            actor: actor.into(),
            text: None,
            fingerprint: None,
            owner: None,
            now: now_ms(),
        },
        key: None,
        respond: |a| format!(r#"{{"seq":{}}}"#, a.event_seq),
    }
}

pub(crate) async fn append(store: &SharedStore, id: &str, kind: EventKind, actor: &str) -> EventOutcome {
    store.append_events(&[event(id, kind, actor)]).await.unwrap().remove(0)
}

pub(crate) async fn snapshot(store: &SharedStore, id: &str) -> SnapshotData {
    let windows = SnapshotWindows {
        author_since: 0,
        duplicate_since: 0,
        standing_since: 0,
    };
    store.snapshots(&[id], windows).await.unwrap().pop().unwrap()
}

pub(crate) fn request(id: &str, version: i64, from: ItemStatus, to: ItemStatus, actor: Actor) -> TransitionRequest {
    TransitionRequest {
        item_id: id.into(),
        expected_version: version,
        from,
        to,
        actor,
        actor_name: (actor == Actor::Moderator).then(|| "mod".into()),
        actor_note: None,
        cause: Cause::Moderation,
        reason: "test".into(),
        correlation_id: "test".into(),
        now: now_ms(),
        policy: None,
        until: None,
        appeal: None,
    }
}

pub(crate) fn decision(plugin: &str) -> NewDecision {
    NewDecision {
        plugin: plugin.into(),
        plugin_version: "1.0.0".into(),
        plugin_digest: "ab".repeat(32),
        phase: Phase::Async.into(),
        verdict: Some(Verdict::Hold),
        score: 0.5,
        labels: vec!["x".into()],
        reason: "because".into(),
        mode: Mode::Enforce,
        applied: true,
        duration_us: 12,
        outcome: Outcome::Ok,
        error: None,
        decided_at: now_ms(),
        inputs: None,
        weighs: true,
        lists: Vec::new(),
    }
}

/// An evaluation commit of `data`'s snapshot, to `to`.
pub(crate) fn commit_of(data: &SnapshotData, to: Option<ItemStatus>) -> EvaluationCommit {
    EvaluationCommit {
        item_id: data.item.id.clone(),
        snapshot_version: data.item.version,
        snapshot_event_seq: data.item.event_seq,
        snapshot_round: data.item.eval_round,
        from: data.item.status,
        to,
        decisions: vec![decision("r")],
        reason: "r".into(),
        correlation_id: "c".into(),
        now: now_ms(),
        handoff: None,
    }
}

pub(crate) async fn commit(store: &SharedStore, c: EvaluationCommit) -> CommitOutcome {
    store.commit_evaluations(&[c]).await.unwrap().remove(0)
}

/// Fans out until `endpoints` together hold `deliveries` deliveries (on
/// PostgreSQL the feed shows a commit once every older transaction in the
/// cluster has ended, so a round may not see it yet, and how many events one
/// round advances over depends on that timing).
async fn fan_out_until(store: &SharedStore, endpoints: &[EndpointFilter], now: i64, deliveries: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        store.fan_out(endpoints, now, 100).await.unwrap();
        let names: Vec<&str> = endpoints.iter().map(|e| e.name.as_str()).collect();
        let have = store
            .deliveries(true, 1000)
            .await
            .unwrap()
            .iter()
            .filter(|d| names.contains(&d.endpoint.as_str()))
            .count();
        if have >= deliveries {
            assert_eq!(have, deliveries, "no delivery twice");
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{have} of {deliveries} deliveries"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The changes feed's events of item `id`, once it shows at least `n` (on
/// PostgreSQL the feed shows a commit once every older transaction in the
/// cluster has ended, so it may lag a moment behind).
async fn changes_of(store: &SharedStore, id: &str, n: usize) -> Vec<Change> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let events: Vec<Change> = store
            .changes(None, ChangeCursor::default(), 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|c| c.item_id.as_deref() == Some(id))
            .collect();
        if events.len() >= n || std::time::Instant::now() > deadline {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// P2: 32 concurrent moderator and automated transitions from one state:
/// exactly one succeeds, exactly one audit row, one outbox event.
async fn concurrent_transitions_from_one_state_have_one_winner(setup: Setup) {
    let (store, _dir) = open(setup).await;
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
        let events: Vec<_> = changes_of(&store, &id, 2)
            .await
            .into_iter()
            .map(|c| (c.event_id, c.item_version, c.to_status))
            .collect();
        assert_eq!(
            events,
            vec![
                (format!("{id}:1"), 1, ItemStatus::PendingScan.to_string()),
                (format!("{id}:2"), 2, details.item.status.to_string())
            ]
        );
    }
}

/// P2, every commit path: an item waiting on a provider is decided at once
/// by a moderator, an evaluation that moves it, one that only records, the
/// provider's callback (before the deadline) and the deadline expiry (run
/// as if the deadline had passed). Exactly one status change applies, with one audit row
/// and one outbox event; nobody gets an error (on PostgreSQL every path
/// locks the item first: no deadlock).
async fn every_commit_path_racing_on_one_item_has_one_winner(setup: Setup) {
    let (store, _dir) = open(setup).await;
    for round in 0..10 {
        let id = format!("item-race-{round}");
        create(&store, &id).await;
        let data = snapshot(&store, &id).await;
        let handoff = EvaluationCommit {
            handoff: Some(Handoff {
                provider: "classifier".into(),
                deadline_at: now_ms() + 60_000,
            }),
            ..commit_of(&data, Some(ItemStatus::AwaitingProvider))
        };
        assert_eq!(
            commit(&store, handoff).await,
            CommitOutcome::Transitioned { version: 2 }
        );
        let waiting = snapshot(&store, &id).await;
        let key = provider_request_key(&id, 2, "classifier");
        let mut tasks = tokio::task::JoinSet::new();
        {
            let (store, req) = (
                store.clone(),
                request(
                    &id,
                    2,
                    ItemStatus::AwaitingProvider,
                    ItemStatus::Rejected,
                    Actor::Moderator,
                ),
            );
            tasks.spawn(async move { matches!(store.transition(&req).await.unwrap(), Transition::Applied { .. }) });
        }
        {
            let (store, c) = (store.clone(), commit_of(&waiting, Some(ItemStatus::Visible)));
            tasks.spawn(async move { matches!(commit(&store, c).await, CommitOutcome::Transitioned { .. }) });
        }
        {
            let (store, c) = (store.clone(), commit_of(&waiting, None));
            tasks.spawn(async move {
                commit(&store, c).await;
                false
            });
        }
        {
            let store = store.clone();
            let cb = NewCallback {
                provider: "classifier".into(),
                event_id: format!("ev-{round}"),
                request_key: key.clone(),
                item_id: id.clone(),
                payload: "{}".into(),
                verdict: Verdict::Hold,
                score: 0.5,
                labels: vec![],
                reason: "model".into(),
                weighs: true,
                now: now_ms(),
            };
            tasks.spawn(async move {
                matches!(
                    store.apply_callback(&cb).await.unwrap(),
                    CallbackOutcome::Applied { .. }
                )
            });
        }
        {
            let store = store.clone();
            tasks.spawn(async move {
                store
                    .expire_provider_requests(now_ms() + 120_000, 10)
                    .await
                    .unwrap()
                    .iter()
                    .any(|e| e.version.is_some())
            });
        }
        let winners = tasks.join_all().await.into_iter().filter(|w| *w).count();
        assert_eq!(winners, 1, "round {round}: exactly one status change");
        let details = store.item_details(&id).await.unwrap().unwrap();
        assert_eq!(details.item.version, 3, "round {round}");
        assert_eq!(
            details.transitions.len(),
            3,
            "round {round}: creation, hand-off, the winner"
        );
        assert_eq!(details.transitions[2].to_status, details.item.status);
        assert_eq!(
            changes_of(&store, &id, 3).await.len(),
            3,
            "one outbox event per transition"
        );
        let active = details
            .provider_requests
            .iter()
            .filter(|r| r.status.is_active())
            .count();
        assert_eq!(active, 0, "round {round}: the request is settled");
    }
}

/// Q7: worker A reads a snapshot and stalls; an event arrives; worker B
/// reads the newer snapshot and commits a no-change evaluation; A then
/// commits a status change. A is refused (counted stale): the status
/// follows the newest snapshot and nothing is stranded.
async fn an_older_snapshot_never_overwrites_a_newer_evaluation(setup: Setup) {
    let (store, _dir) = open(setup).await;
    create(&store, "item-q7").await;
    append(&store, "item-q7", EventKind::Flag, "u1").await;
    let a = snapshot(&store, "item-q7").await;
    append(&store, "item-q7", EventKind::Upvote, "u2").await;
    let b = snapshot(&store, "item-q7").await;
    assert_eq!(
        (a.item.version, b.item.version),
        (1, 1),
        "events do not change the version"
    );
    assert_eq!(commit(&store, commit_of(&b, None)).await, CommitOutcome::Recorded);
    assert_eq!(
        commit(&store, commit_of(&a, Some(ItemStatus::HeldForReview))).await,
        CommitOutcome::Stale
    );
    assert_eq!(
        commit(&store, commit_of(&a, None)).await,
        CommitOutcome::Stale,
        "an older record too"
    );
    let item = store.item("item-q7").await.unwrap().unwrap();
    assert_eq!(item.status, ItemStatus::PendingScan);
    assert_eq!((item.version, item.evaluated_seq), (1, 2));
    assert_eq!(item.needs_eval_since, None, "B judged every event");
    let d = store.item_details("item-q7").await.unwrap().unwrap();
    assert_eq!(d.decisions.len(), 1, "only B's decision");
    // The same snapshot committed twice (a lease lost between two workers
    // judging one state) is fine once; the status change fences the rest.
    let c = snapshot(&store, "item-q7").await;
    assert_eq!(
        commit(&store, commit_of(&c, Some(ItemStatus::Visible))).await,
        CommitOutcome::Transitioned { version: 2 }
    );
    assert_eq!(
        commit(&store, commit_of(&c, Some(ItemStatus::Rejected))).await,
        CommitOutcome::Stale
    );
    // Two workers judging one snapshot and both leaving the status as it
    // is: only the first records its decisions.
    let e = snapshot(&store, "item-q7").await;
    assert_eq!(commit(&store, commit_of(&e, None)).await, CommitOutcome::Recorded);
    assert_eq!(commit(&store, commit_of(&e, None)).await, CommitOutcome::Stale);
    let d = store.item_details("item-q7").await.unwrap().unwrap();
    assert_eq!(d.decisions.len(), 3, "B's, c's and e's first commit, no duplicate");
}

/// Deliveries of one item to one endpoint are claimed in version order: a
/// later version waits while an earlier one is pending (even when it is
/// failing), and goes once the earlier one is delivered or dead.
async fn deliveries_are_claimed_in_version_order(setup: Setup) {
    let (store, _dir) = open(setup).await;
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
    let cursors = [("all", FeedStart::Earliest), ("rejections", FeedStart::Earliest)];
    store.register_endpoints(&cursors, now).await.unwrap();
    // "all" gets the four versions, "rejections" only the last.
    fan_out_until(&store, &endpoints, now, 5).await;
    assert_eq!(store.fan_out(&endpoints, now, 100).await.unwrap(), 0, "fanned out once");
    let claim = |at: i64, known: &'static [&'static str]| {
        let store = store.clone();
        async move {
            let mut c: Vec<(String, i64)> = store
                .claim_deliveries(known, at, at + 1_000, 100)
                .await
                .unwrap()
                .into_iter()
                .map(|d| (d.endpoint, d.change.item_version))
                .collect();
            c.sort();
            c
        }
    };
    const BOTH: &[&str] = &["all", "rejections"];
    // A process that knows neither endpoint claims nothing.
    assert!(claim(now, &["elsewhere"]).await.is_empty());
    // Version 1 for "all"; "rejections" only wants version 4, its first.
    let first = claim(now, BOTH).await;
    assert_eq!(first, vec![("all".to_string(), 1), ("rejections".to_string(), 4)]);
    assert!(claim(now, BOTH).await.is_empty(), "claimed deliveries are leased");
    let all = store.deliveries(true, 100).await.unwrap();
    let id_of = |v: i64| {
        all.iter()
            .find(|d| d.endpoint == "all" && d.item_version == v)
            .unwrap()
            .id
    };
    let record = |id: i64, attempts: i64, outcome: DeliveryOutcome| {
        let store = store.clone();
        async move {
            let r = DeliveryResult { id, attempts, outcome };
            store.record_deliveries(&[r]).await.unwrap()[0]
        }
    };
    let retry = |at: i64, error: &str| DeliveryOutcome::Retry {
        at,
        error: error.to_string(),
    };
    let dead = |error: &str| DeliveryOutcome::Dead {
        error: error.to_string(),
    };
    // Version 1 fails and is retried later: version 2 must still wait.
    assert!(record(id_of(1), 1, retry(now + 10, "HTTP 500")).await);
    assert_eq!(claim(now + 5, BOTH).await, Vec::<(String, i64)>::new());
    assert_eq!(claim(now + 20, BOTH).await, vec![("all".to_string(), 1)]);
    // The first attempt's dispatcher, resuming late, cannot move the second
    // claim's retry nor kill the delivery under it.
    for late in [retry(now + 5_000, "late"), dead("late")] {
        assert!(!record(id_of(1), 1, late).await, "a failure of an earlier claim");
    }
    let v1 = store.deliveries(true, 100).await.unwrap();
    let v1 = v1.iter().find(|d| d.id == id_of(1)).unwrap();
    assert_eq!(
        (v1.status, v1.attempts, v1.next_attempt_at, v1.last_error.as_deref()),
        (DeliveryStatus::Pending, 2, now + 20 + 1_000, Some("HTTP 500"))
    );
    // Results recorded together are each decided on their own.
    let together = [
        DeliveryResult {
            id: id_of(1),
            attempts: 1,
            outcome: dead("late again"),
        },
        DeliveryResult {
            id: id_of(1),
            attempts: 2,
            outcome: DeliveryOutcome::Delivered { at: now + 21 },
        },
    ];
    assert_eq!(store.record_deliveries(&together).await.unwrap(), [false, true]);
    assert_eq!(claim(now + 22, BOTH).await, vec![("all".to_string(), 2)]);
    // A dead delivery no longer holds the item back; replay makes it pending again.
    assert!(record(id_of(2), 1, dead("HTTP 410")).await);
    assert_eq!(claim(now + 23, BOTH).await, vec![("all".to_string(), 3)]);
    let dead = store.deliveries(false, 100).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].item_version, dead[0].last_error.as_deref()),
        (2, Some("HTTP 410"))
    );
    assert_eq!(dead[0].status, DeliveryStatus::Dead);
    assert!(store.replay_delivery(dead[0].id, now + 24).await.unwrap());
    assert!(
        !store.replay_delivery(dead[0].id, now + 24).await.unwrap(),
        "only a dead one"
    );
}

/// A manual decision wins: later automated transitions and evaluation
/// commits are refused by the conditional update itself.
async fn automated_changes_are_refused_after_a_moderator_decided(setup: Setup) {
    let (store, _dir) = open(setup).await;
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
    let data = snapshot(&store, "item-m").await;
    assert_eq!(
        commit(&store, commit_of(&data, Some(ItemStatus::Rejected))).await,
        CommitOutcome::Stale
    );
    let d = store.item_details("item-m").await.unwrap().unwrap();
    assert_eq!(d.item.status, ItemStatus::Visible);
    assert_eq!(d.item.decided_by, Some(Actor::Moderator));
    assert!(d.decisions.is_empty(), "a refused commit writes nothing");
    assert_eq!(d.transitions[1].actor_name.as_deref(), Some("mod"));
    // The moderator may still change their mind.
    let again = request("item-m", 2, ItemStatus::Visible, ItemStatus::Rejected, Actor::Moderator);
    assert_eq!(
        store.transition(&again).await.unwrap(),
        Transition::Applied { version: 3 }
    );
}

/// Evaluation commits are fenced by the snapshot; an event after the
/// snapshot keeps the item scheduled.
async fn evaluation_commits_are_fenced_and_keep_late_events_scheduled(setup: Setup) {
    let (store, _dir) = open(setup).await;
    create(&store, "item-e").await;
    for actor in ["u1", "u2", "u3"] {
        assert!(matches!(
            append(&store, "item-e", EventKind::Flag, actor).await,
            EventOutcome::Appended(_)
        ));
    }
    let data = snapshot(&store, "item-e").await;
    assert_eq!(data.counters, vec![("flag".to_string(), 3)]);
    assert_eq!(data.trigger.len(), 3);
    assert_eq!(data.item.event_seq, 3);
    // An event lands while the evaluation runs.
    append(&store, "item-e", EventKind::Upvote, "u4").await;
    let c = EvaluationCommit {
        decisions: vec![decision("a"), decision("b")],
        ..commit_of(&data, Some(ItemStatus::HeldForReview))
    };
    assert_eq!(
        commit(&store, c.clone()).await,
        CommitOutcome::Transitioned { version: 2 }
    );
    let item = store.item("item-e").await.unwrap().unwrap();
    assert!(
        item.needs_eval_since.is_some(),
        "the late event still needs an evaluation"
    );
    let pending = store.pending_evaluations(now_ms(), None, 10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].1, "item-e");
    // The same snapshot committed again (a second worker after lease loss) is refused.
    assert_eq!(commit(&store, c).await, CommitOutcome::Stale);
    let d = store.item_details("item-e").await.unwrap().unwrap();
    assert_eq!(d.decisions.len(), 2);
    assert_eq!(d.transitions.len(), 2);
    // A follow-up that saw every event clears the mark without a transition.
    let data = snapshot(&store, "item-e").await;
    assert_eq!(data.trigger.len(), 1, "only the event since the last evaluation");
    assert_eq!(commit(&store, commit_of(&data, None)).await, CommitOutcome::Recorded);
    assert_eq!(store.item("item-e").await.unwrap().unwrap().needs_eval_since, None);
}

/// Idempotency keys: claimed by the unique constraint, replayed, reused
/// with another request, per scope, and released only by their token.
async fn idempotency_keys_claim_replay_and_mismatch(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let claim = |hash: &str, scope: &str| IdempotencyClaim {
        scope: scope.into(),
        key: "k-1".into(),
        request_hash: hash.into(),
        lock_ms: 60_000,
        ttl_ms: 600_000,
    };
    let IdempotencyStart::Started { token } = store.idempotency_start(&claim("h1", "web")).await.unwrap() else {
        panic!("a new key starts")
    };
    assert_eq!(
        store.idempotency_start(&claim("h1", "web")).await.unwrap(),
        IdempotencyStart::InFlight
    );
    assert_eq!(
        store.idempotency_start(&claim("h2", "web")).await.unwrap(),
        IdempotencyStart::Mismatch
    );
    // Another token cannot release it; its own can.
    store.idempotency_release("web", "k-1", "not-the-token").await.unwrap();
    assert_eq!(
        store.idempotency_start(&claim("h1", "web")).await.unwrap(),
        IdempotencyStart::InFlight
    );
    store.idempotency_release("web", "k-1", &token).await.unwrap();
    let IdempotencyStart::Started { token } = store.idempotency_start(&claim("h1", "web")).await.unwrap() else {
        panic!("a released key starts again")
    };
    let w = ItemWrite {
        key: Some(KeyCompletion {
            scope: "web".into(),
            key: "k-1".into(),
            token,
            status: 202,
        }),
        ..write(new_item("item-i"))
    };
    let item = created(store.create_items(&[w]).await.unwrap().remove(0));
    assert_eq!(
        store.idempotency_start(&claim("h1", "web")).await.unwrap(),
        IdempotencyStart::Replay {
            status: 202,
            body: body(&item),
        }
    );
    // Another scope is another key.
    assert!(matches!(
        store.idempotency_start(&claim("h1", "app")).await.unwrap(),
        IdempotencyStart::Started { .. }
    ));
}

/// I6: a request still in flight when its key's lock expires; a retry takes
/// the key over. Exactly one effect commits (the claim token is checked in
/// the effect's own transaction), and the stored response is that one's.
/// Expired keys are deleted by retention (by the database's clock).
async fn a_key_taken_over_after_its_lock_lets_one_effect_commit(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let claim = IdempotencyClaim {
        scope: "web".into(),
        key: "slow".into(),
        request_hash: "h".into(),
        lock_ms: 100,
        ttl_ms: 1_000,
    };
    let IdempotencyStart::Started { token: first } = store.idempotency_start(&claim).await.unwrap() else {
        panic!()
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let IdempotencyStart::Started { token: retry } = store.idempotency_start(&claim).await.unwrap() else {
        panic!("after the lock, the same request takes the key over")
    };
    assert_ne!(first, retry);
    let keyed = |id: &str, token: &str| ItemWrite {
        key: Some(KeyCompletion {
            scope: "web".into(),
            key: "slow".into(),
            token: token.into(),
            status: 202,
        }),
        ..write(new_item(id))
    };
    // Both effects in one batch and in separate ones: only the holder's commits.
    let outcomes = store
        .create_items(&[keyed("item-slow", &first), keyed("item-retry", &retry)])
        .await
        .unwrap();
    assert_eq!(outcomes[0], CreateOutcome::KeyLost);
    let item = created(outcomes[1].clone());
    assert!(
        store.item("item-slow").await.unwrap().is_none(),
        "the slow request's effect was not applied"
    );
    assert_eq!(
        store.create_items(&[keyed("item-slow-2", &first)]).await.unwrap()[0],
        CreateOutcome::KeyLost
    );
    assert_eq!(
        store.idempotency_start(&claim).await.unwrap(),
        IdempotencyStart::Replay {
            status: 202,
            body: body(&item)
        }
    );
    // Events complete keys the same way.
    let IdempotencyStart::Started { token: e1 } = store
        .idempotency_start(&IdempotencyClaim {
            key: "ev".into(),
            ..claim.clone()
        })
        .await
        .unwrap()
    else {
        panic!()
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let IdempotencyStart::Started { token: e2 } = store
        .idempotency_start(&IdempotencyClaim {
            key: "ev".into(),
            ..claim.clone()
        })
        .await
        .unwrap()
    else {
        panic!()
    };
    let ev = |token: &str| EventWrite {
        key: Some(KeyCompletion {
            scope: "web".into(),
            key: "ev".into(),
            token: token.into(),
            status: 202,
        }),
        ..event("item-retry", EventKind::Flag, "u")
    };
    let outcomes = store.append_events(&[ev(&e1), ev(&e2)]).await.unwrap();
    assert_eq!(outcomes[0], EventOutcome::KeyLost);
    assert!(matches!(outcomes[1], EventOutcome::Appended(_)));
    assert_eq!(
        snapshot(&store, "item-retry").await.counters,
        vec![("flag".to_string(), 1)],
        "one vote, not two"
    );
    // Past their TTL, keys are deleted by retention.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let pruned = store.prune(&RetentionPolicy::default(), now_ms()).await.unwrap();
    assert_eq!(pruned.idempotency_keys, 2);
}

/// `external_id` is unique per client, decided by the constraint; a
/// duplicate releases its key at once.
async fn external_ids_are_unique_per_client(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let with_ext = |id: &str, client: &str| {
        write(NewItem {
            external_id: Some("post-1".into()),
            client: client.into(),
            ..new_item(id)
        })
    };
    created(
        store
            .create_items(&[with_ext("item-x1", "web")])
            .await
            .unwrap()
            .remove(0),
    );
    assert_eq!(
        store.create_items(&[with_ext("item-x2", "web")]).await.unwrap()[0],
        CreateOutcome::DuplicateExternalId {
            existing_id: "item-x1".into()
        }
    );
    assert!(store.item("item-x2").await.unwrap().is_none());
    created(
        store
            .create_items(&[with_ext("item-x3", "app")])
            .await
            .unwrap()
            .remove(0),
    );
}

/// The review queue pages through held items, oldest first, without gaps.
async fn review_queue_pages_without_gaps(setup: Setup) {
    let (store, _dir) = open(setup).await;
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
async fn batched_submissions_keep_each_outcome(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let ext = |id: &str, e: Option<&str>| ItemWrite {
        decisions: vec![decision("sync")],
        ..write(NewItem {
            external_id: e.map(Into::into),
            ..new_item(id)
        })
    };
    created(
        store
            .create_items(&[ext("item-b0", Some("ext-0"))])
            .await
            .unwrap()
            .remove(0),
    );
    let batch = [
        ext("item-b1", Some("ext-1")),
        ext("item-b2", Some("ext-0")),
        ext("item-b3", None),
        ext("item-b4", Some("ext-1")),
    ];
    let outcomes = store.create_items(&batch).await.unwrap();
    assert_eq!(outcomes.len(), 4);
    assert!(matches!(&outcomes[0], CreateOutcome::Created { item, .. } if item.id == "item-b1"));
    assert_eq!(
        outcomes[1],
        CreateOutcome::DuplicateExternalId {
            existing_id: "item-b0".into()
        }
    );
    assert!(matches!(&outcomes[2], CreateOutcome::Created { item, .. } if item.id == "item-b3"));
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
    assert_eq!(changes_of(&store, "item-b1", 1).await.len(), 1);
    assert_eq!(changes_of(&store, "item-b3", 1).await.len(), 1);
}

/// The duplicate-text check is decided inside the write's transaction,
/// with the author's row locked: however the copies are batched or raced,
/// exactly the copies from the threshold on are held.
async fn duplicate_text_is_counted_inside_the_transaction(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let copy = |i: usize| {
        let mut w = write(NewItem {
            body: "buy now".into(),
            fingerprint: gavel::fingerprint::fingerprint("buy now"),
            author: "spammer".into(),
            ..new_item(&format!("item-dup-{i}"))
        });
        w.duplicates.hold_at = 3;
        w
    };
    // Two in one batch, then eight racing in batches of one.
    let first = store.create_items(&[copy(0), copy(1)]).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 2..10 {
        let (store, w) = (store.clone(), copy(i));
        tasks.spawn(async move { store.create_items(&[w]).await.unwrap().remove(0) });
    }
    let mut statuses: Vec<ItemStatus> = first
        .into_iter()
        .chain(tasks.join_all().await)
        .map(|o| created(o).status)
        .collect();
    statuses.sort_by_key(|s| s.as_str());
    let held = statuses.iter().filter(|s| **s == ItemStatus::HeldForReview).count();
    assert_eq!(held, 8, "copies 3..=10 are held: {statuses:?}");
    let items = store.author_items("web", "spammer", 100).await.unwrap();
    assert_eq!(items.len(), 10);
}

/// An author's figures in a snapshot are exact below `HISTORY_CAP` and the
/// cap at or above it, whatever the author's history: `flood` has 1,005
/// items of one text (each a duplicate of all before it), `steady` has
/// `HISTORY_CAP`. The submission's duplicate check holds exactly the copies
/// from the `HISTORY_CAP`-th on when `hold_at` is the cap.
async fn author_figures_are_exact_below_the_cap_and_capped_above_it(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let cap = HISTORY_CAP as usize;
    let writes = |author: &str, n: usize, same_text: bool| -> Vec<ItemWrite> {
        (0..n)
            .map(|i| {
                let id = format!("{author}-{i:04}");
                let text = if same_text { "buy now".to_string() } else { id.clone() };
                let mut w = write(NewItem {
                    author: author.into(),
                    fingerprint: gavel::fingerprint::fingerprint(&text),
                    ..new_item(&id)
                });
                w.duplicates.hold_at = cap as u32;
                w
            })
            .collect()
    };
    let mut flood = Vec::new();
    for chunk in writes("flood", cap + 5, true).chunks(256) {
        flood.extend(store.create_items(chunk).await.unwrap().into_iter().map(created));
    }
    let mut steady = Vec::new();
    for chunk in writes("steady", cap, false).chunks(256) {
        steady.extend(store.create_items(chunk).await.unwrap().into_iter().map(created));
    }
    let held: Vec<usize> = (0..flood.len())
        .filter(|&i| flood[i].status == ItemStatus::HeldForReview)
        .collect();
    assert_eq!(
        held,
        (cap - 1..cap + 5).collect::<Vec<_>>(),
        "the copies from the cap-th on are held"
    );
    for item in &flood[..3] {
        let t = store
            .transition(&request(
                &item.id,
                item.version,
                item.status,
                ItemStatus::Rejected,
                Actor::Moderator,
            ))
            .await
            .unwrap();
        assert!(matches!(t, Transition::Applied { .. }), "{t:?}");
    }

    let flooded = snapshot(&store, &flood[10].id).await;
    assert_eq!(
        flooded.author_recent_items, HISTORY_CAP,
        "1,004 others, counted up to the cap"
    );
    assert_eq!(flooded.standing.items, HISTORY_CAP);
    assert_eq!(flooded.duplicate_count, HISTORY_CAP);
    assert_eq!(flooded.author_rejected_items, 3);
    assert_eq!(flooded.standing.rejected_items, 3);
    assert_eq!(flooded.author_held_items, 6);
    // The snapshot's own item is not among its author's figures.
    let rejected = snapshot(&store, &flood[0].id).await;
    assert_eq!(
        (rejected.author_rejected_items, rejected.standing.rejected_items),
        (2, 2)
    );
    let held = snapshot(&store, &flood[cap].id).await;
    assert_eq!(held.author_held_items, 5);

    let whole = snapshot(&store, "steady-0000").await;
    assert_eq!(whole.author_recent_items, HISTORY_CAP - 1, "exact below the cap");
    assert_eq!(whole.standing.items, HISTORY_CAP - 1);
    assert_eq!(
        (
            whole.duplicate_count,
            whole.author_rejected_items,
            whole.author_held_items
        ),
        (0, 0, 0)
    );

    // Windows of their own: each count is of the other items inside its
    // window, whichever of the two is wider.
    let since = |items: &[Item], i: usize| items[i].created_at;
    for (items, own, author_since, standing_since) in [
        (&flood, 10, since(&flood, 900), since(&flood, 2)),
        (&flood, 1003, since(&flood, 2), since(&flood, 900)),
        (&steady, 999, since(&steady, 600), since(&steady, 300)),
        (&steady, 0, since(&steady, 300), since(&steady, 600)),
    ] {
        let windows = SnapshotWindows {
            author_since,
            duplicate_since: 0,
            standing_since,
        };
        let data = store.snapshots(&[&items[own].id], windows).await.unwrap().remove(0);
        let others = |keep: &dyn Fn(&Item) -> bool| {
            let n = items.iter().enumerate().filter(|(i, it)| *i != own && keep(it)).count() as i64;
            n.min(HISTORY_CAP)
        };
        let rejected = |i: &Item| i.author == "flood" && i.id.as_str() <= "flood-0002";
        assert_eq!(data.author_recent_items, others(&|i| i.created_at >= author_since));
        assert_eq!(data.standing.items, others(&|i| i.created_at >= standing_since));
        assert_eq!(data.author_rejected_items, others(&rejected));
        assert_eq!(
            data.standing.rejected_items,
            others(&|i| rejected(i) && i.created_at >= standing_since)
        );
    }
}

/// Events in one batch: each gets its own sequence number and outcome; an
/// unknown or deleted item fails alone; counters count every event once.
async fn batched_events_each_count_once(setup: Setup) {
    let (store, _dir) = open(setup).await;
    create(&store, "item-ev").await;
    create(&store, "item-gone").await;
    let delete = request(
        "item-gone",
        1,
        ItemStatus::PendingScan,
        ItemStatus::Deleted,
        Actor::Moderator,
    );
    store.transition(&delete).await.unwrap();
    let outcomes = store
        .append_events(&[
            event("item-ev", EventKind::Flag, "a"),
            event("nope", EventKind::Flag, "b"),
            event("item-ev", EventKind::Flag, "c"),
            event("item-gone", EventKind::Flag, "d"),
            event("item-ev", EventKind::Upvote, "e"),
        ])
        .await
        .unwrap();
    let seqs: Vec<Option<i64>> = outcomes
        .iter()
        .map(|o| match o {
            EventOutcome::Appended(a) => Some(a.event_seq),
            _ => None,
        })
        .collect();
    assert_eq!(seqs, vec![Some(1), None, Some(2), None, Some(3)]);
    assert_eq!(outcomes[1], EventOutcome::NotFound);
    assert_eq!(outcomes[3], EventOutcome::Deleted);
    let data = snapshot(&store, "item-ev").await;
    assert_eq!(data.counters, vec![("flag".to_string(), 2), ("upvote".to_string(), 1)]);
    assert_eq!(
        data.trigger.iter().map(|t| t.1.as_str()).collect::<Vec<_>>(),
        ["a", "c", "e"]
    );
}

/// An item's counters are derived from its stored events: events appended
/// one by one and in a batch are all counted, per kind, and the counters
/// sum to the events stored. On PostgreSQL the insert itself counts, so an
/// event inserted with plain SQL is counted too; on SQLite the writer's one
/// append path counts (migrations/sqlite/0072_events_counted_by_the_writer.sql),
/// and the fourth event goes through it alone.
async fn counters_are_derived_from_the_events_stored(setup: Setup) {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let url = setup.database_url(dir.path()).await;
    let store = gavel::store::open_url(&url, 4).await.unwrap();
    create(&store, "item-counted").await;
    append(&store, "item-counted", EventKind::Flag, "a").await;
    store
        .append_events(&[
            event("item-counted", EventKind::Flag, "b"),
            event("item-counted", EventKind::Upvote, "c"),
        ])
        .await
        .unwrap();
    if url.starts_with("postgres") {
        let insert = "INSERT INTO events (item_id, seq, kind, actor, payload, created_at) \
                      VALUES ('item-counted', 4, 'report', 'direct', NULL, 0)";
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::query(insert).execute(&mut conn).await.unwrap();
    } else {
        append(&store, "item-counted", EventKind::Report, "direct").await;
    }
    let data = snapshot(&store, "item-counted").await;
    assert_eq!(
        data.counters,
        vec![
            ("flag".to_string(), 2),
            ("report".to_string(), 1),
            ("upvote".to_string(), 1)
        ]
    );
}

/// A plain connection to a SQLite store that enforces foreign keys (a new
/// connection does not by default), for the statements the tests write by hand.
async fn sqlite_with_foreign_keys(url: &str) -> sqlx::SqliteConnection {
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
    sqlx::query("PRAGMA foreign_keys = ON")
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

/// Q11: every transition has its outbox event, in the transaction that
/// inserts it (on PostgreSQL by a trigger in the inserting statement; on
/// SQLite by the store right after the insert, on the writer's path and on
/// the cold paths alike): batches of submissions and of evaluation commits
/// (multi-row statements on PostgreSQL) and a moderator's decision leave
/// exactly one event per transition, in transition order, and a statement
/// naming an item that does not exist stores neither its transitions nor
/// their events.
async fn every_transition_has_its_outbox_event_in_order(setup: Setup) {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let url = setup.database_url(dir.path()).await;
    let store = gavel::store::open_url(&url, 4).await.unwrap();
    let ids: Vec<String> = (0..40).map(|i| format!("item-o{i:02}")).collect();
    let writes: Vec<ItemWrite> = ids.iter().map(|id| write(new_item(id))).collect();
    for outcome in store.create_items(&writes).await.unwrap() {
        created(outcome);
    }
    let mut commits = Vec::new();
    for id in ids.iter().rev() {
        commits.push(commit_of(&snapshot(&store, id).await, Some(ItemStatus::Visible)));
    }
    for outcome in store.commit_evaluations(&commits).await.unwrap() {
        assert_eq!(outcome, CommitOutcome::Transitioned { version: 2 });
    }
    // A moderator's decision goes through the cold paths' shared code.
    crate::standing::moderate(&store, "item-o07", ItemStatus::Rejected).await;
    let bad = "INSERT INTO transitions (item_id, from_status, to_status, version, cause, actor, reason, \
               correlation_id, created_at) VALUES \
               ('item-o00', 'visible', 'held_for_review', 3, 'moderation', 'moderator', 'r', 'c', 0), \
               ('item-missing', 'visible', 'held_for_review', 2, 'moderation', 'moderator', 'r', 'c', 0)";
    let transitions = "SELECT item_id || ':' || version FROM transitions ORDER BY id";
    let events = "SELECT event_id FROM outbox WHERE kind <> 'author' ORDER BY seq";
    let (refused, transitions, events): (bool, Vec<String>, Vec<String>) = if url.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        (
            sqlx::query(bad).execute(&mut conn).await.is_err(),
            sqlx::query_scalar(transitions).fetch_all(&mut conn).await.unwrap(),
            sqlx::query_scalar(events).fetch_all(&mut conn).await.unwrap(),
        )
    } else {
        let mut conn = sqlite_with_foreign_keys(&url).await;
        (
            sqlx::query(bad).execute(&mut conn).await.is_err(),
            sqlx::query_scalar(transitions).fetch_all(&mut conn).await.unwrap(),
            sqlx::query_scalar(events).fetch_all(&mut conn).await.unwrap(),
        )
    };
    assert!(refused, "a transition of an unknown item is refused");
    assert_eq!(transitions.len(), 81, "{transitions:?}");
    let mut applied = transitions.clone();
    applied.sort();
    let mut expected: Vec<String> = ids
        .iter()
        .flat_map(|id| [format!("{id}:1"), format!("{id}:2")])
        .chain(["item-o07:3".to_string()])
        .collect();
    expected.sort();
    assert_eq!(applied, expected);
    assert_eq!(events, transitions, "one event per transition, in transition order");
}

/// Q13: a decision names only an item and a code (`plugin_refs`) row that
/// exist, and those rows stay (foreign keys, on both stores): written by
/// hand, a statement with one row naming nothing stores none of its rows,
/// a decision cannot be moved to an item that does not exist, and the rows
/// decisions name cannot be deleted.
async fn decisions_name_only_rows_that_exist_and_keep_them(setup: Setup) {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let url = setup.database_url(dir.path()).await;
    let store = gavel::store::open_url(&url, 4).await.unwrap();
    let item = create(&store, "item-named").await;
    let data = snapshot(&store, &item.id).await;
    assert_eq!(
        commit(&store, commit_of(&data, Some(ItemStatus::Visible))).await,
        CommitOutcome::Transitioned { version: 2 }
    );
    let insert = |item: &str, code: &str| {
        format!(
            "INSERT INTO decisions (item_id, item_version, plugin, plugin_ref, phase, verdict, score, labels, \
             reason, mode, applied, duration_us, outcome, created_at) VALUES \
             ('item-named', 2, 'r', (SELECT MIN(id) FROM plugin_refs), 'async', 'allow', 0, '[]', 'r', 'enforce', \
             true, 1, 'ok', 0), \
             ('{item}', 2, 'r', {code}, 'async', 'allow', 0, '[]', 'r', 'enforce', true, 1, 'ok', 0)"
        )
    };
    let statements = [
        insert("item-missing", "(SELECT MIN(id) FROM plugin_refs)"),
        insert("item-named", "(SELECT MAX(id) + 1 FROM plugin_refs)"),
        "DELETE FROM items WHERE id = 'item-named'".to_string(),
        "DELETE FROM plugin_refs".to_string(),
        "UPDATE decisions SET item_id = 'item-missing'".to_string(),
    ];
    let valid = insert("item-named", "(SELECT MIN(id) FROM plugin_refs)");
    let count = "SELECT (SELECT COUNT(*) FROM decisions) * 1000 + (SELECT COUNT(*) FROM items) * 100 \
                 + (SELECT COUNT(*) FROM plugin_refs)";
    macro_rules! check {
        ($conn:expr) => {{
            let before: i64 = sqlx::query_scalar(count).fetch_one(&mut $conn).await.unwrap();
            let refused: Vec<bool> = {
                let mut out = Vec::new();
                for sql in &statements {
                    out.push(sqlx::query(sql).execute(&mut $conn).await.is_err());
                }
                out
            };
            let unchanged: i64 = sqlx::query_scalar(count).fetch_one(&mut $conn).await.unwrap();
            sqlx::query(&valid).execute(&mut $conn).await.unwrap();
            let after: i64 = sqlx::query_scalar(count).fetch_one(&mut $conn).await.unwrap();
            (before, refused, unchanged, after)
        }};
    }
    let (before, refused, unchanged, after) = if url.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        check!(conn)
    } else {
        let mut conn = sqlite_with_foreign_keys(&url).await;
        check!(conn)
    };
    assert_eq!(refused, vec![true; statements.len()], "{statements:#?}");
    assert_eq!(unchanged, before, "a refused statement stores none of its rows");
    assert_eq!(after, before + 2000, "two decisions naming rows that exist are stored");
}

/// Group commit: a batch of evaluation commits keeps every fence; a stale
/// one in the middle writes nothing and the others apply.
async fn batched_evaluation_commits_are_each_fenced(setup: Setup) {
    let (store, _dir) = open(setup).await;
    for id in ["item-e1", "item-e2", "item-e3"] {
        create(&store, id).await;
    }
    let snaps = [
        snapshot(&store, "item-e1").await,
        snapshot(&store, "item-e2").await,
        snapshot(&store, "item-e3").await,
    ];
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
    let outcomes = store
        .commit_evaluations(&[
            commit_of(&snaps[0], Some(ItemStatus::HeldForReview)),
            commit_of(&snaps[1], Some(ItemStatus::Rejected)),
            commit_of(&snaps[2], None),
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
    assert_eq!((e1.transitions.len(), e1.decisions.len()), (2, 1));
    let e2 = store.item_details("item-e2").await.unwrap().unwrap();
    assert_eq!(e2.item.status, ItemStatus::Visible);
    assert!(e2.decisions.is_empty(), "a stale commit in a batch writes nothing");
    let e3 = store.item_details("item-e3").await.unwrap().unwrap();
    assert_eq!(e3.item.status, ItemStatus::PendingScan);
    assert_eq!(e3.item.needs_eval_since, None);
    assert_eq!(e3.decisions.len(), 1);
    // Two commits of one item in one batch: applied in order, each fenced.
    let snap = snapshot(&store, "item-e3").await;
    let outcomes = store
        .commit_evaluations(&[
            commit_of(&snap, Some(ItemStatus::Visible)),
            commit_of(&snap, Some(ItemStatus::Rejected)),
        ])
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [CommitOutcome::Transitioned { version: 2 }, CommitOutcome::Stale]
    );
}

/// Group commit through [`Writes`]: many concurrent submissions share
/// transactions; one that cannot commit (its id is taken) fails alone, and
/// every other one is stored with its audit row.
async fn a_failing_write_fails_alone_in_a_group_commit(setup: Setup) {
    let (store, _dir) = open(setup).await;
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
            let outcome = writes.create_item(write(new_item(&id))).await;
            (id, outcome)
        });
    }
    let mut failed = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let (id, outcome) = r.unwrap();
        match outcome {
            Ok(CreateOutcome::Created { item, .. }) => assert_eq!(item.id, id),
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

/// Retention deletes what is past its time and nothing else: evaluated
/// events (never one still waiting for its evaluation), delivered
/// deliveries and their outbox rows (never a pending or dead one), old
/// callbacks.
async fn retention_deletes_only_what_is_past_its_time(setup: Setup) {
    let (store, _dir) = open(setup).await;
    create(&store, "item-old").await;
    append(&store, "item-old", EventKind::Flag, "u1").await;
    let data = snapshot(&store, "item-old").await;
    assert_eq!(
        commit(&store, commit_of(&data, Some(ItemStatus::Visible))).await,
        CommitOutcome::Transitioned { version: 2 }
    );
    append(&store, "item-old", EventKind::Flag, "u2").await; // not evaluated yet
    let endpoints = [EndpointFilter {
        name: "all".into(),
        statuses: vec![],
        kinds: vec![],
    }];
    store
        .register_endpoints(&[("all", FeedStart::Earliest)], now_ms())
        .await
        .unwrap();
    fan_out_until(&store, &endpoints, now_ms(), 2).await;
    let claimed = store
        .claim_deliveries(&["all"], now_ms(), now_ms() + 1_000, 10)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "version 1 first");
    let delivered = DeliveryResult {
        id: claimed[0].id,
        attempts: claimed[0].attempts,
        outcome: DeliveryOutcome::Delivered { at: now_ms() },
    };
    assert_eq!(store.record_deliveries(&[delivered]).await.unwrap(), [true]);
    // Keep everything younger than an hour: nothing goes.
    let policy = RetentionPolicy {
        outbox_ms: Some(3_600_000),
        events_ms: Some(3_600_000),
        callbacks_ms: Some(3_600_000),
        ..RetentionPolicy::default()
    };
    assert_eq!(store.prune(&policy, now_ms()).await.unwrap().total(), 0);
    // A day later: the evaluated event, the delivered delivery and its outbox row.
    let later = now_ms() + 86_400_000;
    let pruned = store.prune(&policy, later).await.unwrap();
    assert_eq!(
        (pruned.events, pruned.deliveries, pruned.outbox),
        (1, 1, 1),
        "{pruned:?}"
    );
    let data = snapshot(&store, "item-old").await;
    assert_eq!(
        data.trigger.len(),
        1,
        "the event still waiting for its evaluation stays"
    );
    assert_eq!(
        data.counters,
        vec![("flag".to_string(), 2)],
        "counters keep their totals"
    );
    assert_eq!(
        store.deliveries(true, 10).await.unwrap().len(),
        1,
        "version 2's delivery is still pending"
    );
    assert_eq!(store.prune(&policy, later).await.unwrap().total(), 0, "caught up");
}

/// Retention finds old events and outbox rows in key order (their tables
/// have no index on `created_at`): a row created after the cutoff is never
/// deleted, even with older ones after it in key order, and those go once
/// the rows before them are past their time too.
async fn retention_reads_in_key_order_and_never_deletes_a_young_row(setup: Setup) {
    let (store, _dir) = open(setup).await;
    create(&store, "item-k").await;
    let hour = 3_600_000;
    let t = now_ms();
    // In key order: created 3 h ago, now, 2 h ago, 4 h ago.
    for (actor, at) in [
        ("old", t - 3 * hour),
        ("young", t),
        ("late", t - 2 * hour),
        ("later", t - 4 * hour),
    ] {
        let mut e = event("item-k", EventKind::Flag, actor);
        e.event.now = at;
        assert!(matches!(
            store.append_events(&[e]).await.unwrap().remove(0),
            EventOutcome::Appended(_)
        ));
    }
    let data = snapshot(&store, "item-k").await;
    assert_eq!(commit(&store, commit_of(&data, None)).await, CommitOutcome::Recorded);
    let policy = RetentionPolicy {
        outbox_ms: None,
        events_ms: Some(hour),
        callbacks_ms: None,
        snapshots_ms: None,
        ..RetentionPolicy::default()
    };
    let actors = async || -> Vec<String> {
        let details = store.item_details("item-k").await.unwrap().unwrap();
        details.events.into_iter().map(|e| e.actor).collect()
    };
    // The bisection lands on the last key (it probes the third row, then
    // the fourth): the young row in between stays by its own time.
    assert_eq!(store.prune(&policy, t).await.unwrap().events, 3);
    assert_eq!(actors().await, ["young"]);
    store.prune(&policy, t + 2 * hour).await.unwrap();
    assert_eq!(actors().await, Vec::<String>::new());
    // Behind a young row in key order, an old one waits for a later pass.
    for (actor, at) in [("old", t), ("young", t + 2 * hour), ("late", t)] {
        let mut e = event("item-k", EventKind::Flag, actor);
        e.event.now = at;
        store.append_events(&[e]).await.unwrap();
    }
    let data = snapshot(&store, "item-k").await;
    assert_eq!(commit(&store, commit_of(&data, None)).await, CommitOutcome::Recorded);
    assert_eq!(store.prune(&policy, t + 2 * hour).await.unwrap().events, 1);
    assert_eq!(actors().await, ["young", "late"]);
    assert_eq!(store.prune(&policy, t + 4 * hour).await.unwrap().events, 2);
    assert_eq!(actors().await, Vec::<String>::new());
    // The outbox the same way: the creation's row, not before its time.
    let outbox = RetentionPolicy {
        outbox_ms: Some(hour),
        events_ms: None,
        ..policy
    };
    assert_eq!(store.prune(&outbox, t).await.unwrap().outbox, 0);
    assert_eq!(store.prune(&outbox, t + 2 * hour).await.unwrap().outbox, 1);
}

/// S1: the embedded default makes every commit durable against power loss
/// (`synchronous = FULL`); `NORMAL` is an explicit opt-in.
async fn sqlite_commits_are_durable_by_default(setup: Setup) {
    assert_eq!(setup, Setup::Embedded);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("full.db").display());
    let full = SqliteStore::open(&url, 1, Synchronous::default()).await.unwrap();
    assert_eq!(full.synchronous().await.unwrap(), 2, "FULL");
    let url = format!("sqlite://{}", dir.path().join("normal.db").display());
    let normal = SqliteStore::open(&url, 1, Synchronous::Normal).await.unwrap();
    assert_eq!(normal.synchronous().await.unwrap(), 1, "NORMAL");
    let config: gavel::config::Config = toml::from_str("sqlite_synchronous = \"normal\"").unwrap();
    assert_eq!(config.sqlite_synchronous, Synchronous::Normal);
    assert_eq!(gavel::config::Config::default().sqlite_synchronous, Synchronous::Full);
}

/// Each endpoint reads the outbox from its own cursor: registered at
/// `latest` it sees what came after, at `earliest` everything retained; a
/// process that knows no endpoint consumes nothing (an endpoint configured
/// on another node still gets every event); registering again keeps the
/// position; two rounds never fan an event out twice.
async fn webhook_cursors_are_per_endpoint(setup: Setup) {
    let (store, _dir) = open(setup).await;
    create(&store, "item-a").await;
    // "Latest" is the head of the feed as it shows now; wait until it shows
    // item-a (on PostgreSQL it may lag behind other transactions).
    changes_of(&store, "item-a", 1).await;
    let now = now_ms();
    store
        .register_endpoints(&[("early", FeedStart::Earliest), ("late", FeedStart::Latest)], now)
        .await
        .unwrap();
    create(&store, "item-b").await;
    let filter = |name: &str| EndpointFilter {
        name: name.into(),
        statuses: vec![],
        kinds: vec![],
    };
    assert_eq!(store.fan_out(&[], now, 100).await.unwrap(), 0);
    assert_eq!(store.fan_out(&[filter("unregistered")], now, 100).await.unwrap(), 0);
    let both = [filter("early"), filter("late")];
    fan_out_until(&store, &both, now, 3).await;
    let delivered = |endpoint: &'static str| {
        let store = store.clone();
        async move {
            let mut items: Vec<String> = store
                .deliveries(true, 100)
                .await
                .unwrap()
                .into_iter()
                .filter(|d| d.endpoint == endpoint)
                .map(|d| d.item_id)
                .collect();
            items.sort();
            items
        }
    };
    assert_eq!(delivered("early").await, ["item-a", "item-b"]);
    assert_eq!(delivered("late").await, ["item-b"]);
    store
        .register_endpoints(&[("late", FeedStart::Earliest)], now)
        .await
        .unwrap();
    create(&store, "item-c").await;
    fan_out_until(&store, &both, now, 5).await;
    assert_eq!(store.fan_out(&both, now, 100).await.unwrap(), 0);
    assert_eq!(delivered("early").await, ["item-a", "item-b", "item-c"]);
    assert_eq!(delivered("late").await, ["item-b", "item-c"], "the position was kept");
}

/// A callback that arrives after its request's deadline is stale even
/// before the expiry pass has moved the item: past the deadline the item
/// belongs to a human.
async fn a_callback_past_its_deadline_is_stale(setup: Setup) {
    let (store, _dir) = open(setup).await;
    create(&store, "item-late").await;
    let data = snapshot(&store, "item-late").await;
    let deadline_at = now_ms() + 1_000;
    let handoff = EvaluationCommit {
        handoff: Some(Handoff {
            provider: "classifier".into(),
            deadline_at,
        }),
        ..commit_of(&data, Some(ItemStatus::AwaitingProvider))
    };
    assert_eq!(
        commit(&store, handoff).await,
        CommitOutcome::Transitioned { version: 2 }
    );
    let late = NewCallback {
        provider: "classifier".into(),
        event_id: "ev-late".into(),
        request_key: provider_request_key("item-late", 2, "classifier"),
        item_id: "item-late".into(),
        payload: "{}".into(),
        verdict: Verdict::Allow,
        score: 0.1,
        labels: vec![],
        reason: "model".into(),
        weighs: false,
        now: deadline_at,
    };
    assert!(matches!(
        store.apply_callback(&late).await.unwrap(),
        CallbackOutcome::Stale { .. }
    ));
    let item = store.item("item-late").await.unwrap().unwrap();
    assert_eq!((item.status, item.version), (ItemStatus::AwaitingProvider, 2));
    let expired = store.expire_provider_requests(deadline_at, 10).await.unwrap();
    assert_eq!(expired.len(), 1);
    let item = store.item("item-late").await.unwrap().unwrap();
    assert_eq!(item.status, ItemStatus::HeldForReview);
}

/// Event batches and evaluation commits that touch the same items in
/// different orders, concurrently, on PostgreSQL: they queue on each other's
/// row locks and never deadlock (each deadlock costs a second of
/// `deadlock_timeout` and an aborted transaction), as PostgreSQL's own
/// deadlock counter for the database shows.
async fn multi_item_writes_take_row_locks_in_one_order(setup: Setup) {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let url = setup.database_url(dir.path()).await;
    let store = gavel::store::open_url(&url, 16).await.unwrap();
    let ids: Vec<String> = (0..64).map(|i| format!("item-lock-{i:02}")).collect();
    for id in &ids {
        create(&store, id).await;
    }
    let deadlocks = async || -> i64 {
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::query_scalar("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    let before = deadlocks().await;
    for round in 0..3 {
        let mut tasks = tokio::task::JoinSet::new();
        for lane in 0..6usize {
            let (store, mut order) = (store.clone(), ids.clone());
            // Each lane its own order: rotated, and every other one reversed.
            order.rotate_left(lane * 11 % ids.len());
            if lane % 2 == 1 {
                order.reverse();
            }
            tasks.spawn(async move {
                let events: Vec<EventWrite> = order
                    .iter()
                    .map(|id| event(id, EventKind::Upvote, &format!("v{round}-{lane}")))
                    .collect();
                let outcomes = store.append_events(&events).await.unwrap();
                assert!(outcomes.iter().all(|o| matches!(o, EventOutcome::Appended(_))));
            });
        }
        for lane in 0..2 {
            let (store, mut order) = (store.clone(), ids.clone());
            if lane == 0 {
                order.reverse();
            }
            tasks.spawn(async move {
                let refs: Vec<&str> = order.iter().map(String::as_str).collect();
                let windows = SnapshotWindows {
                    author_since: 0,
                    duplicate_since: 0,
                    standing_since: 0,
                };
                let snaps = store.snapshots(&refs, windows).await.unwrap();
                let commits: Vec<EvaluationCommit> = snaps.iter().map(|s| commit_of(s, None)).collect();
                store.commit_evaluations(&commits).await.unwrap();
            });
        }
        tasks.join_all().await;
    }
    let item = store.item_details(&ids[0]).await.unwrap().unwrap();
    assert_eq!(
        item.counters,
        vec![("upvote".to_string(), 18)],
        "every event counted once"
    );
    // A backend reports its statistics when it exits: close the pool first.
    drop(store);
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(deadlocks().await - before, 0, "PostgreSQL detected deadlocks");
}

/// The reconciler's keyset pages cover every pending item exactly once, in
/// (pending since, id) order, also across items pending since the same
/// millisecond.
async fn pending_items_are_paged_without_gaps(setup: Setup) {
    let (store, _dir) = open(setup).await;
    let now = now_ms();
    let mut expected = Vec::new();
    for (batch, at) in [now - 2_000, now - 1_000].into_iter().enumerate() {
        let writes: Vec<ItemWrite> = (0..5)
            .map(|i| {
                let id = format!("item-{}-{i}", 9 - 2 * batch - i % 2);
                expected.push((at, id.clone()));
                write(NewItem {
                    now: at,
                    ..new_item(&id)
                })
            })
            .collect();
        for outcome in store.create_items(&writes).await.unwrap() {
            created(outcome);
        }
    }
    expected.sort();
    let mut seen: Vec<(i64, String)> = Vec::new();
    loop {
        let after = seen.last().map(|(at, id)| (*at, id.as_str()));
        let page = store.pending_evaluations(now, after, 3).await.unwrap();
        assert!(page.len() <= 3);
        let last = page.len() < 3;
        seen.extend(page);
        if last {
            break;
        }
    }
    assert_eq!(seen, expected);
    // Only what is pending since before `before`.
    let older = store.pending_evaluations(now - 1_500, None, 100).await.unwrap();
    assert_eq!(older, expected[..5]);
}

/// The lines of SQLite's `EXPLAIN QUERY PLAN` for `sql`, its parameters
/// bound to `binds` in order.
async fn sqlite_plan(conn: &mut sqlx::SqliteConnection, sql: &str, binds: &[&str]) -> Vec<String> {
    let explain = format!("EXPLAIN QUERY PLAN {sql}");
    let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(&explain);
    for b in binds {
        query = query.bind(*b);
    }
    query.fetch_all(conn).await.unwrap().into_iter().map(|r| r.3).collect()
}

/// A version's reversal figures read the partial index of its actions
/// (`decisions_actions`) on both stores: the queries' condition on the
/// verdict (`plugins::ACTING_VERDICTS`) is one the planner can match to the
/// index's own. On SQLite, storing a decision costs no temporary table
/// for that index's condition (migration sqlite/0070).
async fn reversal_figures_read_the_actions_index(setup: Setup) {
    use gavel::store::plugins::ACTING_VERDICTS;
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let url = setup.database_url(dir.path()).await;
    let _store = gavel::store::open_url(&url, 1).await.unwrap();
    let actions = format!(
        "SELECT COUNT(*) FROM decisions WHERE plugin_ref = 1 AND created_at >= 0 AND applied AND {ACTING_VERDICTS}"
    );
    if url.starts_with("postgres") {
        // In a transaction rolled back: the other index leading with
        // `plugin_ref` is dropped and sequential scans are off, so the plan
        // can only read `decisions_actions`, and can read it only if the
        // query's condition implies the index's.
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        let mut tx = conn.begin().await.unwrap();
        for sql in ["DROP INDEX decisions_code", "SET LOCAL enable_seqscan = off"] {
            sqlx::query(sql).execute(&mut *tx).await.unwrap();
        }
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {actions}"))
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert!(plan.iter().any(|line| line.contains("decisions_actions")), "{plan:#?}");
    } else {
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let plan = sqlite_plan(&mut conn, &actions, &[]).await;
        assert!(
            plan.iter().any(|line| line.contains("USING INDEX decisions_actions")),
            "{plan:#?}"
        );
        let insert = sqlx::query_as::<_, (i64, String)>(
            "EXPLAIN INSERT INTO decisions (item_id, item_version, plugin, plugin_ref, phase, verdict, score, labels, \
             reason, mode, applied, duration_us, outcome, created_at) \
             VALUES ('i', 1, 'p', 1, 'async', 'flag', 1.0, '[]', '', 'enforce', 1, 5, 'ok', 0)",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let opcodes: Vec<&str> = insert.iter().map(|(_, op)| op.as_str()).collect();
        assert!(opcodes.contains(&"IdxInsert"), "{opcodes:?}");
        assert!(!opcodes.contains(&"OpenEphemeral"), "{opcodes:?}");
    }
}

/// The delivery dispatcher's check for outbox events after an endpoint's
/// cursor, run on every round, searches from the cursor on both stores: it
/// read the whole outbox when the cursor was at its end (tens of ms per
/// round at a few hundred thousand events). On PostgreSQL with sequential
/// scans off, in a transaction rolled back, so that only the plan's index
/// use is read; on SQLite from `EXPLAIN QUERY PLAN`.
async fn the_fan_out_check_searches_from_the_cursor(setup: Setup) {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let url = setup.database_url(dir.path()).await;
    let _store = gavel::store::open_url(&url, 1).await.unwrap();
    let postgres = url.starts_with("postgres");
    let check = gavel::store::outbox::fan_out_check_sql(postgres, 2);
    if postgres {
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        let mut tx = conn.begin().await.unwrap();
        sqlx::query("SET LOCAL enable_seqscan = off")
            .execute(&mut *tx)
            .await
            .unwrap();
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {check}"))
            .bind("a")
            .bind("b")
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert!(
            plan.iter()
                .any(|line| line.contains("Index Cond: (ROW(txid, seq) > ROW(c.txid, c.seq))")),
            "{plan:#?}"
        );
        assert!(!plan.iter().any(|line| line.contains("Scan on outbox")), "{plan:#?}");
    } else {
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let plan = sqlite_plan(&mut conn, &check, &["a", "b"]).await;
        assert!(
            plan.iter()
                .any(|line| line == "SEARCH o USING INTEGER PRIMARY KEY (rowid>?)"),
            "{plan:#?}"
        );
        assert!(!plan.iter().any(|line| line.starts_with("SCAN o")), "{plan:#?}");
    }
}

/// The keyset pages read after a two-column cursor (the review queue, an
/// appeal queue, the authors export) search from the cursor on both
/// stores: their cursor is a row comparison, an index range, where the
/// `a > x OR (a = x AND b > y)` form had PostgreSQL read and filter every
/// row before the cursor.
async fn keyset_pages_search_from_the_cursor(setup: Setup) {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let url = setup.database_url(dir.path()).await;
    let _store = gavel::store::open_url(&url, 1).await.unwrap();
    let [review, appeals, authors] = gavel::store::keyset_pages_sql();
    if url.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        // Each statement's parameters as literals, in order.
        let pages = [
            (review, "5, 'x', 50", "ROW(updated_at, id) > ROW("),
            (appeals, "'open', 5, 'x', 50", "ROW(opened_at, id) > ROW("),
            (authors, "0, 10, 50, 'c', 'a'", "ROW(client, author) > ROW("),
        ];
        for (sql, args, range) in pages {
            let mut tx = conn.begin().await.unwrap();
            sqlx::raw_sql("SET LOCAL enable_seqscan = off")
                .execute(&mut *tx)
                .await
                .unwrap();
            sqlx::raw_sql(&format!("PREPARE page AS {sql}"))
                .execute(&mut *tx)
                .await
                .unwrap();
            let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN EXECUTE page({args})"))
                .fetch_all(&mut *tx)
                .await
                .unwrap();
            tx.rollback().await.unwrap();
            sqlx::raw_sql("DEALLOCATE page").execute(&mut conn).await.unwrap();
            assert!(
                plan.iter()
                    .any(|line| line.contains("Index Cond:") && line.contains(range)),
                "{sql}\n{plan:#?}"
            );
        }
    } else {
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let pages = [
            (
                review,
                &["5", "x", "50"][..],
                "items_review (status=? AND (updated_at,id)>(?,?))",
            ),
            (
                appeals,
                &["open", "5", "x", "50"][..],
                "appeals_by_status (status=? AND (opened_at,id)>(?,?))",
            ),
            (authors, &["0", "10", "50", "c", "a"][..], "((client,author)>(?,?))"),
        ];
        for (sql, binds, range) in pages {
            let plan = sqlite_plan(&mut conn, sql, binds).await;
            assert!(
                plan.iter()
                    .any(|line| line.starts_with("SEARCH") && line.ends_with(range)),
                "{sql}\n{plan:#?}"
            );
        }
    }
}

/// A database from before snapshots were numbered (migration 0060) keeps
/// its history readable: the upgrade numbers every stored snapshot, points
/// each decision at its own, leaves configs content-addressed, and a
/// decision whose snapshot had expired finds none.
async fn stored_snapshots_are_numbered_on_upgrade(setup: Setup) {
    let dir = tempfile::tempdir().unwrap();
    let url = setup.database_url(dir.path()).await;
    let before_0060 = async |source: &str| {
        let all = sqlx::migrate::Migrator::new(std::path::Path::new(&format!(
            "{}/../host/migrations/{source}",
            env!("CARGO_MANIFEST_DIR")
        )))
        .await
        .unwrap();
        sqlx::migrate::Migrator {
            migrations: all.migrations.iter().filter(|m| m.version < 60).cloned().collect(),
            ..all
        }
    };
    // The old shape, as the release before wrote it: two evaluations'
    // snapshots, one shared config, and a decision whose snapshot expired.
    let rows = [
        "INSERT INTO items (id, client, kind, author, body, context, fingerprint, status, version, created_at, updated_at) \
         VALUES ('item-1', 'c', 'post', 'ann', 'hello', '{}', 'f', 'visible', 1, 1, 1)",
        "INSERT INTO plugin_refs (name, version, digest) VALUES ('link-spam', '1.0.0', 'code')",
        "INSERT INTO snapshots (digest, kind, body, bytes, stored_bytes, used_at) VALUES \
         ('s1', 'snapshot', '{\"n\":1}', 7, 7, 10), ('s2', 'snapshot', '{\"n\":2}', 7, 7, 20), \
         ('c1', 'config', '{}', 2, 2, 10)",
    ];
    let decision = |at: i64, snapshot: &str| {
        format!(
            "INSERT INTO decisions (item_id, item_version, plugin, plugin_ref, phase, verdict, score, labels, reason, \
             mode, applied, duration_us, outcome, created_at, snapshot_digest, config_digest) VALUES ('item-1', 1, \
             'link-spam', 1, 'async', 'allow', 0, '[]', '', 'enforce', TRUE, 1, 'ok', {at}, '{snapshot}', 'c1')"
        )
    };
    let decisions = [
        decision(1, "s1"),
        decision(2, "s1"),
        decision(3, "s2"),
        decision(4, "expired"),
    ];
    // (An untyped literal is the column's type on both: text for BLOB, bytes for BYTEA.)
    let old_shape = rows.iter().map(|s| s.to_string()).chain(decisions);
    match setup {
        Setup::Embedded => {
            let pool = sqlx::SqlitePool::connect(&format!("{url}?mode=rwc")).await.unwrap();
            before_0060("sqlite").await.run(&pool).await.unwrap();
            for sql in old_shape {
                sqlx::query(&sql).execute(&pool).await.unwrap();
            }
            pool.close().await;
        }
        _ => {
            let pool = sqlx::PgPool::connect(&url).await.unwrap();
            before_0060("postgres").await.run(&pool).await.unwrap();
            for sql in old_shape {
                sqlx::query(&sql).execute(&pool).await.unwrap();
            }
            pool.close().await;
        }
    }

    let store = gavel::store::open_url(&url, 4).await.unwrap();
    let ds = store.item_decisions_from("item-1", 0, 10).await.unwrap();
    let id_of = |i: usize| ds[i].snapshot_id;
    assert_eq!(ds.len(), 4);
    assert!(id_of(0).is_some() && id_of(0) == id_of(1), "{ds:?}");
    assert!(id_of(2).is_some() && id_of(2) != id_of(0));
    assert_eq!(id_of(3), None, "an expired snapshot is not there to number");
    let ids: Vec<i64> = ds.iter().filter_map(|d| d.snapshot_id).collect();
    let docs = store.input_docs(&ids, &["c1", "s1"]).await.unwrap();
    assert_eq!(docs.get("s1").map(Vec::as_slice), Some(&br#"{"n":1}"#[..]));
    assert_eq!(docs.get("s2").map(Vec::as_slice), Some(&br#"{"n":2}"#[..]));
    assert_eq!(docs.get("c1").map(Vec::as_slice), Some(&b"{}"[..]));
    assert_eq!(
        docs.len(),
        3,
        "a snapshot's digest does not read as a config: {:?}",
        docs.keys()
    );
    assert_eq!(store.snapshot_footprint().await.unwrap(), (2, 14));
}

gavel_tests::both!(
    pending_items_are_paged_without_gaps,
    webhook_cursors_are_per_endpoint,
    a_callback_past_its_deadline_is_stale,
    concurrent_transitions_from_one_state_have_one_winner,
    every_commit_path_racing_on_one_item_has_one_winner,
    an_older_snapshot_never_overwrites_a_newer_evaluation,
    deliveries_are_claimed_in_version_order,
    automated_changes_are_refused_after_a_moderator_decided,
    evaluation_commits_are_fenced_and_keep_late_events_scheduled,
    idempotency_keys_claim_replay_and_mismatch,
    a_key_taken_over_after_its_lock_lets_one_effect_commit,
    external_ids_are_unique_per_client,
    review_queue_pages_without_gaps,
    batched_submissions_keep_each_outcome,
    duplicate_text_is_counted_inside_the_transaction,
    author_figures_are_exact_below_the_cap_and_capped_above_it,
    batched_events_each_count_once,
    counters_are_derived_from_the_events_stored,
    every_transition_has_its_outbox_event_in_order,
    decisions_name_only_rows_that_exist_and_keep_them,
    batched_evaluation_commits_are_each_fenced,
    a_failing_write_fails_alone_in_a_group_commit,
    retention_deletes_only_what_is_past_its_time,
    retention_reads_in_key_order_and_never_deletes_a_young_row,
    stored_snapshots_are_numbered_on_upgrade,
    reversal_figures_read_the_actions_index,
    the_fan_out_check_searches_from_the_cursor,
    keyset_pages_search_from_the_cursor,
);
gavel_tests::matrix!([embedded_only: Embedded] sqlite_commits_are_durable_by_default);
gavel_tests::matrix!([distributed_only: Distributed] multi_item_writes_take_row_locks_in_one_order);
