//! Which advisory locks one transaction of the claim store takes, in which order, within a
//! fixed budget ([`ADVISORY_LOCKS_PER_TRANSACTION`]) whatever its batch or group size.
//!
//! Owns the hashing of lease ids, claim keys and cells to lock keys, their stripes, and the
//! order of the lock list; `store.rs` sends the list as one statement ([`sql::LOCK_ADVISORY`]).
//! It must not talk to the database or decide anything about claims.
//!
//! ## Two levels: exact locks and stripes (decision 072)
//! PostgreSQL keeps advisory locks in its shared lock table (about `max_locks_per_transaction ×
//! (max_connections + max_prepared_transactions)` entries, 6,400 by default); one lock per key
//! of a 1,000-claim BeginUpdate, or per lease id of a 1,000-operation group, fills it ("out of
//! shared memory"). Lease ids and claim keys therefore lock on two levels:
//!
//! - up to an exact limit of distinct items, a transaction takes the **stripe** of each item
//!   **shared** and the item's own **exact** lock exclusive;
//! - above it, only the stripes of its items, **exclusive**, and no exact lock.
//!
//! An item's stripe is a function of its exact lock key, the same in every transaction, so two
//! transactions naming one item always conflict: on the exact lock when both are below the
//! limit, on the stripe otherwise (exclusive against shared or exclusive). Below the limit
//! transactions only ever share stripes, so they exclude each other exactly as one lock per item
//! did; the false contention of striping is confined to the transactions above the limit, which
//! exclude every transaction that shares one of their stripes. Cells lock on stripes alone:
//! BeginUpdate holds them shared, only a decommission step exclusive, so the only false
//! contention is a decommission step delaying BeginUpdates of the cells of its stripe.
//!
//! ## Order
//! Lease stripes, lease exact locks, key stripes, key exact locks, cell stripes; ascending
//! within each. Every transaction of the store takes its advisory locks in this one total order
//! before any row lock (`store.rs`, "lock order"), so advisory locks never deadlock.

use tokio_postgres::types::ToSql;
use topology_claims::{CellId, ClaimKey, LeaseId};

use crate::sql;

/// Distinct lease ids a transaction locks exactly; a group with more (`--group-max` above 64)
/// locks lease stripes exclusively instead. Lone operations name one id.
pub const LEASE_EXACT_LIMIT: usize = 64;
/// Lease stripes.
pub const LEASE_STRIPES: u32 = 32;
/// Distinct claim keys a transaction locks exactly: a default group of 64 BeginUpdates of two
/// claims each. Above it, key stripes exclusively.
pub const KEY_EXACT_LIMIT: usize = 128;
/// Claim key stripes.
pub const KEY_STRIPES: u32 = 32;
/// Cell stripes (shared by BeginUpdate, exclusive for a decommission step).
pub const CELL_STRIPES: u32 = 32;

/// Most advisory locks of a two-level class: below the exact limit each item's exact lock and
/// its stripe (the stripes are at most `stripes`), above it only stripes.
const fn class_budget(exact_limit: usize, stripes: u32) -> usize {
    exact_limit + stripes as usize
}

/// Most advisory locks one transaction of the claim store holds, whatever its batch or group
/// size: lease ids (≤ 96), claim keys (≤ 160) and cells (≤ 32). A verification slot acquire
/// holds one (the slot lock), a migration one (the migration lock), in transactions of their
/// own. Relation locks come on top (docs/backends/postgres.md, "Lock budget").
pub const ADVISORY_LOCKS_PER_TRANSACTION: usize = class_budget(LEASE_EXACT_LIMIT, LEASE_STRIPES)
    + class_budget(KEY_EXACT_LIMIT, KEY_STRIPES)
    + CELL_STRIPES as usize;

/// The advisory locks of one transaction, in the order they are taken: the parameters of
/// [`sql::LOCK_ADVISORY`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AdvisoryLocks {
    classes: Vec<i32>,
    keys: Vec<i32>,
    shared: Vec<bool>,
}

