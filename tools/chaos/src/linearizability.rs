//! Checker (2): every key's history is linearizable against the pure domain model.
//!
//! A Wing–Gong search with Lowe's memoisation, as in porcupine: walk the calls and returns in
//! time order; at each step try to linearize any call that was invoked before the first pending
//! return, applying it to `Tables` and demanding the recorded answer; a return whose call is not
//! yet linearized means backtracking. States already seen with the same set of linearized calls
//! are pruned. Unknown answers return "at infinity": such a call may take effect at any point
//! after its invocation, or never (linearized last, where nothing observes it).
//!
//! Every lease of the campaign names exactly one key, so the history splits into independent
//! per-key histories (P-compositionality), each small. A violating history is shrunk to a
//! minimal one (whole leases or single lookups removed while it still fails).
//!
//! Owns the search and the shrinking. Must not know the protocol: answers come from
//! [`model::apply`].

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use topology_claims::domain::Tables;
use topology_claims::LeaseId;

use crate::history::{Answer, Call, ErrorKind, Event};
use crate::model;

/// What the search concluded for one key.
#[derive(Clone, Debug)]
pub enum Verdict {
    Linearizable,
    /// No order of the calls explains the answers; `minimal` is a shrunk history that still fails.
    Violation {
        minimal: Vec<Event>,
    },
    /// The step budget ran out before a decision (reported, never counted as a pass).
    Inconclusive,
}

/// Splits a history into per-key histories.
pub fn by_key(events: &[Event]) -> BTreeMap<u32, Vec<Event>> {
    let mut keys: BTreeMap<u32, Vec<Event>> = BTreeMap::new();
    for event in events {
        keys.entry(event.call.key()).or_default().push(*event);
    }
    keys
}

/// Removes what cannot matter and pins what is known, using each lease's final fate (its probe
/// after healing). Sound while outcomes outlive the campaign (servers keep them 24 h):
/// - lookups and probes with unknown answers observe nothing and change nothing: dropped;
/// - commits and rollbacks with unknown answers, once the fate is known: the fate (and the ghost
///   added for every lease whose end no client saw succeed) already says that and how the
///   lease ended; such a call either did that or nothing: dropped;
/// - a BeginUpdate refused with RESTORE_QUARANTINE counts as an unknown answer;
/// - a begin with an unknown answer whose lease the service never heard of (probe: not found)
///   never took the lease: dropped; one whose lease ended committed did take it: answer ok.
pub fn simplify(events: &[Event]) -> Vec<Event> {
    let fate: HashMap<LeaseId, Answer> = events
        .iter()
        .filter_map(|e| match e.call {
            Call::Probe { lease, .. } if e.answer != Answer::Unknown => Some((lease, e.answer)),
            _ => None,
        })
        .collect();
    let committed = Answer::Err(ErrorKind::LeaseCommitted);
    let rolled_back = Answer::Err(ErrorKind::LeaseRolledBack);
    let not_found = Answer::Err(ErrorKind::LeaseNotFound);
    events
        .iter()
        .filter_map(|e| {
            // A quarantine refusal is temporary, and the model knows no quarantine: like an
            // unknown answer, the call took effect or not (the client may have retried).
            let quarantined = Event {
                answer: Answer::Unknown,
                ..*e
            };
            let e = match e.answer {
                Answer::Err(ErrorKind::RestoreQuarantine) => &quarantined,
                _ => e,
            };
            let unknown = matches!(e.answer, Answer::Unknown | Answer::Pending);
            if !unknown {
                return Some(*e);
            }
            let fate = e.call.lease().and_then(|lease| fate.get(&lease).copied());
            let ended = fate.is_some_and(|f| f == committed || f == rolled_back || f == not_found);
            match e.call {
                Call::Lookup { .. } | Call::Probe { .. } => None,
                Call::Commit { .. } | Call::Rollback { .. } if ended => None,
                Call::Begin { .. } if fate == Some(not_found) => None,
                Call::Begin { .. } if fate == Some(committed) => Some(Event {
                    answer: Answer::Ok,
                    ret: None,
                    ..*e
                }),
                _ => Some(*e),
            }
        })
        .collect()
}

/// Checks one key's history with at most `budget` search steps (per search; shrinking a
/// violation runs more searches, for at most `shrink_time`).
pub fn check_key(events: &[Event], budget: u64, shrink_time: Duration) -> Verdict {
    match search(events, budget) {
        Search::Linearizable(_) => Verdict::Linearizable,
        Search::Exhausted => Verdict::Inconclusive,
        Search::Violation => Verdict::Violation {
            minimal: shrink(events, budget, shrink_time),
        },
    }
}

