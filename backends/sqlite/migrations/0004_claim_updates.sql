-- In-place updates: a claim may be leased with lease_op 3 (update). SQLite cannot alter a CHECK
-- constraint, so the claims table is rebuilt the documented way (new table, copy, drop, rename,
-- indexes again), inside the migration's one transaction. Nothing references claims, so the
-- drop needs no foreign-key juggling; the new table keeps its own reference to
-- leases_outstanding.
CREATE TABLE claims_0004 (
    claim_type      INTEGER NOT NULL,
    claim_value     TEXT    NOT NULL,
    cell_id         TEXT    NOT NULL,
    owner_type      INTEGER NOT NULL,
    owner_value     TEXT    NOT NULL,
    table_name      INTEGER NOT NULL,
    table_record_id INTEGER NOT NULL,
    lease_id        TEXT    REFERENCES leases_outstanding (lease_id),
    lease_op        INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (claim_type, claim_value),
    CHECK (lease_op IN (0, 1, 2, 3) AND (lease_id IS NULL) = (lease_op = 0))
) STRICT, WITHOUT ROWID;

INSERT INTO claims_0004 (claim_type, claim_value, cell_id, owner_type, owner_value, table_name,
                         table_record_id, lease_id, lease_op, created_at, updated_at)
SELECT claim_type, claim_value, cell_id, owner_type, owner_value, table_name, table_record_id,
       lease_id, lease_op, created_at, updated_at
FROM claims;

DROP TABLE claims;
ALTER TABLE claims_0004 RENAME TO claims;

CREATE INDEX claims_by_lease ON claims (lease_id) WHERE lease_id IS NOT NULL;
CREATE INDEX claims_by_cell_table_record
    ON claims (cell_id, table_name, table_record_id, claim_type, claim_value);
