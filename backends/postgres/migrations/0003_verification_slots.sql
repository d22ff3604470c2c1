-- 0003_verification_slots: the fleet-wide verification slots (serve
-- --max-concurrent-verifications), one row per verifier holding a slot. expires_at is the store
-- clock; a row past it is a free slot, deleted by the next acquire. Acquires serialize on the
-- advisory lock (SLOT_LOCK_CLASS, hashtext(current_schema())) before they read the table (see store.rs, "why a slot
-- lock"); the primary key is the second line of defence against one holder's two rows.

CREATE TABLE verification_slots (
    cell_id    text        COLLATE "C" NOT NULL,
    holder     text        COLLATE "C" NOT NULL,
    expires_at timestamptz NOT NULL,
    CONSTRAINT verification_slots_pkey PRIMARY KEY (cell_id, holder)
);
