-- The service's three tables. Applied by `migrations.rs` inside one transaction together with its
-- row in schema_migrations; never edit an applied migration, add the next one instead.
--
-- Types: timestamps are INTEGER unix microseconds (domain::Timestamp), lease ids lowercase
-- hyphenated TEXT (so TEXT order is UUID order, the order of ListOutstandingLeases), enums their
-- INTEGER wire numbers. STRICT makes SQLite refuse a value of the wrong type instead of storing it.

-- One row per claim key. lease_id/lease_op are the lease marker: NULL/0 for a committed claim,
-- the holding lease and 1 (create) or 2 (destroy) otherwise. WITHOUT ROWID keeps the rows in
-- primary-key order, so the point reads of BeginUpdate touch a single b-tree.
CREATE TABLE claims (
    claim_type      INTEGER NOT NULL,
    claim_value     TEXT    NOT NULL,
    cell_id         TEXT    NOT NULL,
    owner_type      INTEGER NOT NULL,
    owner_value     TEXT    NOT NULL,
    table_name      INTEGER NOT NULL,
    table_record_id INTEGER NOT NULL,
    -- A leased claim's lease must exist: the foreign key is the database's own check of that
    -- invariant (a second line of defence behind the domain decisions).
    lease_id        TEXT    REFERENCES leases_outstanding (lease_id),
    lease_op        INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (claim_type, claim_value),
    CHECK (lease_op IN (0, 1, 2) AND (lease_id IS NULL) = (lease_op = 0))
) STRICT, WITHOUT ROWID;

-- Commit/rollback and the foreign-key check find a lease's claims through this index. Partial:
-- almost every claim is committed (lease_id NULL), and those rows would only bloat it.
CREATE INDEX claims_by_lease ON claims (lease_id) WHERE lease_id IS NOT NULL;

-- ListClaims reads a range of it in exactly the page order. Its leading column also serves every
-- per-cell query, which is why there is no separate index on cell_id alone.
CREATE INDEX claims_by_cell_table_record
    ON claims (cell_id, table_name, table_record_id, claim_type, claim_value);

-- Outstanding leases with the original request (protobuf BeginUpdateRequest bytes). A rowid
-- table: the request can be tens of kilobytes, too big for WITHOUT ROWID's in-tree rows.
CREATE TABLE leases_outstanding (
    lease_id        TEXT    NOT NULL PRIMARY KEY,
    cell_id         TEXT    NOT NULL,
    request         BLOB    NOT NULL,
    created_at      INTEGER NOT NULL,
    last_renewed_at INTEGER NOT NULL
) STRICT;

-- ListOutstandingLeases: one cell's leases in lease-id order.
CREATE INDEX leases_outstanding_by_cell ON leases_outstanding (cell_id, lease_id);

-- How ended leases ended (1 committed, 2 rolled back), until collect_outcomes forgets them.
CREATE TABLE lease_outcomes (
    lease_id   TEXT    NOT NULL PRIMARY KEY,
    cell_id    TEXT    NOT NULL,
    outcome    INTEGER NOT NULL,
    decided_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- collect_outcomes deletes a prefix of it.
CREATE INDEX lease_outcomes_by_decided_at ON lease_outcomes (decided_at);
