-- 0008_lease_waits: the store-wide line of lease waiters (BeginUpdateRequest.wait_for_leased,
-- decision 119). Only adds: a previous release never reads it.
--
-- A waiter's ticket comes from lease_wait_tickets, so tickets grow in the order waiters joined
-- on every server of the store. One row per (claim, ticket) the waiter waits for; expires_at is
-- the store clock past which its server is presumed gone (its wait plus a margin), and the next
-- join deletes it.
CREATE SEQUENCE lease_wait_tickets;

CREATE TABLE lease_waits (
    namespace  text        COLLATE "C" NOT NULL,
    claim_key  text        COLLATE "C" NOT NULL,
    ticket     bigint      NOT NULL,
    expires_at timestamptz NOT NULL,
    CONSTRAINT lease_waits_pkey PRIMARY KEY (namespace, claim_key, ticket)
);

CREATE INDEX lease_waits_ticket ON lease_waits (ticket);
CREATE INDEX lease_waits_expires_at ON lease_waits (expires_at);
