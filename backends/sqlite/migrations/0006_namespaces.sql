-- Claim namespaces (decisions 107, 108). Only adds: a previous release keeps serving this file.
--
-- One row per namespace. number: what claims.claim_type holds (the built-ins keep 1, 2, 3, the
-- legacy claim types); id: the name clients use. normalization: 1 exact, 2 ascii-case-
-- insensitive, 3 precis-username. reserved: the values joined by '\n'. version: one more at
-- every change; 0 marks a built-in this migration added, compared byte for byte (exact, as
-- before) until the store, at its next open, adopts precis-username or keeps exact for good
-- (domain::decide_adoption).
CREATE TABLE namespaces (
    number        INTEGER NOT NULL PRIMARY KEY,
    id            TEXT    NOT NULL UNIQUE,
    normalization INTEGER NOT NULL,
    max_chars     INTEGER NOT NULL,
    pattern       TEXT,
    reserved      TEXT    NOT NULL DEFAULT '',
    description   TEXT    NOT NULL DEFAULT '',
    deprecated    INTEGER NOT NULL DEFAULT 0,
    version       INTEGER NOT NULL
) STRICT;

INSERT INTO namespaces (number, id, normalization, max_chars, description, version) VALUES
    (1, 'routes', 1, 255, 'built-in: routes (claim_type 1)', 0),
    (2, 'usernames', 1, 255, 'built-in: usernames (claim_type 2)', 0),
    (3, 'emails', 1, 255, 'built-in: emails (claim_type 3)', 0);

-- A claim's display form (the value as the creating cell sent it) when it differs from its key
-- (claim_value); NULL when they are the same, as for every claim written before namespaces.
ALTER TABLE claims ADD COLUMN display_value TEXT;

-- The namespace of a claim outside the built-ins (its id; claim_type holds the id's store
-- number, NamespaceId::store_number). NULL for the built-ins, whose number says it.
ALTER TABLE claims ADD COLUMN namespace TEXT;
