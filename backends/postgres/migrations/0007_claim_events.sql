-- The change feed (WatchClaims, decision 117): one event per change of a claim row, written by
-- triggers in the same transaction as the change, so no write path can forget one.
--
-- A revision is the writing transaction's id (pg_current_xact_id(), 64-bit, never reused). Ids
-- are given in start order and transactions commit in any order, so a reader takes only the
-- events below its snapshot's xmin: every transaction with a smaller id has ended, and every
-- transaction that has not yet ended has an id at or above it. Revisions a reader returned are
-- therefore final: no event below them can appear later.

-- The claim's revision: that of its last change (LookupClaim answers it).
ALTER TABLE claims ADD COLUMN revision bigint NOT NULL DEFAULT 0;

CREATE TABLE claim_events (
    revision        bigint      NOT NULL,
    seq             bigint      NOT NULL,
    deleted         boolean     NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    claim_type      smallint    NOT NULL,
    claim_value     text        COLLATE "C" NOT NULL,
    owner_type      smallint    NOT NULL,
    owner_value     text        NOT NULL,
    table_name      smallint    NOT NULL,
    table_record_id bigint      NOT NULL,
    cell_id         text        COLLATE "C" NOT NULL,
    lease_id        uuid,
    lease_op        smallint,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    display_value   text        COLLATE "C",
    namespace       text        COLLATE "C",
    owner_type_name text        COLLATE "C",
    source_table    text        COLLATE "C",
    CONSTRAINT claim_events_pkey PRIMARY KEY (revision, seq)
);

-- The order of a transaction's events (only the order within one revision matters).
CREATE SEQUENCE claim_events_seq;

CREATE TABLE watch_state (
    id                integer NOT NULL CHECK (id = 1),
    -- Every event at or below it was compacted away.
    compacted_through bigint  NOT NULL,
    CONSTRAINT watch_state_pkey PRIMARY KEY (id)
);
INSERT INTO watch_state (id, compacted_through) VALUES (1, 0);

CREATE FUNCTION claims_set_revision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.revision := pg_current_xact_id()::text::bigint;
    RETURN NEW;
END $$;

CREATE TRIGGER claims_revision BEFORE INSERT OR UPDATE ON claims
    FOR EACH ROW EXECUTE FUNCTION claims_set_revision();

-- One statement per statement of the change, from its transition tables. The functions keep
-- the store's schema as their search path (the migration's), so a write through a session with
-- another search path (an operator's psql, a restore) still finds claim_events.
CREATE FUNCTION claims_record_inserts() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO claim_events (revision, seq, deleted, claim_type, claim_value, owner_type,
        owner_value, table_name, table_record_id, cell_id, lease_id, lease_op, created_at,
        updated_at, display_value, namespace, owner_type_name, source_table)
    SELECT n.revision, nextval('claim_events_seq'), false, n.claim_type, n.claim_value,
        n.owner_type, n.owner_value, n.table_name, n.table_record_id, n.cell_id, n.lease_id,
        n.lease_op, n.created_at, n.updated_at, n.display_value, n.namespace,
        n.owner_type_name, n.source_table
    FROM new_rows n ORDER BY n.claim_type, n.claim_value;
    RETURN NULL;
END $$;

CREATE FUNCTION claims_record_updates() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    -- A key that changed: the old key is gone.
    INSERT INTO claim_events (revision, seq, deleted, claim_type, claim_value, owner_type,
        owner_value, table_name, table_record_id, cell_id, lease_id, lease_op, created_at,
        updated_at, display_value, namespace, owner_type_name, source_table)
    SELECT pg_current_xact_id()::text::bigint, nextval('claim_events_seq'), true, o.claim_type,
        o.claim_value, o.owner_type, o.owner_value, o.table_name, o.table_record_id, o.cell_id,
        o.lease_id, o.lease_op, o.created_at, o.updated_at, o.display_value, o.namespace,
        o.owner_type_name, o.source_table
    FROM old_rows o
    WHERE NOT EXISTS (SELECT 1 FROM new_rows n
                       WHERE n.claim_type = o.claim_type AND n.claim_value = o.claim_value)
    ORDER BY o.claim_type, o.claim_value;
    INSERT INTO claim_events (revision, seq, deleted, claim_type, claim_value, owner_type,
        owner_value, table_name, table_record_id, cell_id, lease_id, lease_op, created_at,
        updated_at, display_value, namespace, owner_type_name, source_table)
    SELECT n.revision, nextval('claim_events_seq'), false, n.claim_type, n.claim_value,
        n.owner_type, n.owner_value, n.table_name, n.table_record_id, n.cell_id, n.lease_id,
        n.lease_op, n.created_at, n.updated_at, n.display_value, n.namespace,
        n.owner_type_name, n.source_table
    FROM new_rows n ORDER BY n.claim_type, n.claim_value;
    RETURN NULL;
END $$;

CREATE FUNCTION claims_record_deletes() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO claim_events (revision, seq, deleted, claim_type, claim_value, owner_type,
        owner_value, table_name, table_record_id, cell_id, lease_id, lease_op, created_at,
        updated_at, display_value, namespace, owner_type_name, source_table)
    SELECT pg_current_xact_id()::text::bigint, nextval('claim_events_seq'), true, o.claim_type,
        o.claim_value, o.owner_type, o.owner_value, o.table_name, o.table_record_id, o.cell_id,
        o.lease_id, o.lease_op, o.created_at, o.updated_at, o.display_value, o.namespace,
        o.owner_type_name, o.source_table
    FROM old_rows o ORDER BY o.claim_type, o.claim_value;
    RETURN NULL;
END $$;

CREATE TRIGGER claims_events_insert AFTER INSERT ON claims
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION claims_record_inserts();
CREATE TRIGGER claims_events_update AFTER UPDATE ON claims
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION claims_record_updates();
CREATE TRIGGER claims_events_delete AFTER DELETE ON claims
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION claims_record_deletes();
