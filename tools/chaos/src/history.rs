//! The campaign's history: every client operation with its invocation time, completion time and
//! answer (ok, a definite error, or unknown when the outcome was lost), as the linearizability
//! checker and the `--history` file see it.
//!
//! Owns recording and the vocabulary of calls and answers. Must not judge anything: the checkers
//! do that.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Instant;

use topology_claims::{ClaimState, ClaimsError, LeaseId};

/// What a claim transaction asks for its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TxOp {
    Create,
    Destroy,
    /// Only the verifier's correction of a "different" claim (cells never update).
    Update,
}

/// One operation of a cell (or of the checker after the campaign) on the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// BeginUpdate of a single-claim lease (every lease of the campaign names exactly one key,
    /// so the history splits into independent per-key histories).
    Begin {
        lease: LeaseId,
        op: TxOp,
        key: u32,
    },
    Commit {
        lease: LeaseId,
        key: u32,
    },
    Rollback {
        lease: LeaseId,
        key: u32,
    },
    Lookup {
        key: u32,
    },
    /// After the campaign: RenewLease, used as a read of the lease's final fate.
    Probe {
        lease: LeaseId,
        key: u32,
    },
    /// Inferred, not observed: the lease ended this way at some time between its BeginUpdate and
    /// the end of the final reconcile passes (a reconciler did it, or a request whose answer was
    /// lost). Added for every lease whose end no client saw succeed.
    Ghost {
        lease: LeaseId,
        key: u32,
        committed: bool,
    },
}

impl Call {
    pub fn key(&self) -> u32 {
        match *self {
            Call::Begin { key, .. }
            | Call::Commit { key, .. }
            | Call::Rollback { key, .. }
            | Call::Lookup { key }
            | Call::Probe { key, .. }
            | Call::Ghost { key, .. } => key,
        }
    }

    pub fn lease(&self) -> Option<LeaseId> {
        match *self {
            Call::Begin { lease, .. }
            | Call::Commit { lease, .. }
            | Call::Rollback { lease, .. }
            | Call::Probe { lease, .. }
            | Call::Ghost { lease, .. } => Some(lease),
            Call::Lookup { .. } => None,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Call::Begin { .. } => "begin",
            Call::Commit { .. } => "commit",
            Call::Rollback { .. } => "rollback",
            Call::Lookup { .. } => "lookup",
            Call::Probe { .. } => "probe",
            Call::Ghost { .. } => "ghost",
        }
    }
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let short = |lease: &LeaseId| lease.to_string()[..8].to_owned();
        match self {
            Call::Begin { lease, op, key } => {
                write!(f, "begin {} k{key} lease {}", op_name(*op), short(lease))
            }
            Call::Commit { lease, key } => write!(f, "commit k{key} lease {}", short(lease)),
            Call::Rollback { lease, key } => write!(f, "rollback k{key} lease {}", short(lease)),
            Call::Lookup { key } => write!(f, "lookup k{key}"),
            Call::Probe { lease, key } => write!(f, "probe k{key} lease {}", short(lease)),
            Call::Ghost {
                lease,
                key,
                committed,
            } => write!(
                f,
                "ghost-{} k{key} lease {}",
                if *committed { "commit" } else { "rollback" },
                short(lease)
            ),
        }
    }
}

fn op_name(op: TxOp) -> &'static str {
    match op {
        TxOp::Create => "create",
        TxOp::Destroy => "destroy",
        TxOp::Update => "update",
    }
}

/// The protocol errors a history distinguishes (`ClaimsError`'s variants without payloads).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    InvalidRequest,
    BatchConflict,
    ClaimTaken,
    ClaimLeased,
    ClaimNotFound,
    NotClaimOwner,
    NotLeaseOwner,
    LeaseRolledBack,
    LeaseCommitted,
    LeaseNotFound,
    LeaseIdConflict,
    /// A create of an absent claim refused while a restore is quarantined: a temporary refusal
    /// the pure model does not know (the checkers treat it as a call that may not have happened).
    RestoreQuarantine,
    Other,
}

