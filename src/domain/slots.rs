//! The fleet-wide verification limit: at most `max` verifiers run at once, each holding a
//! verification slot, a lease with a time-to-live that its holder renews while it runs and that
//! expires if it dies, and at most `per_cell` of them are held by one cell, so one cell cannot
//! take the fleet's slots (decision 078). Slots are rows of the store (`verification_slots`), so
//! every server on the store shares both limits.
//!
//! Owns the rules of acquire (grant, renewal, refusal with a retry hint) and release. Must not do
//! I/O or read a clock: the store's clock is an input, and stores write what [`decide_acquire`]
//! and [`decide_release`] say.

use std::time::Duration;

use crate::domain::types::{CellId, Timestamp};
use crate::error::ClaimsError;

/// Default of `serve --max-concurrent-verifications`.
pub const DEFAULT_MAX_CONCURRENT_VERIFICATIONS: u32 = 8;
/// Default of `serve --max-verifications-per-cell`: one verifier per cell runs at a time, so a
/// cell whose cron starts verifiers over and over holds one slot, never the fleet's.
pub const DEFAULT_MAX_VERIFICATIONS_PER_CELL: u32 = 1;
/// Default of `serve --verification-slot-ttl`.
pub const DEFAULT_VERIFICATION_SLOT_TTL: Duration = Duration::from_secs(60);
/// A refused acquire is told to retry at the earliest expiry, but no later than a sixth of the
/// ttl: holders usually release long before their slot would expire, and a waiter that slept
/// until the expiry would leave the slot idle meanwhile.
pub const RETRIES_PER_TTL: u32 = 6;
/// Longest holder name: it is part of the slot row's key.
pub const SLOT_HOLDER_MAX_LEN: usize = 128;

/// Who holds a slot: a cell's verifier, named by the cell and a holder id of its choosing
/// (the sidecar's host and process, so two sidecars of one cell are two holders).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotHolder {
    pub cell_id: CellId,
    pub holder: String,
}

impl SlotHolder {
    /// A holder id must be 1 to [`SLOT_HOLDER_MAX_LEN`] printable ASCII characters.
    pub fn new(cell_id: CellId, holder: &str) -> Result<Self, ClaimsError> {
        let printable = holder.bytes().all(|b| b.is_ascii_graphic());
        if holder.is_empty() || holder.len() > SLOT_HOLDER_MAX_LEN || !printable {
            return Err(ClaimsError::invalid(
                "holder",
                format!("must be 1 to {SLOT_HOLDER_MAX_LEN} printable ASCII characters"),
            ));
        }
        Ok(Self {
            cell_id,
            holder: holder.to_owned(),
        })
    }
}

impl std::fmt::Display for SlotHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.cell_id, self.holder)
    }
}

/// One row of `verification_slots`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotRow {
    pub holder: SlotHolder,
    /// By the store's clock; the slot is free from then on.
    pub expires_at: Timestamp,
}

/// The limit and time-to-live one acquire runs under (the server's configuration, the ttl
/// possibly shortened by the request: [`slot_ttl`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotLimit {
    /// Most unexpired slots at once; `0` means unlimited.
    pub max: u32,
    /// Most unexpired slots one cell holds at once; `0` means no cap beyond `max`.
    pub per_cell: u32,
    pub ttl: Duration,
}

/// Which limit refused an acquire (`VERIFICATION_SLOTS_BUSY`'s ErrorInfo metadata `limit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlotCap {
    /// Every slot of the fleet is held (`--max-concurrent-verifications`).
    Fleet,
    /// The caller's cell holds as many slots as one cell may (`--max-verifications-per-cell`);
    /// other cells may still take the free ones.
    PerCell,
}

impl SlotCap {
    /// The serve flag that sets the limit, without its dashes: the metadata value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fleet => "max-concurrent-verifications",
            Self::PerCell => "max-verifications-per-cell",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Fleet, Self::PerCell]
            .into_iter()
            .find(|cap| cap.name() == name)
    }
}

