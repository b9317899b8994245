-- The lists a rule consulted for a decision, each with the version it
-- answered from and that version's digest, as a JSON array of
-- {"name", "version", "digest"}; NULL when it consulted none (and for
-- every decision made before rules could consult lists).
ALTER TABLE decisions ADD COLUMN lists TEXT;
