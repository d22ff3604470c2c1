//! What the benchmark's clients ask for: the scenarios (`unique`, `hot`, `churn`), the K-claim
//! batch of one signup (username, email, routes…), and the Zipf sampler of the hot scenario.
//!
//! Owns key generation only; it must not talk to any system (the drivers do) nor decide anything
//! about claims (the systems under test do).

use std::fmt;
use std::str::FromStr;

use topology_claims::{CellId, ClaimKey, ClaimRecord, ClaimType, LeaseOp, OwnerType, TableName};

/// Why an operation did not succeed: the service's ErrorInfo reason, or a baseline's
/// equivalent.
pub type Reason = String;

/// A benchmark scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scenario {
    /// Every batch creates claims nobody else touches: no conflicts; the tables grow.
    Unique,
    /// Batches pick an entity from a Zipf distribution over a small key space, create its claims
    /// and, when that worked, destroy them again: CLAIM_TAKEN / CLAIM_LEASED happen.
    Hot,
    /// Create a batch of fresh claims, then destroy the same claims: two pairs per batch.
    Churn,
}

impl Scenario {
    pub const fn name(self) -> &'static str {
        match self {
            Self::Unique => "unique",
            Self::Hot => "hot",
            Self::Churn => "churn",
        }
    }

    /// Whether a created batch is destroyed again by the same client.
    pub const fn destroys(self) -> bool {
        matches!(self, Self::Hot | Self::Churn)
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scenario {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "unique" => Ok(Self::Unique),
            "hot" => Ok(Self::Hot),
            "churn" => Ok(Self::Churn),
            other => Err(format!(
                "unknown scenario {other:?}; expected unique, hot or churn"
            )),
        }
    }
}

/// One BeginUpdate's worth of claims, with what it does to them.
#[derive(Clone, Debug)]
pub struct Batch {
    pub cell: CellId,
    pub op: LeaseOp,
    pub records: Vec<ClaimRecord>,
}

impl Batch {
    /// The same claims, destroyed.
    pub fn destroying(&self) -> Batch {
        Batch {
            op: LeaseOp::Destroy,
            ..self.clone()
        }
    }

    /// The keys in (claim_type, claim_value) order: the lock order of the SQL statements.
    pub fn sorted_keys(&self) -> Vec<&ClaimKey> {
        let mut keys: Vec<&ClaimKey> = self.records.iter().map(|r| &r.key).collect();
        keys.sort();
        keys
    }

    pub fn to_begin_update(
        &self,
        lease_id: topology_claims::LeaseId,
    ) -> topology_claims::BeginUpdate {
        let (mut creates, mut destroys, mut updates) = (Vec::new(), Vec::new(), Vec::new());
        match self.op {
            LeaseOp::Create => creates = self.records.clone(),
            LeaseOp::Destroy => destroys = self.records.clone(),
            LeaseOp::Update => updates = self.records.clone(),
        }
        topology_claims::BeginUpdate {
            local_transaction: None,
            cell_id: self.cell.clone(),
            lease_id: Some(lease_id),
            creates,
            destroys,
            updates,
        }
    }
}

/// The cell benchmark client `client` acts for (`bench-N`): one cell per client, as cells are
/// independent callers. Under TLS its connection presents this cell's certificate.
pub fn client_cell(client: usize) -> CellId {
    // Cell ids are [A-Za-z0-9._-].
    CellId::parse(&format!("bench-{client}")).unwrap_or_else(|_| {
        CellId::parse("bench").unwrap_or_else(|_| unreachable!("a constant valid cell id"))
    })
}

/// Makes the batches of one client in one segment.
pub struct Generator {
    scenario: Scenario,
    batch: usize,
    cell: CellId,
    /// Distinguishes runs, segments and clients, so unique keys never collide.
    prefix: String,
    client: u64,
    seq: u64,
    zipf: Option<std::sync::Arc<Zipf>>,
    rng: fastrand::Rng,
}

