-- A snapshot's author figures (`author-stats` in wit/rules.wit) counted every
-- item the author ever posted, reading each one's row for its status: an
-- author with 50,000 items made each evaluation of each of their items read
-- 50,000 rows, so a flood from one author cost the square of its length.
-- Every figure is now a count of at most a bounded number of entries of one
-- index (`store/evaluations.rs`, `HISTORY_CAP`): the windowed counts over
-- `items_client_author`, the counts by status over these partial indexes,
-- which hold only the items now in that status (and name it, so that
-- the count is read from the index alone).
CREATE INDEX items_author_rejected ON items (client, author, created_at, status) WHERE status = 'rejected';
CREATE INDEX items_author_held ON items (client, author, status) WHERE status = 'held_for_review';