impl std::fmt::Display for SlotCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Fleet => "all verification slots of the fleet are in use",
            Self::PerCell => "the cell holds all the verification slots one cell may",
        })
    }
}

/// A granted (or renewed) slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotGrant {
    pub holder: SlotHolder,
    /// By the store's clock: renew well before it.
    pub expires_at: Timestamp,
    /// Whether the holder already had it (unexpired) before this call.
    pub renewed: bool,
    /// Unexpired slots after this grant, this one included.
    pub in_use: u32,
}

/// What an acquire must write: delete the expired rows, then insert or overwrite the holder's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquirePlan {
    pub grant: SlotGrant,
    /// Expired rows of other holders (free slots), deleted so the table stays small.
    pub expired: Vec<SlotHolder>,
}

/// The slot time-to-live of one request: the server's, or the request's when it is shorter.
/// A request may only shorten it (a verifier that renews more often), never lengthen it.
pub fn slot_ttl(server: Duration, requested: Option<Duration>) -> Duration {
    match requested {
        Some(ttl) if !ttl.is_zero() => ttl.min(server),
        _ => server,
    }
}

/// Decides an acquire of `holder` at `now` over every row of `verification_slots`.
///
/// Expired rows are free. The holder's own unexpired row is renewed (until `now + ttl`) whatever
/// the limits, so a running verifier keeps its slot after a limit was lowered. Otherwise a slot
/// is granted when the holder's cell holds fewer than `per_cell` unexpired rows and fewer than
/// `max` unexpired rows exist. A refusal is RESOURCE_EXHAUSTED `VERIFICATION_SLOTS_BUSY` naming
/// the limit (the cell's cap first: it is the one a waiting cell must wait out even when other
/// slots free), retrying when the earliest of the rows that fill that limit expires or after a
/// sixth of the ttl ([`RETRIES_PER_TTL`]), whichever comes first.
pub fn decide_acquire(
    rows: &[SlotRow],
    holder: &SlotHolder,
    limit: SlotLimit,
    now: Timestamp,
) -> Result<AcquirePlan, ClaimsError> {
    let live = |row: &&SlotRow| row.expires_at > now;
    let renewed = rows.iter().filter(live).any(|row| &row.holder == holder);
    let others: Vec<&SlotRow> = rows
        .iter()
        .filter(live)
        .filter(|row| &row.holder != holder)
        .collect();
    let count = |rows: &[&SlotRow]| u32::try_from(rows.len()).unwrap_or(u32::MAX);
    let in_use = count(&others);
    if !renewed {
        let cells: Vec<&SlotRow> = others
            .iter()
            .filter(|row| row.holder.cell_id == holder.cell_id)
            .copied()
            .collect();
        let busy = |held: &[&SlotRow], max: u32, cap: SlotCap| {
            let earliest = held.iter().map(|row| row.expires_at).min().unwrap_or(now);
            ClaimsError::VerificationSlotsBusy {
                in_use: count(held),
                max,
                limit: cap,
                retry_after: earliest
                    .saturating_since(now)
                    .min(limit.ttl / RETRIES_PER_TTL),
            }
        };
        if limit.per_cell != 0 && count(&cells) >= limit.per_cell {
            return Err(busy(&cells, limit.per_cell, SlotCap::PerCell));
        }
        if limit.max != 0 && in_use >= limit.max {
            return Err(busy(&others, limit.max, SlotCap::Fleet));
        }
    }
    let expired = rows
        .iter()
        .filter(|row| row.expires_at <= now && &row.holder != holder)
        .map(|row| row.holder.clone())
        .collect();
    Ok(AcquirePlan {
        grant: SlotGrant {
            holder: holder.clone(),
            expires_at: now.saturating_add(limit.ttl),
            renewed,
            in_use: in_use.saturating_add(1),
        },
        expired,
    })
}

