-- The change feed (WatchClaims, decision 117): one event per change of a claim row, written by
-- triggers in the same transaction as the change, so no write path can forget one.
--
-- SQLite runs one write transaction at a time, so one counter orders them: every write
-- transaction's events take watch_head.revision + 1, and the store bumps the counter (and
-- records the revision's time) before COMMIT when the transaction wrote any (store.rs,
-- `finish_revision`). A reader sees whole transactions only, so the counter is complete.
CREATE TABLE watch_head (
    id                INTEGER PRIMARY KEY CHECK (id = 1),
    revision          INTEGER NOT NULL,
    -- Every event at or below it was compacted away.
    compacted_through INTEGER NOT NULL
) STRICT;
INSERT INTO watch_head (id, revision, compacted_through) VALUES (1, 0, 0);

-- When each revision was recorded (store clock, microseconds): what the retention reads.
CREATE TABLE watch_revisions (
    revision    INTEGER PRIMARY KEY,
    recorded_at INTEGER NOT NULL
) STRICT;

-- The claim's revision: that of its last change (LookupClaim answers it).
ALTER TABLE claims ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;

-- The claim's columns after the change (before it, for a delete), as in `claims`.
CREATE TABLE claim_events (
    revision        INTEGER NOT NULL,
    seq             INTEGER NOT NULL,
    deleted         INTEGER NOT NULL,
    claim_type      INTEGER NOT NULL,
    claim_value     TEXT    NOT NULL,
    cell_id         TEXT    NOT NULL,
    owner_type      INTEGER NOT NULL,
    owner_value     TEXT    NOT NULL,
    table_name      INTEGER NOT NULL,
    table_record_id INTEGER NOT NULL,
    lease_id        TEXT,
    lease_op        INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    display_value   TEXT,
    namespace       TEXT,
    owner_type_name TEXT,
    source_table    TEXT,
    PRIMARY KEY (revision, seq)
) STRICT, WITHOUT ROWID;

CREATE TRIGGER claims_watch_insert AFTER INSERT ON claims
BEGIN
    UPDATE claims SET revision = (SELECT revision + 1 FROM watch_head)
     WHERE claim_type = NEW.claim_type AND claim_value = NEW.claim_value;
    INSERT INTO claim_events
    SELECT h.revision + 1,
           COALESCE((SELECT MAX(seq) + 1 FROM claim_events WHERE revision = h.revision + 1), 0),
           0, NEW.claim_type, NEW.claim_value, NEW.cell_id, NEW.owner_type, NEW.owner_value,
           NEW.table_name, NEW.table_record_id, NEW.lease_id, NEW.lease_op, NEW.created_at,
           NEW.updated_at, NEW.display_value, NEW.namespace, NEW.owner_type_name, NEW.source_table
      FROM watch_head h;
END;

-- Fires for the statements' own updates, not for the revision the triggers write (which changes
-- `revision`); a key that changes is the old key deleted and the new one written.
CREATE TRIGGER claims_watch_update AFTER UPDATE ON claims
WHEN NEW.revision = OLD.revision
BEGIN
    INSERT INTO claim_events
    SELECT h.revision + 1,
           COALESCE((SELECT MAX(seq) + 1 FROM claim_events WHERE revision = h.revision + 1), 0),
           1, OLD.claim_type, OLD.claim_value, OLD.cell_id, OLD.owner_type, OLD.owner_value,
           OLD.table_name, OLD.table_record_id, OLD.lease_id, OLD.lease_op, OLD.created_at,
           OLD.updated_at, OLD.display_value, OLD.namespace, OLD.owner_type_name, OLD.source_table
      FROM watch_head h
     WHERE OLD.claim_type != NEW.claim_type OR OLD.claim_value != NEW.claim_value;
    UPDATE claims SET revision = (SELECT revision + 1 FROM watch_head)
     WHERE claim_type = NEW.claim_type AND claim_value = NEW.claim_value;
    INSERT INTO claim_events
    SELECT h.revision + 1,
           COALESCE((SELECT MAX(seq) + 1 FROM claim_events WHERE revision = h.revision + 1), 0),
           0, NEW.claim_type, NEW.claim_value, NEW.cell_id, NEW.owner_type, NEW.owner_value,
           NEW.table_name, NEW.table_record_id, NEW.lease_id, NEW.lease_op, NEW.created_at,
           NEW.updated_at, NEW.display_value, NEW.namespace, NEW.owner_type_name, NEW.source_table
      FROM watch_head h;
END;

CREATE TRIGGER claims_watch_delete AFTER DELETE ON claims
BEGIN
    INSERT INTO claim_events
    SELECT h.revision + 1,
           COALESCE((SELECT MAX(seq) + 1 FROM claim_events WHERE revision = h.revision + 1), 0),
           1, OLD.claim_type, OLD.claim_value, OLD.cell_id, OLD.owner_type, OLD.owner_value,
           OLD.table_name, OLD.table_record_id, OLD.lease_id, OLD.lease_op, OLD.created_at,
           OLD.updated_at, OLD.display_value, OLD.namespace, OLD.owner_type_name, OLD.source_table
      FROM watch_head h;
END;
