//! The fleet-wide verification slots: granted up to the limit, refused beyond it with a retry
//! hint, renewed by their holder, released only by it, and free again once expired; and one
//! cell's cap, which refuses that cell while other cells still take free slots.

use std::time::Duration;

use crate::fixtures::cell;
use topology_claims::domain::{SlotCap, SlotHolder, SlotLimit};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

/// The limit every case runs under (the gRPC conformance store's server serves exactly this).
pub const SUITE_SLOTS: u32 = 2;
/// The cap of one cell every case runs under (the default of `serve`, served by the gRPC
/// conformance store's server too). The fleet-wide cases use one holder per cell.
pub const SUITE_SLOTS_PER_CELL: u32 = 1;

const LIMIT: SlotLimit = SlotLimit {
    max: SUITE_SLOTS,
    per_cell: SUITE_SLOTS_PER_CELL,
    ttl: Duration::from_secs(30),
};

fn holder(cell_id: &str, name: &str) -> SlotHolder {
    SlotHolder::new(cell(cell_id), name).expect("a valid holder")
}

pub async fn verification_slots_are_granted_up_to_the_limit_then_refused_with_a_retry_hint(
    store: &impl ClaimStore,
) {
    let first = store
        .acquire_verification_slot(&holder("cell-a", "h1"), LIMIT)
        .await
        .expect("first slot");
    assert_eq!(first.in_use, 1);
    assert!(!first.renewed);
    let second = store
        .acquire_verification_slot(&holder("cell-b", "h1"), LIMIT)
        .await
        .expect("second slot");
    assert_eq!(second.in_use, 2);
    let error = store
        .acquire_verification_slot(&holder("cell-c", "h1"), LIMIT)
        .await
        .unwrap_err();
    match error {
        ClaimsError::VerificationSlotsBusy {
            in_use,
            max,
            limit,
            retry_after,
        } => {
            assert_eq!((in_use, max, limit), (2, SUITE_SLOTS, SlotCap::Fleet));
            assert!(
                retry_after > Duration::ZERO && retry_after <= LIMIT.ttl,
                "retry when the earliest slot expires: {retry_after:?}"
            );
        }
        other => panic!("expected VERIFICATION_SLOTS_BUSY, got {other:?}"),
    }
}

pub async fn a_verification_slot_renewed_by_its_holder_lasts_longer(store: &impl ClaimStore) {
    let me = holder("cell-a", "h1");
    let first = store.acquire_verification_slot(&me, LIMIT).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = store.acquire_verification_slot(&me, LIMIT).await.unwrap();
    assert!(again.renewed, "the holder's second acquire is a renewal");
    assert_eq!(again.in_use, 1, "a renewal takes no second slot");
    assert!(
        again.expires_at > first.expires_at,
        "{:?} then {:?}",
        first.expires_at,
        again.expires_at
    );
    // The other slot is still free, and then none is: renewal did not count twice.
    store
        .acquire_verification_slot(&holder("cell-b", "h1"), LIMIT)
        .await
        .expect("the second slot");
    assert!(matches!(
        store
            .acquire_verification_slot(&holder("cell-c", "h1"), LIMIT)
            .await,
        Err(ClaimsError::VerificationSlotsBusy { .. })
    ));
}

pub async fn a_released_verification_slot_is_free_again(store: &impl ClaimStore) {
    let (a, b, c) = (
        holder("cell-a", "h1"),
        holder("cell-b", "h1"),
        holder("cell-c", "h1"),
    );
    store.acquire_verification_slot(&a, LIMIT).await.unwrap();
    store.acquire_verification_slot(&b, LIMIT).await.unwrap();
    assert!(store.release_verification_slot(&a).await.unwrap());
    assert!(
        !store.release_verification_slot(&a).await.unwrap(),
        "a second release finds nothing"
    );
    let grant = store
        .acquire_verification_slot(&c, LIMIT)
        .await
        .expect("the released slot");
    assert_eq!(grant.in_use, 2);
}

