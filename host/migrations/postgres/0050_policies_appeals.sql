-- Policies, timed restrictions and appeals (docs/ARCHITECTURE.md,
-- "Statements of reasons and appeals").
--
-- The policy a moderator named for a decision; a rule's decision is stated
-- under the policy its labels map to, so its transitions leave this NULL.
ALTER TABLE transitions ADD COLUMN policy TEXT;
-- When a moderator's restriction ends (the statement's end date); the
-- item's `restricted_until` is the same time while the restriction is in
-- force, and the reconciler lifts it then (one conditional write).
ALTER TABLE transitions ADD COLUMN ends_at BIGINT;
ALTER TABLE items ADD COLUMN restricted_until BIGINT;
CREATE INDEX items_restricted_until ON items (restricted_until) WHERE restricted_until IS NOT NULL;
-- The same for an account state a moderator set until a time: the
-- reconciler hands the account back to automation then (cause `expiry`).
ALTER TABLE authors ADD COLUMN state_until BIGINT;
CREATE INDEX authors_state_until ON authors (state_until) WHERE state_until IS NOT NULL;

-- Author transitions gain the cause `expiry` and their end time.
ALTER TABLE author_transitions DROP CONSTRAINT author_transitions_cause_check;
ALTER TABLE author_transitions ADD CONSTRAINT author_transitions_cause_check CHECK (cause IN ('strikes', 'moderation', 'expiry'));
ALTER TABLE author_transitions ADD COLUMN ends_at BIGINT;

-- An appeal of one restrictive decision (the item version its transition
-- made). Opened by the platform on behalf of the author or a notifier;
-- closed only by a moderator's decision, written in the same transaction
-- as that decision's transition: the CHECKs refuse any other closing.
CREATE TABLE appeals (
    id               TEXT PRIMARY KEY,
    item_id          TEXT NOT NULL REFERENCES items (id),
    client           TEXT NOT NULL,
    decision_version BIGINT NOT NULL,
    decision_status  TEXT NOT NULL CHECK (decision_status IN ('held_for_review', 'rejected')),
    -- What the statement of the decision named: its policy, and the rule
    -- (name and version) behind it, if one was.
    policy           TEXT NOT NULL,
    plugin           TEXT,
    plugin_version   TEXT,
    appellant        TEXT NOT NULL CHECK (appellant IN ('author', 'notifier')),
    text             TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('open', 'upheld', 'overturned')),
    opened_at        BIGINT NOT NULL,
    closed_at        BIGINT,
    closed_by        TEXT,
    closed_by_actor  TEXT CHECK (closed_by_actor = 'moderator'),
    close_reason     TEXT,
    outcome_version  BIGINT,
    -- Who is deciding it in the console, until when (a claim only shares
    -- out work: closing is decided by `status = 'open'`).
    claimed_by       TEXT,
    claim_expires_at BIGINT,
    CHECK ((status = 'open') = (closed_at IS NULL)),
    CHECK (closed_at IS NULL OR (closed_by IS NOT NULL AND closed_by_actor IS NOT NULL
                                 AND close_reason IS NOT NULL AND outcome_version IS NOT NULL))
);

-- One open appeal per decision.
CREATE UNIQUE INDEX appeals_one_open ON appeals (item_id, decision_version) WHERE status = 'open';
-- The appeal queue, oldest first.
CREATE INDEX appeals_by_status ON appeals (status, opened_at, id);
-- An item's appeals.
CREATE INDEX appeals_by_item ON appeals (item_id, opened_at);