enum Search {
    /// With the model's state after every call with a known answer (in the order found).
    Linearizable(#[cfg_attr(not(test), allow(dead_code))] Box<Tables>),
    Violation,
    Exhausted,
}

/// Whether the recorded answer admits the model's.
fn admits(recorded: Answer, model: Answer) -> bool {
    match recorded {
        Answer::Unknown | Answer::Pending => true,
        recorded => recorded == model,
    }
}

/// When a call's return counts: unknown answers never return.
fn return_time(event: &Event) -> u64 {
    match event.answer {
        Answer::Unknown | Answer::Pending => u64::MAX,
        _ => event.ret.unwrap_or(u64::MAX),
    }
}

struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
    fn get(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
}

/// A hash of everything in the model state that a later call can observe.
fn fingerprint(tables: &Tables) -> u64 {
    let mut h = DefaultHasher::new();
    for (key, claim) in &tables.claims {
        key.hash(&mut h);
        claim.cell_id.hash(&mut h);
        claim.lease.hash(&mut h);
    }
    0xfeu8.hash(&mut h);
    for id in tables.leases.keys() {
        id.hash(&mut h);
    }
    0xffu8.hash(&mut h);
    for (id, outcome) in &tables.outcomes {
        id.hash(&mut h);
        outcome.outcome.hash(&mut h);
    }
    h.finish()
}

fn search(events: &[Event], budget: u64) -> Search {
    let n = events.len();
    let unknown: Vec<bool> = events
        .iter()
        .map(|e| matches!(e.answer, Answer::Unknown | Answer::Pending))
        .collect();
    // Calls with a known answer not yet linearized. Once none is left, the calls with unknown
    // answers go last, where nothing observes them: done.
    let mut known_left = unknown.iter().filter(|u| !**u).count();
    if known_left == 0 {
        return Search::Linearizable(Box::default());
    }
    // Entries 1..=2n in time order; 0 is the head sentinel, 2n+1 the tail sentinel.
    let mut order: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, event) in events.iter().enumerate() {
        order.push((event.invoke, false, i));
        order.push((return_time(event), true, i));
    }
    // Calls before returns at equal times: simultaneous counts as concurrent.
    order.sort_unstable();
    let (head, tail) = (0usize, 2 * n + 1);
    let mut call_entry = vec![0usize; n];
    let mut return_entry = vec![0usize; n];
    let mut is_return = vec![false; 2 * n + 2];
    let mut op_of = vec![0usize; 2 * n + 2];
    for (pos, &(_, ret, op)) in order.iter().enumerate() {
        let entry = pos + 1;
        is_return[entry] = ret;
        op_of[entry] = op;
        if ret {
            return_entry[op] = entry;
        } else {
            call_entry[op] = entry;
        }
    }
    let mut next: Vec<usize> = (1..=2 * n + 2).collect();
    let mut prev: Vec<usize> = (0..2 * n + 2).map(|i| i.saturating_sub(1)).collect();
    next[tail] = tail;

    let mut by_lease: HashMap<LeaseId, Vec<usize>> = HashMap::new();
    for (i, event) in events.iter().enumerate() {
        if let Some(lease) = event.call.lease() {
            by_lease.entry(lease).or_default().push(i);
        }
    }

    let mut state = Tables::default();
    let mut linearized = Bits::new(n);
    let mut stack: Vec<(usize, Tables)> = Vec::new();
    let mut seen: HashSet<(Vec<u64>, u64)> = HashSet::new();
    let mut entry = next[head];
    let mut steps = 0u64;
    while next[head] != tail {
        steps += 1;
        if steps > budget {
            return Search::Exhausted;
        }
        if entry != tail && !is_return[entry] {
            let op = op_of[entry];
            let event = &events[op];
            let mut candidate = state.clone();
            let answer = model::apply(&mut candidate, event.cell, &event.call);
            // A call with an unknown answer that changes nothing here is no different from the
            // same call placed last (nothing after it depends on it): try it only where it
            // changes the state. This keeps lost answers from multiplying the search.
            let pointless = unknown[op] && candidate == state;
            if !pointless && admits(event.answer, answer) {
                linearized.set(op);
                // Outcomes no later call can ask about are forgotten, so states that differ
                // only there are recognised as the same.
                if let Some(lease) = event.call.lease() {
                    let done = by_lease
                        .get(&lease)
                        .is_none_or(|ops| ops.iter().all(|&o| linearized.get(o)));
                    if done {
                        candidate.outcomes.remove(&lease);
                    }
                }
                if seen.insert((linearized.0.clone(), fingerprint(&candidate))) {
                    stack.push((op, std::mem::replace(&mut state, candidate)));
                    if !unknown[op] {
                        known_left -= 1;
                        if known_left == 0 {
                            return Search::Linearizable(Box::new(state));
                        }
                    }
                    // Lift the call and its return out of the list.
                    for e in [call_entry[op], return_entry[op]] {
                        next[prev[e]] = next[e];
                        prev[next[e]] = prev[e];
                    }
                    entry = next[head];
                    continue;
                }
                linearized.clear(op);
            }
            entry = next[entry];
        } else {
            // A call returned before being linearized: undo the last choice.
            let Some((op, previous)) = stack.pop() else {
                return Search::Violation;
            };
            state = previous;
            linearized.clear(op);
            if !unknown[op] {
                known_left += 1;
            }
            for e in [return_entry[op], call_entry[op]] {
                next[prev[e]] = e;
                prev[next[e]] = e;
            }
            entry = next[call_entry[op]];
        }
    }
    Search::Linearizable(Box::new(state))
}