pub async fn an_expired_verification_slot_is_free_again(store: &impl ClaimStore) {
    let short = SlotLimit {
        ttl: Duration::from_millis(300),
        ..LIMIT
    };
    let (a, b, c) = (
        holder("cell-a", "h1"),
        holder("cell-b", "h1"),
        holder("cell-c", "h1"),
    );
    store.acquire_verification_slot(&a, short).await.unwrap();
    store.acquire_verification_slot(&b, LIMIT).await.unwrap();
    assert!(store.acquire_verification_slot(&c, LIMIT).await.is_err());
    tokio::time::sleep(Duration::from_millis(600)).await;
    let grant = store
        .acquire_verification_slot(&c, LIMIT)
        .await
        .expect("a's slot expired, so it is free");
    assert_eq!(grant.in_use, 2, "the expired slot no longer counts");
    // a's renewal after expiry is a new acquire, and the limit is full again.
    assert!(matches!(
        store.acquire_verification_slot(&a, LIMIT).await,
        Err(ClaimsError::VerificationSlotsBusy { in_use: 2, .. })
    ));
    assert!(
        !store.release_verification_slot(&a).await.unwrap(),
        "an expired, overwritten slot is not released"
    );
}

pub async fn a_verification_slot_is_released_only_by_its_holder(store: &impl ClaimStore) {
    let mine = holder("cell-a", "h1");
    store.acquire_verification_slot(&mine, LIMIT).await.unwrap();
    for other in [holder("cell-a", "h2"), holder("cell-b", "h1")] {
        assert!(
            !store.release_verification_slot(&other).await.unwrap(),
            "{other} released nothing"
        );
    }
    store
        .acquire_verification_slot(&holder("cell-b", "h1"), LIMIT)
        .await
        .unwrap();
    assert!(
        store
            .acquire_verification_slot(&holder("cell-c", "h1"), LIMIT)
            .await
            .is_err(),
        "the holder's slot is still held"
    );
    let renewal = store.acquire_verification_slot(&mine, LIMIT).await.unwrap();
    assert!(renewal.renewed);
}

pub async fn concurrent_acquires_never_exceed_the_limit(store: &impl ClaimStore) {
    let holders: Vec<SlotHolder> = (0..8).map(|i| holder(&format!("cell-{i}"), "h1")).collect();
    let results = futures::future::join_all(
        holders
            .iter()
            .map(|h| store.acquire_verification_slot(h, LIMIT)),
    )
    .await;
    let granted = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(granted, SUITE_SLOTS as usize, "{results:?}");
    assert!(results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .all(|e| matches!(e, ClaimsError::VerificationSlotsBusy { .. })));
}

pub async fn a_cell_at_its_verification_slot_cap_is_refused_while_other_cells_get_slots(
    store: &impl ClaimStore,
) {
    let first = holder("cell-a", "h1");
    store
        .acquire_verification_slot(&first, LIMIT)
        .await
        .expect("the cell's first slot");
    match store
        .acquire_verification_slot(&holder("cell-a", "h2"), LIMIT)
        .await
    {
        Err(ClaimsError::VerificationSlotsBusy {
            in_use,
            max,
            limit,
            retry_after,
        }) => {
            assert_eq!(
                (in_use, max, limit),
                (SUITE_SLOTS_PER_CELL, SUITE_SLOTS_PER_CELL, SlotCap::PerCell)
            );
            assert!(
                retry_after > Duration::ZERO && retry_after <= LIMIT.ttl,
                "retry when the cell's earliest slot expires: {retry_after:?}"
            );
        }
        other => panic!("expected VERIFICATION_SLOTS_BUSY of the cell's cap, got {other:?}"),
    }
    let other = store
        .acquire_verification_slot(&holder("cell-b", "h1"), LIMIT)
        .await
        .expect("another cell still gets a free slot");
    assert_eq!(other.in_use, 2);
    let renewal = store
        .acquire_verification_slot(&first, LIMIT)
        .await
        .expect("the holder at its cell's cap renews its slot");
    assert!(renewal.renewed);
    // Once the cell's slot is released, the cell may take one again.
    assert!(store.release_verification_slot(&first).await.unwrap());
    store
        .acquire_verification_slot(&holder("cell-a", "h2"), LIMIT)
        .await
        .expect("the cell is under its cap again");
}