impl AdvisoryLocks {
    /// The locks of a transaction on lease ids `lease_ids`, claim keys `claim_keys` and the
    /// cells `cells` in `cell_mode`.
    pub(crate) fn of<'a>(
        lease_ids: impl IntoIterator<Item = LeaseId>,
        claim_keys: impl IntoIterator<Item = &'a ClaimKey>,
        cells: impl IntoIterator<Item = &'a CellId>,
        cell_mode: CellMode,
    ) -> Self {
        let mut locks = AdvisoryLocks::default();
        locks.two_level(
            (sql::LEASE_STRIPE_LOCK_CLASS, sql::LEASE_LOCK_CLASS),
            lease_ids.into_iter().map(lease_lock_key),
            LEASE_EXACT_LIMIT,
            LEASE_STRIPES,
        );
        locks.two_level(
            (sql::KEY_STRIPE_LOCK_CLASS, sql::KEY_LOCK_CLASS),
            claim_keys.into_iter().map(key_lock_key),
            KEY_EXACT_LIMIT,
            KEY_STRIPES,
        );
        let cell_stripes = sorted_unique(
            cells
                .into_iter()
                .map(|cell| stripe(fnv1a(cell.as_str().bytes()), CELL_STRIPES)),
        );
        let shared = cell_mode == CellMode::Shared;
        locks.push_all(sql::CELL_LOCK_CLASS, &cell_stripes, shared);
        locks
    }

    /// The locks of a CommitUpdate, RollbackUpdate or RenewLease of `lease_id`: its stripe
    /// (shared) and its exact lock. Also the raw-SQL baseline's lease lock.
    pub fn lease(lease_id: LeaseId) -> Self {
        Self::of([lease_id], [], [], CellMode::Shared)
    }

    /// The parameters of [`sql::LOCK_ADVISORY`].
    pub fn params(&self) -> [&(dyn ToSql + Sync); 3] {
        [&self.classes, &self.keys, &self.shared]
    }

    /// How many locks.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Below `exact_limit` distinct items: their stripes shared, then their exact locks; above
    /// it: their stripes exclusive.
    fn two_level(
        &mut self,
        (stripe_class, exact_class): (i32, i32),
        items: impl Iterator<Item = i32>,
        exact_limit: usize,
        stripes: u32,
    ) {
        let exact = sorted_unique(items);
        let striped = sorted_unique(exact.iter().map(|&key| stripe(key, stripes)));
        if exact.len() <= exact_limit {
            self.push_all(stripe_class, &striped, true);
            self.push_all(exact_class, &exact, false);
        } else {
            self.push_all(stripe_class, &striped, false);
        }
    }

    fn push_all(&mut self, class: i32, keys: &[i32], shared: bool) {
        self.classes.extend(std::iter::repeat_n(class, keys.len()));
        self.keys.extend_from_slice(keys);
        self.shared.extend(std::iter::repeat_n(shared, keys.len()));
    }
}

/// How a transaction holds the stripes of its cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CellMode {
    /// BeginUpdate: beginning transactions of one cell run in parallel.
    Shared,
    /// A decommission step: no BeginUpdate of the cell runs while it counts and marks.
    Exclusive,
}