/// Whether a release of `holder` deletes a row: only the holder's own (expired or not). Another
/// holder's slot is never released by someone else; it frees when it expires.
pub fn decide_release(row: Option<&SlotRow>, holder: &SlotHolder) -> bool {
    row.is_some_and(|row| &row.holder == holder)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(cell: &str, name: &str) -> SlotHolder {
        SlotHolder::new(CellId::parse(cell).unwrap(), name).unwrap()
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_unix_micros(secs * 1_000_000)
    }

    fn row(cell: &str, expires: i64) -> SlotRow {
        SlotRow {
            holder: holder(cell, "h"),
            expires_at: at(expires),
        }
    }

    /// No cap per cell: the fleet-wide cases below use one holder per cell anyway.
    const LIMIT: SlotLimit = SlotLimit {
        max: 2,
        per_cell: 0,
        ttl: Duration::from_secs(60),
    };

    #[test]
    fn slots_are_granted_up_to_the_limit() {
        let plan = decide_acquire(&[], &holder("a", "h"), LIMIT, at(100)).unwrap();
        assert_eq!(plan.grant.expires_at, at(160));
        assert_eq!(plan.grant.in_use, 1);
        assert!(!plan.grant.renewed);
        let plan = decide_acquire(&[row("a", 150)], &holder("b", "h"), LIMIT, at(100)).unwrap();
        assert_eq!(plan.grant.in_use, 2);
    }

    #[test]
    fn a_full_limit_refuses_until_the_earliest_expiry() {
        let rows = [row("a", 150), row("b", 105)];
        let error = decide_acquire(&rows, &holder("c", "h"), LIMIT, at(100)).unwrap_err();
        assert_eq!(
            error,
            ClaimsError::VerificationSlotsBusy {
                in_use: 2,
                max: 2,
                limit: SlotCap::Fleet,
                retry_after: Duration::from_secs(5)
            }
        );
        // No later than a sixth of the ttl: holders usually release before expiry.
        let rows = [row("a", 150), row("b", 130)];
        let error = decide_acquire(&rows, &holder("c", "h"), LIMIT, at(100)).unwrap_err();
        assert!(matches!(
            error,
            ClaimsError::VerificationSlotsBusy { retry_after, .. }
                if retry_after == Duration::from_secs(10)
        ));
    }

    #[test]
    fn the_holder_renews_its_own_slot_even_over_the_limit() {
        let rows = [row("a", 150), row("b", 130)];
        let limit = SlotLimit { max: 1, ..LIMIT };
        let plan = decide_acquire(&rows, &holder("a", "h"), limit, at(120)).unwrap();
        assert!(plan.grant.renewed);
        assert_eq!(plan.grant.expires_at, at(180));
        assert!(plan.expired.is_empty());
    }

    #[test]
    fn expired_slots_are_free_and_deleted() {
        let rows = [row("a", 100), row("b", 90)];
        let plan = decide_acquire(&rows, &holder("c", "h"), LIMIT, at(100)).unwrap();
        assert_eq!(plan.grant.in_use, 1);
        assert_eq!(plan.expired, vec![holder("a", "h"), holder("b", "h")]);
        // The holder's own expired row is overwritten, not deleted, and is not a renewal.
        let plan = decide_acquire(&rows, &holder("a", "h"), LIMIT, at(100)).unwrap();
        assert!(!plan.grant.renewed);
        assert_eq!(plan.expired, vec![holder("b", "h")]);
    }

    #[test]
    fn zero_means_unlimited() {
        let rows: Vec<SlotRow> = (0..50).map(|i| row(&format!("c{i}"), 200)).collect();
        let limit = SlotLimit { max: 0, ..LIMIT };
        let plan = decide_acquire(&rows, &holder("z", "h"), limit, at(100)).unwrap();
        assert_eq!(plan.grant.in_use, 51);
    }

    fn named(cell: &str, name: &str, expires: i64) -> SlotRow {
        SlotRow {
            holder: holder(cell, name),
            expires_at: at(expires),
        }
    }

    #[test]
    fn a_cell_at_its_cap_is_refused_while_other_cells_take_free_slots() {
        let limit = SlotLimit {
            max: 4,
            per_cell: 2,
            ..LIMIT
        };
        let rows = [named("a", "h1", 150), named("a", "h2", 130)];
        let error = decide_acquire(&rows, &holder("a", "h3"), limit, at(100)).unwrap_err();
        assert_eq!(
            error,
            ClaimsError::VerificationSlotsBusy {
                in_use: 2,
                max: 2,
                limit: SlotCap::PerCell,
                retry_after: Duration::from_secs(10)
            }
        );
        let plan = decide_acquire(&rows, &holder("b", "h1"), limit, at(100)).unwrap();
        assert_eq!(plan.grant.in_use, 3);
    }

    #[test]
    fn the_cells_cap_retries_when_its_own_earliest_slot_expires() {
        let limit = SlotLimit {
            max: 4,
            per_cell: 1,
            ..LIMIT
        };
        // Another cell's slot expires sooner, but only the cell's own frees its cap.
        let rows = [named("a", "h1", 108), named("b", "h1", 101)];
        let error = decide_acquire(&rows, &holder("a", "h2"), limit, at(100)).unwrap_err();
        assert!(matches!(
            error,
            ClaimsError::VerificationSlotsBusy { limit: SlotCap::PerCell, in_use: 1, max: 1, retry_after }
                if retry_after == Duration::from_secs(8)
        ));
    }

    #[test]
    fn the_cells_cap_counts_only_unexpired_slots_and_never_refuses_a_renewal() {
        let limit = SlotLimit {
            max: 4,
            per_cell: 1,
            ..LIMIT
        };
        let rows = [named("a", "h1", 100)];
        let plan = decide_acquire(&rows, &holder("a", "h2"), limit, at(100)).unwrap();
        assert_eq!(plan.expired, vec![holder("a", "h1")]);
        // A holder over its cell's cap (the cap was lowered while it ran) keeps its slot.
        let rows = [named("a", "h1", 150), named("a", "h2", 150)];
        let plan = decide_acquire(&rows, &holder("a", "h2"), limit, at(100)).unwrap();
        assert!(plan.grant.renewed);
    }

    #[test]
    fn a_full_fleet_refuses_with_the_fleet_limit_when_the_cell_is_under_its_cap() {
        let limit = SlotLimit {
            max: 2,
            per_cell: 1,
            ..LIMIT
        };
        let rows = [named("a", "h1", 150), named("b", "h1", 150)];
        let error = decide_acquire(&rows, &holder("c", "h1"), limit, at(100)).unwrap_err();
        assert!(matches!(
            error,
            ClaimsError::VerificationSlotsBusy {
                limit: SlotCap::Fleet,
                in_use: 2,
                max: 2,
                ..
            }
        ));
    }

    #[test]
    fn slot_cap_names_are_the_serve_flags() {
        for cap in [SlotCap::Fleet, SlotCap::PerCell] {
            assert_eq!(SlotCap::from_name(cap.name()), Some(cap));
        }
        assert_eq!(SlotCap::from_name("other"), None);
    }

    #[test]
    fn only_the_holder_releases_its_slot() {
        let mine = row("a", 150);
        assert!(decide_release(Some(&mine), &holder("a", "h")));
        assert!(!decide_release(Some(&mine), &holder("a", "other")));
        assert!(!decide_release(None, &holder("a", "h")));
    }

    #[test]
    fn a_request_may_only_shorten_the_ttl() {
        let server = Duration::from_secs(60);
        assert_eq!(slot_ttl(server, None), server);
        assert_eq!(slot_ttl(server, Some(Duration::ZERO)), server);
        assert_eq!(
            slot_ttl(server, Some(Duration::from_secs(5))),
            Duration::from_secs(5)
        );
        assert_eq!(slot_ttl(server, Some(Duration::from_secs(600))), server);
    }

    #[test]
    fn holder_ids_are_bounded_printable_ascii() {
        let cell = CellId::parse("a").unwrap();
        assert!(SlotHolder::new(cell.clone(), "host-1:42").is_ok());
        for bad in ["", "has space", "é", &"x".repeat(SLOT_HOLDER_MAX_LEN + 1)] {
            assert!(SlotHolder::new(cell.clone(), bad).is_err(), "{bad:?}");
        }
    }
}
