-- A console session is bound to the secret of the token it was signed in
-- with, not only to the token's name: when an operator gives a leaked
-- moderator token a new secret, every session made with the old one ends
-- (host/src/console/session.rs).
--
-- `token_binding` is HMAC-SHA256 keyed by the session's cookie value over
-- the sha256 of the moderator's token. The cookie value is never stored
-- (only its sha256, `id_hash`), so the column cannot be tested against
-- guessed tokens by someone who can only read the database.
--
-- Sessions from before cannot be bound: they end, and moderators sign in
-- again.
DROP TABLE console_sessions;
CREATE TABLE console_sessions (
    id_hash       TEXT PRIMARY KEY,
    moderator     TEXT NOT NULL,
    token_binding TEXT NOT NULL,
    csrf          TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL
);
CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);