fn sorted_unique(keys: impl Iterator<Item = i32>) -> Vec<i32> {
    let mut keys: Vec<i32> = keys.collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The stripe of exact lock key `key`: a function of the key alone, so equal items share a
/// stripe in every transaction.
fn stripe(key: i32, stripes: u32) -> i32 {
    // Lossless: stripes are far below i32::MAX.
    ((key as u32) % stripes) as i32
}

/// The exact lock key of a lease id: the id folded to 32 bits. Two ids with the same fold only
/// serialise each other; correctness never depends on it being unique.
fn lease_lock_key(lease_id: LeaseId) -> i32 {
    let wide = lease_id.as_uuid().as_u128();
    let folded = (wide as u64) ^ ((wide >> 64) as u64);
    ((folded as u32) ^ ((folded >> 32) as u32)) as i32
}

/// The exact lock key of a claim key: FNV-1a of (claim type, value). Two keys with the same
/// hash only serialize each other.
fn key_lock_key(key: &ClaimKey) -> i32 {
    fnv1a(std::iter::once(key.namespace_number() as u8).chain(key.value.bytes()))
}

/// FNV-1a (64-bit) of `bytes`, folded to 32 bits.
fn fnv1a(bytes: impl Iterator<Item = u8>) -> i32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    ((hash as u32) ^ ((hash >> 32) as u32)) as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use topology_claims_testkit::fixtures::{cell, username};

    fn lease(n: u128) -> LeaseId {
        LeaseId::from_uuid(uuid::Uuid::from_u128(n))
    }

    fn keys(prefix: &str, n: usize) -> Vec<ClaimKey> {
        (0..n)
            .map(|i| username(&format!("{prefix}-{i}")).key)
            .collect()
    }

    fn cells(n: usize) -> Vec<CellId> {
        (0..n).map(|i| cell(&format!("cell-{i}"))).collect()
    }

    /// The locks as (class, key, shared) triples, in order.
    fn triples(locks: &AdvisoryLocks) -> Vec<(i32, i32, bool)> {
        (0..locks.len())
            .map(|i| (locks.classes[i], locks.keys[i], locks.shared[i]))
            .collect()
    }

    #[test]
    fn the_budget_is_the_sum_of_the_class_budgets() {
        assert_eq!(class_budget(LEASE_EXACT_LIMIT, LEASE_STRIPES), 96);
        assert_eq!(class_budget(KEY_EXACT_LIMIT, KEY_STRIPES), 160);
        assert_eq!(ADVISORY_LOCKS_PER_TRANSACTION, 288);
    }

    #[test]
    fn a_thousand_keys_leases_and_cells_take_at_most_the_budget() {
        let ids: Vec<LeaseId> = (0..1000).map(lease).collect();
        let (claim_keys, cells) = (keys("k", 1000), cells(1000));
        let locks = AdvisoryLocks::of(ids.iter().copied(), &claim_keys, &cells, CellMode::Shared);
        let of_class = |class| locks.classes.iter().filter(|&&c| c == class).count();
        assert_eq!(of_class(sql::LEASE_LOCK_CLASS), 0, "no exact lease locks");
        assert_eq!(of_class(sql::KEY_LOCK_CLASS), 0, "no exact key locks");
        assert!(of_class(sql::LEASE_STRIPE_LOCK_CLASS) <= LEASE_STRIPES as usize);
        assert!(of_class(sql::KEY_STRIPE_LOCK_CLASS) <= KEY_STRIPES as usize);
        assert!(of_class(sql::CELL_LOCK_CLASS) <= CELL_STRIPES as usize);
        assert!(locks.len() <= ADVISORY_LOCKS_PER_TRANSACTION);
        assert!(
            triples(&locks)
                .iter()
                .all(|&(class, _, shared)| shared == (class == sql::CELL_LOCK_CLASS)),
            "stripes above the exact limit are exclusive; cells stay shared"
        );
        // 1,000 keys fill every stripe: the transaction excludes every other BeginUpdate.
        assert_eq!(of_class(sql::KEY_STRIPE_LOCK_CLASS), KEY_STRIPES as usize);
    }

    #[test]
    fn at_the_exact_limit_items_lock_exactly_and_their_stripes_shared() {
        let claim_keys = keys("k", KEY_EXACT_LIMIT);
        let ids: Vec<LeaseId> = (0..LEASE_EXACT_LIMIT as u128).map(lease).collect();
        let locks = AdvisoryLocks::of(ids, &claim_keys, [], CellMode::Shared);
        let exact = |class| {
            triples(&locks)
                .into_iter()
                .filter(|&(c, _, _)| c == class)
                .collect::<Vec<_>>()
        };
        assert_eq!(exact(sql::KEY_LOCK_CLASS).len(), KEY_EXACT_LIMIT);
        assert_eq!(exact(sql::LEASE_LOCK_CLASS).len(), LEASE_EXACT_LIMIT);
        assert!(exact(sql::KEY_LOCK_CLASS).iter().all(|&(_, _, s)| !s));
        assert!(exact(sql::KEY_STRIPE_LOCK_CLASS).iter().all(|&(_, _, s)| s));
        assert!(exact(sql::LEASE_STRIPE_LOCK_CLASS)
            .iter()
            .all(|&(_, _, s)| s));
        assert!(locks.len() <= ADVISORY_LOCKS_PER_TRANSACTION);
    }

    #[test]
    fn equal_keys_meet_on_one_stripe_in_every_transaction() {
        let key = username("alice").key;
        let alone = AdvisoryLocks::of([], [&key], [], CellMode::Shared);
        let with_many: Vec<ClaimKey> = keys("other", 999).into_iter().chain([key]).collect();
        let crowded = AdvisoryLocks::of([], &with_many, [], CellMode::Shared);
        let stripe_of_key = triples(&alone)
            .into_iter()
            .find(|&(class, _, _)| class == sql::KEY_STRIPE_LOCK_CLASS)
            .unwrap();
        assert!(stripe_of_key.2, "alone: the stripe shared");
        assert!(
            triples(&crowded).contains(&(stripe_of_key.0, stripe_of_key.1, false)),
            "among 1,000 keys: the same stripe, exclusive, so the two transactions conflict"
        );
        // And the same key twice takes one lock.
        let twice = AdvisoryLocks::of(
            [],
            [&username("bob").key, &username("bob").key],
            [],
            CellMode::Shared,
        );
        assert_eq!(twice.len(), 2, "one stripe and one exact lock");
    }

    #[test]
    fn one_lease_takes_its_stripe_shared_and_its_exact_lock() {
        let locks = AdvisoryLocks::lease(lease(7));
        let key = lease_lock_key(lease(7));
        assert_eq!(
            triples(&locks),
            vec![
                (
                    sql::LEASE_STRIPE_LOCK_CLASS,
                    stripe(key, LEASE_STRIPES),
                    true
                ),
                (sql::LEASE_LOCK_CLASS, key, false),
            ]
        );
        assert_ne!(lease_lock_key(lease(1)), lease_lock_key(lease(2)));
    }

    #[test]
    fn locks_come_in_the_one_total_order() {
        let claim_keys = keys("k", 40);
        let locks = AdvisoryLocks::of(
            (0..10).map(lease),
            &claim_keys,
            &cells(5),
            CellMode::Exclusive,
        );
        let rank = |class| {
            [
                sql::LEASE_STRIPE_LOCK_CLASS,
                sql::LEASE_LOCK_CLASS,
                sql::KEY_STRIPE_LOCK_CLASS,
                sql::KEY_LOCK_CLASS,
                sql::CELL_LOCK_CLASS,
            ]
            .iter()
            .position(|&c| c == class)
            .unwrap()
        };
        let order: Vec<(usize, i32)> = triples(&locks)
            .into_iter()
            .map(|(class, key, _)| (rank(class), key))
            .collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(order, sorted, "strictly ascending by (class rank, key)");
        let cell_locks: BTreeSet<bool> = triples(&locks)
            .into_iter()
            .filter(|&(class, _, _)| class == sql::CELL_LOCK_CLASS)
            .map(|(_, _, shared)| shared)
            .collect();
        assert_eq!(
            cell_locks,
            BTreeSet::from([false]),
            "a decommission step's cell lock"
        );
    }

    #[test]
    fn a_cell_has_one_stripe_in_every_transaction() {
        let a = cell("cell-a");
        let lone = AdvisoryLocks::of([], [], [&a], CellMode::Shared);
        let step = AdvisoryLocks::of([], [], [&a], CellMode::Exclusive);
        assert_eq!((lone.len(), step.len()), (1, 1));
        assert_eq!(lone.keys, step.keys);
        let group = AdvisoryLocks::of([], [], &cells(100), CellMode::Shared);
        assert!(group.len() <= CELL_STRIPES as usize);
    }
}