impl Generator {
    /// The batches of client `client`: its own cell, its own random stream (`seed` offset by
    /// the client), and `zipf` when the scenario is hot.
    pub fn new(
        scenario: Scenario,
        batch: usize,
        prefix: String,
        client: usize,
        zipf: &std::sync::Arc<Zipf>,
        seed: u64,
    ) -> Self {
        let cell = client_cell(client);
        Self {
            scenario,
            batch: batch.max(1),
            cell,
            prefix,
            client: client as u64,
            seq: 0,
            zipf: (scenario == Scenario::Hot).then(|| std::sync::Arc::clone(zipf)),
            rng: fastrand::Rng::with_seed(seed.wrapping_add(client as u64)),
        }
    }

    /// The next create batch.
    pub fn next(&mut self) -> Batch {
        self.seq += 1;
        let (entity, record_id) = match (self.scenario, &self.zipf) {
            (Scenario::Hot, Some(zipf)) => {
                let rank = zipf.sample(&mut self.rng);
                (format!("hot{rank}"), rank as i64)
            }
            _ => (
                format!("{}c{}n{}", self.prefix, self.client, self.seq),
                ((self.client << 40) | self.seq) as i64,
            ),
        };
        Batch {
            cell: self.cell.clone(),
            op: LeaseOp::Create,
            records: signup_claims(&entity, record_id, self.batch),
        }
    }
}

/// The claims of one signup: username, email, then routes (`org/E`, `org/E/r2`, …) up to `k`.
pub fn signup_claims(entity: &str, record_id: i64, k: usize) -> Vec<ClaimRecord> {
    (0..k)
        .map(|j| {
            let (claim_type, value, table) = match j {
                0 => (ClaimType::Username, entity.to_owned(), TableName::USERS),
                1 => (
                    ClaimType::Email,
                    format!("{entity}@bench.example"),
                    TableName::EMAILS,
                ),
                2 => (
                    ClaimType::Routes,
                    format!("org/{entity}"),
                    TableName::ROUTES,
                ),
                _ => (
                    ClaimType::Routes,
                    format!("org/{entity}/r{j}"),
                    TableName::ROUTES,
                ),
            };
            ClaimRecord {
                display: None,
                key: ClaimKey::new(claim_type, value),
                owner_type: OwnerType::USER,
                owner_value: entity.to_owned(),
                table_name: table,
                table_record_id: record_id,
            }
        })
        .collect()
}

/// Zipf(s) over ranks `0..n` (rank 0 hottest), sampled by inverting the cumulative weights.
pub struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, exponent: f64) -> Self {
        let mut total = 0.0;
        let cumulative = (1..=n.max(1))
            .map(|rank| {
                total += 1.0 / (rank as f64).powf(exponent);
                total
            })
            .collect();
        Self { cumulative }
    }

    pub fn sample(&self, rng: &mut fastrand::Rng) -> usize {
        let total = self.cumulative.last().copied().unwrap_or(1.0);
        let target = rng.f64() * total;
        self.cumulative
            .partition_point(|&c| c < target)
            .min(self.cumulative.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_prefers_low_ranks_and_stays_in_range() {
        let zipf = Zipf::new(100, 1.0);
        let mut rng = fastrand::Rng::with_seed(7);
        let mut counts = [0u32; 100];
        for _ in 0..20_000 {
            counts[zipf.sample(&mut rng)] += 1;
        }
        assert!(counts[0] > counts[9] * 5, "{:?}", &counts[..10]);
        assert!(counts.iter().sum::<u32>() == 20_000);
    }

    #[test]
    fn a_signup_batch_is_username_email_and_routes_without_duplicates() {
        let claims = signup_claims("alice", 1, 4);
        let types: Vec<_> = claims
            .iter()
            .map(|c| c.key.namespace.claim_type().unwrap())
            .collect();
        assert_eq!(
            types,
            [
                ClaimType::Username,
                ClaimType::Email,
                ClaimType::Routes,
                ClaimType::Routes
            ]
        );
        let mut keys: Vec<_> = claims.iter().map(|c| &c.key).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 4);
    }

    #[test]
    fn unique_batches_of_different_clients_never_share_a_key() {
        let zipf = std::sync::Arc::new(Zipf::new(10, 1.0));
        let mut a = Generator::new(Scenario::Unique, 4, "r1s1".into(), 1, &zipf, 1);
        let mut b = Generator::new(Scenario::Unique, 4, "r1s1".into(), 11, &zipf, 1);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100 {
            for record in a.next().records.into_iter().chain(b.next().records) {
                assert!(seen.insert(record.key));
            }
        }
    }
}
