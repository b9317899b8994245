-- The moderator console (host/src/console/): sign-in sessions, review
-- claims and skips.

-- A session is known by the sha256 of its cookie value; the value itself is
-- never stored. `csrf` is the token every state-changing request of the
-- session must carry.
CREATE TABLE console_sessions (
    id_hash    TEXT PRIMARY KEY,
    moderator  TEXT NOT NULL,
    csrf       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);

-- Who is reviewing a held item, until when. The primary key makes a claim
-- exclusive; a conditional upsert takes it only while it is free, expired
-- or already the claimant's (store/review.rs).
CREATE TABLE review_claims (
    item_id    TEXT PRIMARY KEY REFERENCES items (id),
    moderator  TEXT NOT NULL,
    claimed_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX review_claims_moderator ON review_claims (moderator, expires_at);

-- Items a moderator skipped: the next claim of that moderator passes them
-- over (another moderator still gets them).
CREATE TABLE review_skips (
    item_id    TEXT NOT NULL REFERENCES items (id),
    moderator  TEXT NOT NULL,
    skipped_at BIGINT NOT NULL,
    PRIMARY KEY (item_id, moderator)
);

-- "Decided in the last hour / day" on the queue page.
CREATE INDEX transitions_by_moderators ON transitions (created_at) WHERE actor = 'moderator';

-- A plugin version's figures (`GET /v1/plugins`, the console's plugins
-- page) cover its latest 10,000 decisions, read from this index alone: a
-- bounded cost however long the version has served. Upgrading rebuilds it,
-- holding writes to `decisions` meanwhile (seconds per million rows).
DROP INDEX decisions_digest;
CREATE INDEX decisions_digest ON decisions (plugin_digest, id, outcome, verdict, duration_us);

-- Reversal rates and the console's overturn chart: a version's actions
-- (applied flag, hold and reject decisions) by day, from this index alone.
CREATE INDEX decisions_actions ON decisions (plugin_digest, created_at, reversed_at)
    WHERE applied AND verdict IN ('flag', 'hold', 'reject');
