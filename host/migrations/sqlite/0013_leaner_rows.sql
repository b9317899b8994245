-- Leaner rows for the tables every settled item writes (an item, two audit
-- rows with their outbox events, five decisions). Keep in step with
-- ../postgres/0013_leaner_rows.sql, which takes the plugin references (the
-- rest is SQLite's own).
--
-- 1. Decisions name the code that made them by a small integer: one
-- `plugin_refs` row per (name, version, digest) instead of a version string
-- and a 64-character digest repeated on every decision and in two of its
-- indexes.
--
-- 2. CHECK constraints over a list of names are written as `col = 'a' OR
-- col = 'b' …`: SQLite evaluates `col IN (list of more than two)` by
-- building a temporary b-tree of the list for every row it checks, which
-- cost 2–3 µs per constraint per row, some forty times per settled item.
-- The lists themselves are unchanged. The tables are rebuilt (SQLite cannot
-- alter a constraint), as the documented procedure says; migrations run with
-- foreign keys off and the keys are checked as a whole afterwards.
--
-- 3. No AUTOINCREMENT where nothing needs it: decisions and transitions are
-- never deleted, so their newest id is never reused, and an event's id is
-- not exposed (events are numbered per item by `seq`); AUTOINCREMENT
-- writes its counter's row on every insert. The outbox keeps it: its
-- sequence is the feed's cursor.
CREATE TABLE plugin_refs (
    id      INTEGER PRIMARY KEY,
    name    TEXT NOT NULL,
    version TEXT NOT NULL,
    digest  TEXT NOT NULL,
    UNIQUE (digest, name, version)
);
INSERT INTO plugin_refs (name, version, digest)
SELECT plugin, plugin_version, plugin_digest FROM decisions
GROUP BY plugin, plugin_version, plugin_digest ORDER BY MIN(id);

-- Rebuilt (SQLite cannot drop a column that an index uses), without
-- AUTOINCREMENT: retention never deletes decisions, so the newest id is
-- never reused, and the counter's own row is one write less per insert.
-- Of the indexes, `decisions_item_created` goes: the one query that used
-- it (an author's counted decisions) reads an item's few decisions through
-- `decisions_item`.
CREATE TABLE decisions_v3 (
    id              INTEGER PRIMARY KEY,
    item_id         TEXT NOT NULL REFERENCES items (id),
    item_version    BIGINT NOT NULL,
    plugin          TEXT NOT NULL,
    plugin_ref      INTEGER NOT NULL REFERENCES plugin_refs (id),
    phase           TEXT NOT NULL CHECK (phase = 'sync' OR phase = 'async' OR phase = 'provider'),
    verdict         TEXT CHECK (verdict = 'allow' OR verdict = 'flag' OR verdict = 'defer' OR verdict = 'hold'
                                OR verdict = 'reject'),
    score           REAL NOT NULL,
    labels          TEXT NOT NULL,
    reason          TEXT NOT NULL,
    mode            TEXT NOT NULL CHECK (mode = 'enforce' OR mode = 'shadow'),
    applied         BOOLEAN NOT NULL,
    duration_us     BIGINT NOT NULL,
    outcome         TEXT NOT NULL CHECK (outcome = 'ok' OR outcome = 'error' OR outcome = 'trap' OR outcome = 'timeout'
                                     OR outcome = 'memory' OR outcome = 'invalid'),
    error           TEXT,
    created_at      BIGINT NOT NULL,
    reversed_at     BIGINT,
    snapshot_digest TEXT,
    config_digest   TEXT
);
INSERT INTO decisions_v3 (id, item_id, item_version, plugin, plugin_ref, phase, verdict, score, labels, reason, mode,
                          applied, duration_us, outcome, error, created_at, reversed_at, snapshot_digest, config_digest)
SELECT d.id, d.item_id, d.item_version, d.plugin, r.id, d.phase, d.verdict, d.score, d.labels, d.reason, d.mode,
       d.applied, d.duration_us, d.outcome, d.error, d.created_at, d.reversed_at, d.snapshot_digest, d.config_digest
FROM decisions d JOIN plugin_refs r ON r.digest = d.plugin_digest AND r.name = d.plugin AND r.version = d.plugin_version;
DROP TABLE decisions;
ALTER TABLE decisions_v3 RENAME TO decisions;
CREATE INDEX decisions_item ON decisions (item_id, id);
-- A version's latest decisions (its figures) from the index alone.
CREATE INDEX decisions_code ON decisions (plugin_ref, id, outcome, verdict, duration_us);
-- A version's actions (applied flag, hold and reject) by time, for reversal rates.
CREATE INDEX decisions_actions ON decisions (plugin_ref, created_at, reversed_at)
    WHERE applied AND verdict IN ('flag', 'hold', 'reject');
-- A backtest selects a plugin name's decisions in a time window.
CREATE INDEX decisions_plugin_time ON decisions (plugin, created_at, id);

-- Items.
DROP TRIGGER transitions_outbox;
CREATE TABLE items_v2 (
    id               TEXT PRIMARY KEY,
    client           TEXT NOT NULL,
    external_id      TEXT,
    kind             TEXT NOT NULL,
    author           TEXT NOT NULL,
    body             TEXT NOT NULL,
    context          TEXT NOT NULL,
    fingerprint      TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status = 'pending_scan' OR status = 'visible' OR status = 'held_for_review'
                                         OR status = 'rejected' OR status = 'awaiting_provider' OR status = 'deleted'),
    version          BIGINT NOT NULL CHECK (version >= 1),
    decided_by       TEXT CHECK (decided_by = 'system' OR decided_by = 'rules' OR decided_by = 'provider'
                                 OR decided_by = 'moderator' OR decided_by = 'author'),
    sync_verdict     TEXT CHECK (sync_verdict = 'allow' OR sync_verdict = 'flag' OR sync_verdict = 'hold'
                                 OR sync_verdict = 'reject'),
    needs_eval_since BIGINT,
    event_seq        BIGINT NOT NULL DEFAULT 0,
    evaluated_seq    BIGINT NOT NULL DEFAULT 0,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    content_version  BIGINT NOT NULL DEFAULT 1,
    eval_round       BIGINT NOT NULL DEFAULT 0,
    UNIQUE (client, external_id)
);
INSERT INTO items_v2 (id, client, external_id, kind, author, body, context, fingerprint, status, version, decided_by,
                      sync_verdict, needs_eval_since, event_seq, evaluated_seq, created_at, updated_at,
                      content_version, eval_round)
SELECT id, client, external_id, kind, author, body, context, fingerprint, status, version, decided_by, sync_verdict,
       needs_eval_since, event_seq, evaluated_seq, created_at, updated_at, content_version, eval_round FROM items;
DROP TABLE items;
ALTER TABLE items_v2 RENAME TO items;
CREATE INDEX items_review ON items (status, updated_at, id);
CREATE INDEX items_client_author ON items (client, author, created_at);
CREATE INDEX items_client_fingerprint ON items (client, author, fingerprint, created_at);
CREATE INDEX items_needs_eval ON items (needs_eval_since, id) WHERE needs_eval_since IS NOT NULL;

-- Transitions (the audit trail).
CREATE TABLE transitions_v2 (
    id             INTEGER PRIMARY KEY,
    item_id        TEXT NOT NULL REFERENCES items (id),
    from_status    TEXT NOT NULL CHECK (from_status = 'received' OR from_status = 'pending_scan'
                                        OR from_status = 'visible' OR from_status = 'held_for_review'
                                        OR from_status = 'rejected' OR from_status = 'awaiting_provider'
                                        OR from_status = 'deleted'),
    to_status      TEXT NOT NULL CHECK (to_status = 'pending_scan' OR to_status = 'visible'
                                        OR to_status = 'held_for_review' OR to_status = 'rejected'
                                        OR to_status = 'awaiting_provider' OR to_status = 'deleted'),
    version        BIGINT NOT NULL,
    cause          TEXT NOT NULL,
    actor          TEXT NOT NULL CHECK (actor = 'system' OR actor = 'rules' OR actor = 'provider'
                                        OR actor = 'moderator' OR actor = 'author'),
    actor_name     TEXT,
    reason         TEXT NOT NULL,
    correlation_id TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    actor_note     TEXT,
    -- One transition per item version: two commits can never both produce version N.
    UNIQUE (item_id, version)
);
INSERT INTO transitions_v2 (id, item_id, from_status, to_status, version, cause, actor, actor_name, reason,
                            correlation_id, created_at, actor_note)
SELECT id, item_id, from_status, to_status, version, cause, actor, actor_name, reason, correlation_id, created_at,
       actor_note FROM transitions;
DROP TABLE transitions;
ALTER TABLE transitions_v2 RENAME TO transitions;
CREATE INDEX transitions_by_moderators ON transitions (created_at) WHERE actor = 'moderator';
CREATE TRIGGER transitions_outbox AFTER INSERT ON transitions
BEGIN
    INSERT INTO outbox (event_id, item_id, item_version, client, kind, external_id, from_status, to_status,
                        cause, actor, reason, correlation_id, created_at)
    SELECT NEW.item_id || ':' || NEW.version, id, NEW.version, client, kind, external_id, NEW.from_status,
           NEW.to_status, NEW.cause, NEW.actor, NEW.reason, NEW.correlation_id, NEW.created_at
    FROM items WHERE id = NEW.item_id;
END;

-- Events.
CREATE TABLE events_v2 (
    id         INTEGER PRIMARY KEY,
    item_id    TEXT NOT NULL REFERENCES items (id),
    seq        BIGINT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind = 'upvote' OR kind = 'downvote' OR kind = 'flag' OR kind = 'report'
                                    OR kind = 'edit'),
    actor      TEXT NOT NULL,
    payload    TEXT,
    created_at BIGINT NOT NULL,
    UNIQUE (item_id, seq)
);
INSERT INTO events_v2 (id, item_id, seq, kind, actor, payload, created_at)
SELECT id, item_id, seq, kind, actor, payload, created_at FROM events;
DROP TABLE events;
ALTER TABLE events_v2 RENAME TO events;
CREATE INDEX events_created ON events (created_at);

-- 4. The outbox's feed order is `seq` alone on SQLite (one writer: `txid` is
-- always 0), which is the table's own key: the `(txid, seq)` index went
-- unused once the feed queries said so (`Dialect::FEED_ORDER`), and the
-- per-client index needs no `txid`.
DROP INDEX outbox_feed;
DROP INDEX outbox_client_feed;
CREATE INDEX outbox_client_feed ON outbox (client, seq);
