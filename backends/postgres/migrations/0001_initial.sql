-- 0001_initial: the service's three tables (claims, outstanding leases, remembered outcomes).
--
-- Runs with search_path set to the store's schema, inside the migration transaction.
-- Enumerations are stored as their protobuf numbers (smallint); the domain validates them.
-- Text keys use the "C" collation so that ORDER BY is byte order: the same order as the domain's
-- ClaimKey / CellId (Rust string order), for lock ordering and ListClaims paging alike.

CREATE TABLE claims (
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
    CONSTRAINT claims_pkey PRIMARY KEY (claim_type, claim_value),
    CONSTRAINT claims_lease_op_iff_lease CHECK ((lease_id IS NULL) = (lease_op IS NULL))
);

-- Claims by cell, by (cell, table, record id): ListClaims pages and verification. Its leading
-- column also serves "claims of a cell" (decommissioning, admin), so no separate cell index.
CREATE INDEX claims_by_cell_table_record
    ON claims (cell_id, table_name, table_record_id, claim_type, claim_value);

-- Claims by lease id: Commit/Rollback lock and rewrite exactly the claims of one lease.
CREATE INDEX claims_by_lease ON claims (lease_id) WHERE lease_id IS NOT NULL;

-- Outstanding leases (the design's service-side leases_outstanding), with the original request
-- as protobuf bytes (topology_claims::codec::encode_request).
CREATE TABLE leases (
    lease_id        uuid        NOT NULL,
    cell_id         text        COLLATE "C" NOT NULL,
    request         bytea       NOT NULL,
    created_at      timestamptz NOT NULL,
    last_renewed_at timestamptz NOT NULL,
    CONSTRAINT leases_pkey PRIMARY KEY (lease_id)
);

-- Leases by (cell, created_at): staleness questions and operators ("oldest leases of cell X").
CREATE INDEX leases_by_cell_created ON leases (cell_id, created_at);
-- Leases by (cell, lease_id): ListOutstandingLeases pages in lease-id order.
CREATE INDEX leases_by_cell_lease ON leases (cell_id, lease_id);

-- How ended leases ended (1 = committed, 2 = rolled back), kept for the outcome retention.
CREATE TABLE lease_outcomes (
    lease_id   uuid        NOT NULL,
    cell_id    text        COLLATE "C" NOT NULL,
    outcome    smallint    NOT NULL,
    decided_at timestamptz NOT NULL,
    CONSTRAINT lease_outcomes_pkey PRIMARY KEY (lease_id)
);

-- Outcomes by decision time: collect_outcomes deletes the expired ones.
CREATE INDEX lease_outcomes_by_decided ON lease_outcomes (decided_at);

-- Fails the statement (and so the transaction) when a conditional write touched another number
-- of rows than the domain's decision said. BeginUpdate sends its writes and COMMIT in one
-- pipelined flight, so this check must happen inside the database: a raised error turns the
-- pipelined COMMIT into a rollback. SQLSTATE TC001 is retried by the adapter like contention.
CREATE FUNCTION topology_claims_expect_rows(actual bigint, expected bigint, what text)
RETURNS bigint
LANGUAGE plpgsql
AS $$
BEGIN
    IF actual <> expected THEN
        RAISE EXCEPTION 'topology-claims: % touched % rows, expected %', what, actual, expected
            USING ERRCODE = 'TC001';
    END IF;
    RETURN actual;
END
$$;