#[cfg_attr(not(test), allow(dead_code))]
/// The model's state after one key's history, linearized: `Ok` when every call has a known
/// answer and some order explains them all (the state that order ends in), else the verdict.
pub fn final_state(events: &[Event], budget: u64) -> Result<Tables, Verdict> {
    if events
        .iter()
        .any(|e| matches!(e.answer, Answer::Unknown | Answer::Pending))
    {
        return Err(Verdict::Inconclusive);
    }
    match search(events, budget) {
        Search::Linearizable(state) => Ok(*state),
        Search::Exhausted => Err(Verdict::Inconclusive),
        Search::Violation => Err(Verdict::Violation {
            minimal: events.to_vec(),
        }),
    }
}

/// The history as it stood at time `cut`: calls invoked after it are dropped, and calls still
/// running then lose their answer. A prefix of a linearizable history is linearizable, so the
/// cuts at which the history fails form a suffix of time.
fn prefix(events: &[Event], cut: u64) -> Vec<Event> {
    events
        .iter()
        .filter(|e| e.invoke <= cut)
        .map(|e| {
            if return_time(e) > cut {
                Event {
                    answer: Answer::Unknown,
                    ret: None,
                    ..*e
                }
            } else {
                *e
            }
        })
        .collect()
}

/// The earliest invocation time at which the history already fails (binary search over the
/// cuts), or `None` if it does not fail within the budget.
fn failure_point(events: &[Event], budget: u64) -> Option<u64> {
    let mut cuts: Vec<u64> = events.iter().map(|e| e.invoke).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let fails = |cut: u64| matches!(search(&prefix(events, cut), budget), Search::Violation);
    let last = *cuts.last()?;
    if !fails(last) {
        return None;
    }
    let (mut lo, mut hi) = (0usize, cuts.len() - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if fails(cuts[mid]) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(cuts[lo])
}

/// Shrinks a failing history: first to its shortest failing prefix (cut right after the call
/// that makes it fail), then removing whole leases (all their calls) and single lookups as long
/// as it still fails at that same call (so the shrinking cannot swap the failure for another
/// one, such as a destroy whose create was removed).
fn shrink(events: &[Event], budget: u64, time: Duration) -> Vec<Event> {
    let deadline = Instant::now() + time;
    let Some(point) = failure_point(events, budget) else {
        return events.to_vec();
    };
    let group = |e: &Event| e.call.lease().map_or(Group::Single(e.id), Group::Lease);
    let mut current = prefix(events, point);
    loop {
        let mut changed = false;
        let groups: Vec<Group> = {
            let mut seen = HashSet::new();
            current
                .iter()
                .map(group)
                .filter(|g| seen.insert(*g))
                .collect()
        };
        for g in groups {
            if Instant::now() > deadline {
                return current;
            }
            let candidate: Vec<Event> = current.iter().filter(|e| group(e) != g).copied().collect();
            if candidate.len() < current.len() && failure_point(&candidate, budget) == Some(point) {
                current = candidate;
                changed = true;
            }
        }
        if !changed {
            return current;
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Group {
    Lease(LeaseId),
    Single(usize),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::TxOp;
    use topology_claims::ClaimState;

    fn ev(id: usize, cell: u16, call: Call, invoke: u64, ret: u64, answer: Answer) -> Event {
        Event {
            id,
            cell,
            call,
            invoke,
            ret: Some(ret),
            answer,
        }
    }

    const BUDGET: u64 = 1_000_000;
    const SHRINK: Duration = Duration::from_secs(5);

    #[test]
    fn a_sequential_create_commit_lookup_is_linearizable() {
        let a = LeaseId::generate();
        let history = [
            ev(
                0,
                0,
                Call::Begin {
                    lease: a,
                    op: TxOp::Create,
                    key: 1,
                },
                0,
                10,
                Answer::Ok,
            ),
            ev(1, 0, Call::Commit { lease: a, key: 1 }, 20, 30, Answer::Ok),
            ev(
                2,
                1,
                Call::Lookup { key: 1 },
                40,
                50,
                Answer::Found {
                    cell: 0,
                    state: ClaimState::Active,
                },
            ),
        ];
        assert!(matches!(
            check_key(&history, BUDGET, SHRINK),
            Verdict::Linearizable
        ));
    }

    #[test]
    fn two_cells_both_taking_a_key_is_a_violation_shrunk_to_the_two_leases() {
        let (a, b) = (LeaseId::generate(), LeaseId::generate());
        let history = [
            ev(
                0,
                2,
                Call::Lookup { key: 1 },
                0,
                1,
                Answer::Err(ErrorKind::ClaimNotFound),
            ),
            ev(
                1,
                0,
                Call::Begin {
                    lease: a,
                    op: TxOp::Create,
                    key: 1,
                },
                2,
                10,
                Answer::Ok,
            ),
            ev(2, 0, Call::Commit { lease: a, key: 1 }, 20, 30, Answer::Ok),
            ev(
                3,
                1,
                Call::Begin {
                    lease: b,
                    op: TxOp::Create,
                    key: 1,
                },
                40,
                50,
                Answer::Ok,
            ),
            ev(4, 1, Call::Commit { lease: b, key: 1 }, 60, 70, Answer::Ok),
        ];
        let Verdict::Violation { minimal } = check_key(&history, BUDGET, SHRINK) else {
            panic!("a double owner must be caught");
        };
        let ids: Vec<usize> = minimal.iter().map(|e| e.id).collect();
        assert_eq!(ids, [1, 2, 3, 4], "the lookup is not needed to show it");
    }

    #[test]
    fn an_unknown_begin_may_or_may_not_have_happened() {
        let (a, b) = (LeaseId::generate(), LeaseId::generate());
        let unknown = |id, lease, cell| Event {
            id,
            cell,
            call: Call::Begin {
                lease,
                op: TxOp::Create,
                key: 3,
            },
            invoke: 0,
            ret: Some(5),
            answer: Answer::Unknown,
        };
        // Took effect: another cell is refused while it lasts, and a ghost rollback ends it.
        let took_effect = [
            unknown(0, a, 0),
            ev(
                1,
                1,
                Call::Begin {
                    lease: b,
                    op: TxOp::Create,
                    key: 3,
                },
                10,
                20,
                Answer::Err(ErrorKind::ClaimLeased),
            ),
            ev(
                2,
                0,
                Call::Ghost {
                    lease: a,
                    key: 3,
                    committed: false,
                },
                0,
                100,
                Answer::Ok,
            ),
            ev(
                3,
                0,
                Call::Probe { lease: a, key: 3 },
                200,
                210,
                Answer::Err(ErrorKind::LeaseRolledBack),
            ),
        ];
        assert!(matches!(
            check_key(&took_effect, BUDGET, SHRINK),
            Verdict::Linearizable
        ));
        // Never took effect: the probe says the service never heard of it.
        let never = [
            unknown(0, a, 0),
            ev(
                1,
                1,
                Call::Begin {
                    lease: b,
                    op: TxOp::Create,
                    key: 3,
                },
                10,
                20,
                Answer::Ok,
            ),
            ev(
                2,
                0,
                Call::Probe { lease: a, key: 3 },
                200,
                210,
                Answer::Err(ErrorKind::LeaseNotFound),
            ),
        ];
        assert!(matches!(
            check_key(&never, BUDGET, SHRINK),
            Verdict::Linearizable
        ));
    }

    #[test]
    fn a_read_that_goes_back_in_time_is_a_violation() {
        let a = LeaseId::generate();
        let history = [
            ev(
                0,
                0,
                Call::Begin {
                    lease: a,
                    op: TxOp::Create,
                    key: 1,
                },
                0,
                10,
                Answer::Ok,
            ),
            ev(1, 0, Call::Commit { lease: a, key: 1 }, 20, 30, Answer::Ok),
            ev(
                2,
                1,
                Call::Lookup { key: 1 },
                40,
                50,
                Answer::Found {
                    cell: 0,
                    state: ClaimState::Active,
                },
            ),
            ev(
                3,
                1,
                Call::Lookup { key: 1 },
                60,
                70,
                Answer::Found {
                    cell: 0,
                    state: ClaimState::Creating,
                },
            ),
        ];
        assert!(matches!(
            check_key(&history, BUDGET, SHRINK),
            Verdict::Violation { .. }
        ));
    }

    #[test]
    fn concurrent_calls_may_take_effect_in_either_order() {
        let (a, b) = (LeaseId::generate(), LeaseId::generate());
        // b's begin overlaps a's whole life; it was refused, so it ran while a held the claim.
        let history = [
            ev(
                0,
                0,
                Call::Begin {
                    lease: a,
                    op: TxOp::Create,
                    key: 1,
                },
                0,
                10,
                Answer::Ok,
            ),
            ev(
                1,
                1,
                Call::Begin {
                    lease: b,
                    op: TxOp::Create,
                    key: 1,
                },
                1,
                40,
                Answer::Err(ErrorKind::ClaimLeased),
            ),
            ev(2, 0, Call::Commit { lease: a, key: 1 }, 20, 30, Answer::Ok),
        ];
        assert!(matches!(
            check_key(&history, BUDGET, SHRINK),
            Verdict::Linearizable
        ));
    }

    /// The 2026-11-29 CI failure's shape: a destroy lease that a reconciler rolled back, seen
    /// ended by a lookup, whose probe got no answer. Without its fate the lease has no ghost, and
    /// a correct history reads as a violation; the unknown fate now adds both possible ends.
    #[test]
    fn a_lease_whose_probe_got_no_answer_may_have_been_ended_either_way() {
        use crate::history::History;
        let (a, b) = (LeaseId::generate(), LeaseId::generate());
        let check = |probe_b: Answer| {
            let history = History::new();
            let begin = |lease, op| Call::Begin { lease, op, key: 13 };
            let commit_a = Call::Commit { lease: a, key: 13 };
            history.push(0, begin(a, TxOp::Create), 0, Some(10), Answer::Ok);
            history.push(0, commit_a, 10, Some(20), Answer::Ok);
            history.push(0, begin(b, TxOp::Destroy), 30, Some(40), Answer::Ok);
            let active = Answer::Found {
                cell: 0,
                state: ClaimState::Active,
            };
            history.push(2, Call::Lookup { key: 13 }, 8_000, Some(8_010), active);
            let (probe_a, probe_b_call) = (
                Call::Probe { lease: a, key: 13 },
                Call::Probe { lease: b, key: 13 },
            );
            let committed = Answer::Err(ErrorKind::LeaseCommitted);
            history.push(0, probe_a, 20_000, Some(20_010), committed);
            history.push(0, probe_b_call, 20_000, Some(20_500), probe_b);
            history.add_ghosts();
            let events = simplify(&history.snapshot());
            let ghosts = events
                .iter()
                .filter(|e| matches!(e.call, Call::Ghost { lease, .. } if lease == b))
                .count();
            (ghosts, check_key(&events, BUDGET, SHRINK))
        };
        let (ghosts, verdict) = check(Answer::Unknown);
        assert_eq!(ghosts, 2);
        assert!(matches!(verdict, Verdict::Linearizable), "{verdict:?}");
        // The probe's answer known (rolled back): one ghost, and it explains the lookup.
        let (ghosts, verdict) = check(Answer::Err(ErrorKind::LeaseRolledBack));
        assert_eq!(ghosts, 1);
        assert!(matches!(verdict, Verdict::Linearizable), "{verdict:?}");
        // The lease never ended: the lookup contradicts it.
        let (ghosts, verdict) = check(Answer::Ok);
        assert_eq!(ghosts, 0);
        assert!(matches!(verdict, Verdict::Violation { .. }), "{verdict:?}");
    }

    /// A lease the cell saw taken and the service no longer knows is named by checker 1; a
    /// refused BeginUpdate's lease, never taken, is not.
    #[test]
    fn a_taken_lease_the_service_does_not_know_is_forgotten() {
        use crate::history::History;
        let (a, b) = (LeaseId::generate(), LeaseId::generate());
        let history = History::new();
        let begin = |lease| Call::Begin {
            lease,
            op: TxOp::Create,
            key: 5,
        };
        let not_found = Answer::Err(ErrorKind::LeaseNotFound);
        history.push(1, begin(a), 0, Some(10), Answer::Ok);
        history.push(
            2,
            begin(b),
            5,
            Some(15),
            Answer::Err(ErrorKind::ClaimLeased),
        );
        history.push(1, Call::Probe { lease: a, key: 5 }, 90, Some(95), not_found);
        history.push(2, Call::Probe { lease: b, key: 5 }, 90, Some(95), not_found);
        assert_eq!(history.forgotten_leases(), [(1, 5, a)]);
    }
}