impl ErrorKind {
    /// The kind of a definite answer; `None` when the error says the outcome is unknown: the
    /// service was unavailable or did not answer in time, or the call failed in a way that says
    /// nothing about the request (`Internal`: e.g. a connection cut mid-call surfaces as a
    /// status without the service's error details).
    pub fn of(error: &ClaimsError) -> Option<ErrorKind> {
        Some(match error.refusal() {
            ClaimsError::Unavailable { .. }
            | ClaimsError::ServerUnavailable { .. }
            | ClaimsError::Internal { .. } => return None,
            ClaimsError::InvalidRequest { .. } => ErrorKind::InvalidRequest,
            ClaimsError::BatchConflict { .. } => ErrorKind::BatchConflict,
            ClaimsError::ClaimTaken { .. } => ErrorKind::ClaimTaken,
            ClaimsError::ClaimLeased { .. } => ErrorKind::ClaimLeased,
            ClaimsError::ClaimNotFound { .. } => ErrorKind::ClaimNotFound,
            ClaimsError::NotClaimOwner { .. } => ErrorKind::NotClaimOwner,
            ClaimsError::NotLeaseOwner { .. } => ErrorKind::NotLeaseOwner,
            ClaimsError::LeaseRolledBack { .. } => ErrorKind::LeaseRolledBack,
            ClaimsError::LeaseCommitted { .. } => ErrorKind::LeaseCommitted,
            ClaimsError::LeaseNotFound { .. } => ErrorKind::LeaseNotFound,
            ClaimsError::LeaseIdConflict { .. } => ErrorKind::LeaseIdConflict,
            ClaimsError::RestoreQuarantine { .. } => ErrorKind::RestoreQuarantine,
            _ => ErrorKind::Other,
        })
    }
}

/// What an operation returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Still running (never left in a finished history: the campaign completes every call).
    Pending,
    Ok,
    /// LookupClaim found the claim held by this cell in this state.
    Found {
        cell: u16,
        state: ClaimState,
    },
    Err(ErrorKind),
    /// The outcome was lost (unavailable, deadline exceeded, the caller "crashed", or an API that
    /// swallows the answer): the operation may or may not have taken effect.
    Unknown,
}

impl Answer {
    /// The answer for a call's result: a definite error, or unknown.
    pub fn from_error(error: &ClaimsError) -> Answer {
        ErrorKind::of(error).map_or(Answer::Unknown, Answer::Err)
    }

    pub fn outcome(&self) -> Outcome {
        match self {
            Answer::Ok | Answer::Found { .. } => Outcome::Ok,
            Answer::Err(_) => Outcome::Fail,
            Answer::Unknown | Answer::Pending => Outcome::Unknown,
        }
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Pending => f.write_str("pending"),
            Answer::Ok => f.write_str("ok"),
            Answer::Found { cell, state } => write!(f, "found c{cell:02} {}", state.name()),
            Answer::Err(kind) => write!(f, "fail {kind:?}"),
            Answer::Unknown => f.write_str("unknown"),
        }
    }
}

/// The three outcomes the summary counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    Ok,
    Fail,
    Unknown,
}

/// One recorded operation. Times are microseconds since the campaign started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub id: usize,
    /// The cell that made the call (for probes and ghosts: the lease's cell).
    pub cell: u16,
    pub call: Call,
    pub invoke: u64,
    /// `None` while pending; unknown answers may still carry the time the caller gave up.
    pub ret: Option<u64>,
    pub answer: Answer,
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |us: u64| us as f64 / 1000.0;
        let ret = match (self.answer, self.ret) {
            (Answer::Unknown | Answer::Pending, _) | (_, None) => "∞".to_owned(),
            (_, Some(ret)) => format!("{:.3}", ms(ret)),
        };
        write!(
            f,
            "#{:<6} [{:>10.3} ms, {:>10} ms] c{:02} {:<36} -> {}",
            self.id,
            ms(self.invoke),
            ret,
            self.cell,
            self.call.to_string(),
            self.answer
        )
    }
}

/// The shared, append-only history of one campaign.
pub struct History {
    start: Instant,
    events: Mutex<Vec<Event>>,
}

