//! The TLS handshakes in flight on a listener (`--max-handshakes-per-address`): counted per
//! peer address (an IPv6 peer by its /64), and kept oldest first so that a full server can close
//! the oldest for a new connection (`listener::Acceptor`). Nobody has an identity before the
//! handshake ends, so these are the only places a peer without a certificate can hold there.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// The peer "address" whose handshakes in flight are counted together: an IPv4 address (also
/// when mapped into IPv6), or an IPv6 address's /64 prefix. One subscriber, host or container
/// usually gets a whole /64, and can pick any address in it for each connection: counted by
/// full address, one such peer would have no limit at all.
fn address_group(address: std::net::IpAddr) -> std::net::IpAddr {
    match address {
        std::net::IpAddr::V4(v4) => std::net::IpAddr::V4(v4),
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => std::net::IpAddr::V6(std::net::Ipv6Addr::from(
                u128::from(v6) & !((1u128 << 64) - 1),
            )),
        },
    }
}

/// The TLS handshakes in flight per peer address (`--max-handshakes-per-address`; an IPv6
/// peer counts by its /64, [`address_group`]).
/// Also every handshake in flight, oldest first, so that a new connection can take the place
/// of the oldest when every place is taken ([`HandshakeSlots::evict_oldest`]).
pub(super) struct HandshakeSlots {
    pub(super) per_address: usize,
    counts: std::sync::Mutex<InFlight>,
}

#[derive(Default)]
struct InFlight {
    by_address: std::collections::HashMap<std::net::IpAddr, usize>,
    /// Accept order → (accepted at, how to close it).
    oldest_first: std::collections::BTreeMap<u64, (tokio::time::Instant, Arc<Notify>)>,
    accepted: u64,
}

/// One handshake's place, given back when the handshake ends (or the connection is dropped).
pub(super) struct HandshakeSlot {
    slots: Arc<HandshakeSlots>,
    address: std::net::IpAddr,
    order: u64,
    /// Notified when a new connection takes this handshake's place.
    pub(super) evicted: Arc<Notify>,
}

impl HandshakeSlots {
    pub(super) fn new(per_address: usize) -> Self {
        Self {
            per_address,
            counts: std::sync::Mutex::default(),
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, InFlight> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the oldest handshake in flight if it began at least `min_age` ago (one of a
    /// peer that never finishes; a cell's handshake takes milliseconds): its age.
    pub(super) fn evict_oldest(&self, min_age: Duration) -> Option<Duration> {
        let mut in_flight = self.counts();
        let (&order, &(accepted, _)) = in_flight.oldest_first.iter().next()?;
        let age = accepted.elapsed();
        if age < min_age {
            return None;
        }
        let (_, evicted) = in_flight.oldest_first.remove(&order)?;
        // Stored if its task is not waiting yet: it then stops at its first wait.
        evicted.notify_one();
        Some(age)
    }

    /// A place for a handshake from `address`, unless it has `per_address` in flight already.
    pub(super) fn take(self: &Arc<Self>, address: std::net::IpAddr) -> Option<HandshakeSlot> {
        let address = address_group(address);
        let mut in_flight = self.counts();
        let count = in_flight.by_address.entry(address).or_default();
        if *count >= self.per_address {
            return None;
        }
        *count += 1;
        in_flight.accepted += 1;
        let order = in_flight.accepted;
        let evicted = Arc::new(Notify::new());
        let now = tokio::time::Instant::now();
        in_flight
            .oldest_first
            .insert(order, (now, Arc::clone(&evicted)));
        Some(HandshakeSlot {
            slots: Arc::clone(self),
            address,
            order,
            evicted,
        })
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut in_flight = self.slots.counts();
        in_flight.oldest_first.remove(&self.order);
        if let Some(count) = in_flight.by_address.get_mut(&self.address) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                in_flight.by_address.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_peer_counts_its_handshakes_by_its_64_prefix() {
        let slots = Arc::new(HandshakeSlots::new(2));
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        // Two addresses of one /64 take its two places; a third address of it finds none.
        let first = slots.take(ip("2001:db8:1:2::1"));
        let second = slots.take(ip("2001:db8:1:2:ffff:0:0:7"));
        assert!(first.is_some() && second.is_some());
        assert!(slots.take(ip("2001:db8:1:2::99")).is_none());
        // The next /64 and an IPv4 peer are counted apart.
        assert!(slots.take(ip("2001:db8:1:3::1")).is_some());
        let v4 = slots.take(ip("192.0.2.7"));
        assert!(v4.is_some());
        // The same IPv4 peer mapped into IPv6 is that peer.
        let mapped = slots.take(ip("::ffff:192.0.2.7"));
        assert!(mapped.is_some());
        assert!(slots.take(ip("192.0.2.7")).is_none());
        // A place is given back when its handshake ends.
        drop(first);
        assert!(slots.take(ip("2001:db8:1:2::abcd")).is_some());
    }

    #[test]
    fn the_oldest_handshake_gives_way_only_past_the_minimum_age() {
        let slots = Arc::new(HandshakeSlots::new(8));
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let first = slots.take(ip("192.0.2.1")).unwrap();
        let second = slots.take(ip("192.0.2.2")).unwrap();
        assert_eq!(slots.evict_oldest(Duration::from_secs(60)), None);
        assert!(slots.evict_oldest(Duration::ZERO).is_some());
        // The first was told (its notice waits for it); the second was not.
        let told = |slot: &HandshakeSlot| {
            let notified = slot.evicted.notified();
            futures::FutureExt::now_or_never(notified).is_some()
        };
        assert!(told(&first));
        assert!(!told(&second));
        // The next oldest is the second; once it ends there is nothing to close.
        assert!(slots.evict_oldest(Duration::ZERO).is_some());
        drop((first, second));
        assert_eq!(slots.evict_oldest(Duration::ZERO), None);
    }
}
