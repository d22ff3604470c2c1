-- The store-wide line of lease waiters (BeginUpdateRequest.wait_for_leased, decision 119).
-- lease_wait_tickets holds the last ticket given; a join takes the next one inside its
-- BEGIN IMMEDIATE, so tickets grow in the order waiters joined. One lease_waits row per
-- (claim, ticket) a waiter waits for; expires_at (unix microseconds, the store clock) is when
-- its server is presumed gone, and the next join deletes it.
CREATE TABLE lease_wait_tickets (
    last INTEGER NOT NULL
) STRICT;

INSERT INTO lease_wait_tickets (last) VALUES (0);

CREATE TABLE lease_waits (
    namespace  TEXT    NOT NULL,
    claim_key  TEXT    NOT NULL,
    ticket     INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, claim_key, ticket)
) STRICT, WITHOUT ROWID;

CREATE INDEX lease_waits_ticket ON lease_waits (ticket);