impl History {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
        }
    }

    /// Microseconds since the campaign started.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    fn events(&self) -> std::sync::MutexGuard<'_, Vec<Event>> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the invocation of `call` by `cell` now; returns its id for [`complete`](Self::complete).
    pub fn invoke(&self, cell: u16, call: Call) -> usize {
        let invoke = self.now();
        self.push(cell, call, invoke, None, Answer::Pending)
    }

    /// Records a finished operation whose times were measured by the caller.
    pub fn push(
        &self,
        cell: u16,
        call: Call,
        invoke: u64,
        ret: Option<u64>,
        answer: Answer,
    ) -> usize {
        let mut events = self.events();
        let id = events.len();
        events.push(Event {
            id,
            cell,
            call,
            invoke,
            ret,
            answer,
        });
        id
    }

    /// When operation `id` was invoked (microseconds since the start).
    pub fn invoked_at(&self, id: usize) -> Option<u64> {
        self.events().get(id).map(|e| e.invoke)
    }

    /// Records the answer of operation `id`, now.
    pub fn complete(&self, id: usize, answer: Answer) {
        let ret = self.now();
        if let Some(event) = self.events().get_mut(id) {
            event.ret = Some(ret);
            event.answer = answer;
        }
    }

    /// Ghosts: for every lease whose end no client saw succeed and whose final probe found it
    /// ended, a [`Call::Ghost`] from its BeginUpdate's invocation to the probe's answer (the end
    /// happened in between). A lease whose probe got no answer may have been ended either way by
    /// a reconciler, or not at all: it gets both ghosts, with unknown answers.
    pub fn add_ghosts(&self) {
        let events = self.snapshot();
        let mut ended_ok = BTreeSet::new();
        let mut fate = BTreeMap::new();
        for event in &events {
            match (event.call, event.answer) {
                (Call::Commit { lease, .. } | Call::Rollback { lease, .. }, Answer::Ok) => {
                    ended_ok.insert(lease);
                }
                (Call::Probe { lease, .. }, answer) => {
                    fate.insert(lease, (answer, event.ret));
                }
                _ => {}
            }
        }
        for begin in &events {
            let Call::Begin { lease, key, .. } = begin.call else {
                continue;
            };
            if ended_ok.contains(&lease) {
                continue;
            }
            let (committed, seen_at) = match fate.get(&lease) {
                Some((Answer::Err(ErrorKind::LeaseCommitted), Some(at))) => (true, *at),
                Some((Answer::Err(ErrorKind::LeaseRolledBack), Some(at))) => (false, *at),
                Some((Answer::Unknown | Answer::Pending, _)) => {
                    for committed in [true, false] {
                        let ghost = Call::Ghost {
                            lease,
                            key,
                            committed,
                        };
                        self.push(begin.cell, ghost, begin.invoke, None, Answer::Unknown);
                    }
                    continue;
                }
                _ => continue,
            };
            let ghost = Call::Ghost {
                lease,
                key,
                committed,
            };
            self.push(begin.cell, ghost, begin.invoke, Some(seen_at), Answer::Ok);
        }
    }

    /// Leases whose BeginUpdate answered OK and whose final probe found no such lease:
    /// (cell, key, lease).
    pub fn forgotten_leases(&self) -> Vec<(u16, u32, LeaseId)> {
        let events = self.snapshot();
        let not_found: BTreeSet<LeaseId> = events
            .iter()
            .filter_map(|e| match (e.call, e.answer) {
                (Call::Probe { lease, .. }, Answer::Err(ErrorKind::LeaseNotFound)) => Some(lease),
                _ => None,
            })
            .collect();
        events
            .iter()
            .filter_map(|e| match (e.call, e.answer) {
                (Call::Begin { lease, key, .. }, Answer::Ok) if not_found.contains(&lease) => {
                    Some((e.cell, key, lease))
                }
                _ => None,
            })
            .collect()
    }

    /// A copy of every event so far, pending ones turned unknown.
    pub fn snapshot(&self) -> Vec<Event> {
        self.events()
            .iter()
            .map(|e| match e.answer {
                Answer::Pending => Event {
                    answer: Answer::Unknown,
                    ..*e
                },
                _ => *e,
            })
            .collect()
    }
}
