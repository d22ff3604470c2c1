//! Open-loop load (`--rate`, and every step of `--slo`): BeginUpdate + CommitUpdate pairs sent at
//! a fixed arrival rate whatever the system answers, with as many pairs in flight as that takes,
//! up to `--max-in-flight` connections. Every latency counts from the pair's **scheduled** start,
//! so the time a pair spent waiting — behind a slow answer, for a free connection, for the bench's
//! own timer — is in its latency: no coordinated omission, unlike a closed loop, where a slow
//! answer delays the next request and hides the queue.
//!
//! Owns the arrival schedule, the connection pool and the per-pair samples. Must not choose
//! systems, search rates (`slo`) or print reports (`rates`).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::runner::timed_pair;
use super::stats::{per_second, Latency, PairTiming, Tally};
use super::systems::{Conn, PairConn, System};
use super::workload::{Batch, Generator, Scenario, Zipf};

/// An arrival sent later than this after its scheduled time missed its schedule: the timer's
/// 1 ms granularity plus a little scheduling.
pub const LATE_AFTER: Duration = Duration::from_millis(2);

/// The flags of open-loop mode.
#[derive(clap::Args, Debug, Clone)]
pub struct RateArgs {
    /// Open-loop arrival rates in pairs/s, comma-separated (e.g. 500,1000,2000). Instead of the
    /// closed-loop clients, every system gets BeginUpdate + CommitUpdate pairs at each fixed
    /// rate for --warmup + --duration per round, latencies counted from each pair's scheduled
    /// start. Default: none (the closed loop of --clients).
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_RATE", value_delimiter = ',',
          value_parser = parse_rate)]
    pub rate: Vec<f64>,

    /// Most pairs in flight at once in open-loop mode (--rate, --slo), each on a connection of
    /// its own: every system gets this many connections before its first open-loop segment and
    /// keeps them. An arrival that finds them all busy waits for one; it is counted as "waited"
    /// and the wait is in its latency. Default 64.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_MAX_IN_FLIGHT", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_in_flight: u32,
}

impl RateArgs {
    /// Whether the run is open-loop (`--rate` or `--slo`).
    pub fn any(&self, slo: Option<Duration>) -> bool {
        !self.rate.is_empty() || slo.is_some()
    }
}

/// A rate in pairs/s: a positive, finite number.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r > 0.0 && *r <= 10_000_000.0)
        .ok_or_else(|| {
            format!("invalid rate {text:?}: pairs per second above 0 (and at most 10^7), e.g. 500")
        })
}

/// One open-loop segment of one system.
pub struct Spec {
    pub scenario: Scenario,
    pub batch: usize,
    /// Arrivals per second: pair `i` is scheduled `i / rate` seconds after the segment starts.
    pub rate: f64,
    pub max_in_flight: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Unique per run and segment: keeps unique keys unique across segments and runs.
    pub prefix: String,
    pub zipf: Arc<Zipf>,
    pub seed: u64,
}

/// What the load of a run has in common, and the numbering that keeps every segment's keys apart.
pub struct Plan {
    pub batch: usize,
    pub max_in_flight: usize,
    pub warmup: Duration,
    pub zipf: Arc<Zipf>,
    pub seed: u64,
    /// The run's tag (unique keys of different runs never collide).
    pub tag: String,
    pub segments: usize,
}

impl Plan {
    pub fn spec(&mut self, scenario: Scenario, rate: f64, duration: Duration) -> Spec {
        self.segments += 1;
        Spec {
            scenario,
            batch: self.batch,
            rate,
            max_in_flight: self.max_in_flight,
            warmup: self.warmup,
            duration,
            prefix: format!("o{}s{}", self.tag, self.segments),
            zipf: Arc::clone(&self.zipf),
            seed: self
                .seed
                .wrapping_mul(1_000_003)
                .wrapping_add(self.segments as u64),
        }
    }
}

/// One pair as it happened.
pub struct Sample {
    pub scheduled: Instant,
    pub sent: Instant,
    /// No connection was free at the scheduled time: the in-flight bound was hit.
    pub waited: bool,
    /// Timed from `scheduled`.
    pub timing: PairTiming,
}

/// Where the pairs of the measured part go.
pub trait Record: Send + 'static {
    fn record(&mut self, sample: Sample);
}

/// What an open-loop segment (or several, merged) measured.
#[derive(Clone, Default)]
pub struct OpenTally {
    /// Latencies from the scheduled start, outcomes, completed pairs.
    pub tally: Tally,
    /// How long after its scheduled time each pair was sent: the bench's timer and the waits
    /// for a connection, which the latencies include.
    pub send_lag: Latency,
    /// Arrivals of the measured part that were sent.
    pub sent: u64,
    /// Arrivals of the measured part still unsent when the segment gave up waiting for a
    /// connection (twice its length): the system fell that far behind.
    pub not_sent: u64,
    /// Sent more than [`LATE_AFTER`] after their scheduled time, for whatever reason.
    pub late: u64,
    /// Found every connection busy (the in-flight bound hit) and waited for one.
    pub waited: u64,
    /// Calls that failed for a reason other than an answer about the claims (overload, an
    /// unavailable store, transport): for an objective they are slower than any threshold.
    pub begin_failed: u64,
    pub commit_failed: u64,
    pub peak_in_flight: usize,
    pub connections: usize,
}

impl Record for OpenTally {
    fn record(&mut self, sample: Sample) {
        self.sent += 1;
        let lag = sample.sent.saturating_duration_since(sample.scheduled);
        self.send_lag.record(lag);
        if lag > LATE_AFTER {
            self.late += 1;
        }
        if sample.waited {
            self.waited += 1;
        }
        if let Err(reason) = &sample.timing.begun {
            if !is_claim_answer(reason) {
                self.begin_failed += 1;
            }
        }
        if let Some((_, Err(reason))) = &sample.timing.commit {
            if !is_claim_answer(reason) {
                self.commit_failed += 1;
            }
        }
        self.tally.add(&sample.timing);
    }
}

impl OpenTally {
    pub fn merge(&mut self, other: &OpenTally) {
        self.tally.merge(&other.tally);
        self.send_lag.merge(&other.send_lag);
        self.sent += other.sent;
        self.not_sent += other.not_sent;
        self.late += other.late;
        self.waited += other.waited;
        self.begin_failed += other.begin_failed;
        self.commit_failed += other.commit_failed;
        self.peak_in_flight = self.peak_in_flight.max(other.peak_in_flight);
        self.connections = self.connections.max(other.connections);
    }

    /// Arrivals scheduled in the measured part.
    pub fn arrivals(&self) -> u64 {
        self.sent + self.not_sent
    }

    /// Arrivals that missed their schedule: sent late, or not at all.
    pub fn missed(&self) -> u64 {
        self.late + self.not_sent
    }
}

/// A refusal about the claims themselves (the hot scenario's contention), an answer like OK;
/// anything else (RATE_LIMITED, STORE_UNAVAILABLE, a transport error…) is a failure.
pub fn is_claim_answer(reason: &str) -> bool {
    reason.starts_with("CLAIM_") || matches!(reason, "NOT_CLAIM_OWNER" | "BATCH_CONFLICT")
}

/// What the driver saw besides the samples.
pub struct Driven {
    pub not_sent: u64,
    pub peak_in_flight: usize,
    pub connections: usize,
}

/// A connection with what it sends: its client's cell and batches, and the destroy it owes.
struct Slot<C> {
    client: usize,
    conn: C,
    generator: Generator,
    /// Hot and churn: the destroy of the batch this connection created last, its next pair.
    owed: Option<Batch>,
}

impl<C> Slot<C> {
    fn new(spec: &Spec, client: usize, conn: C) -> Self {
        let generator = Generator::new(
            spec.scenario,
            spec.batch,
            spec.prefix.clone(),
            client,
            &spec.zipf,
            spec.seed,
        );
        Self {
            client,
            conn,
            generator,
            owed: None,
        }
    }
}

/// Runs one segment: arrivals at `spec.rate` for `warmup + duration`, on the connections of
/// `pool` (connection `i` acts for client `i`), first topped up to `max_in_flight` with
/// `connect(i)` before the schedule starts, so no pair's latency holds a connection's setup.
/// Pairs scheduled in the measured part go to `recorder`. Afterwards every connection is back in
/// `pool`, in client order, and every claim a hot or churn pair created is destroyed again
/// (unmeasured).
pub async fn drive<C, F, Fut, R>(
    spec: &Spec,
    pool: &mut Vec<C>,
    mut connect: F,
    recorder: &Arc<Mutex<R>>,
) -> Result<Driven, String>
where
    C: PairConn,
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<C, String>>,
    R: Record,
{
    if !(spec.rate.is_finite() && spec.rate > 0.0) {
        return Err(format!(
            "open-loop rate {} is not a positive number",
            spec.rate
        ));
    }
    if pool.len() < spec.max_in_flight {
        let more =
            futures::future::try_join_all((pool.len()..spec.max_in_flight).map(&mut connect))
                .await
                .map_err(|e| format!("opening {} connections: {e}", spec.max_in_flight))?;
        pool.extend(more);
    }
    // The idle connections, a stack: the one that came back last goes out first, so at a low
    // rate a few connections carry the load and a hot or churn pair's owed destroy follows its
    // create promptly (first in, first out would hold each hot claim for a whole round of the
    // pool).
    let opened = pool.len();
    let mut slots: Vec<Slot<C>> = pool
        .drain(..)
        .enumerate()
        .map(|(client, conn)| Slot::new(spec, client, conn))
        .collect();
    slots.reverse();
    let idle = Arc::new(Mutex::new(slots));
    let returned = Arc::new(Notify::new());
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut peak_in_flight = 0;
    let mut tasks = JoinSet::new();
    let started = Instant::now();
    let record_from = started + spec.warmup;
    let deadline = record_from + spec.duration;
    // A system far behind would keep the segment going for as long as its backlog: past this,
    // the arrivals still waiting for a connection are counted as not sent.
    let give_up = deadline + spec.duration;
    let at = |i: u64| started + Duration::from_secs_f64(i as f64 / spec.rate);
    let mut not_sent = 0;
    let mut i = 0u64;
    loop {
        let scheduled = at(i);
        if scheduled >= deadline {
            break;
        }
        if scheduled > Instant::now() {
            tokio::time::sleep_until(scheduled.into()).await;
        }
        while let Some(done) = tasks.try_join_next() {
            done.map_err(|e| format!("an open-loop pair failed: {e}"))?;
        }
        let mut waited = false;
        let slot = loop {
            if let Some(slot) = lock(&idle).pop() {
                break Some(slot);
            }
            waited = true;
            // A connection returned since the pop above left a permit: no wake-up is lost.
            if tokio::time::timeout_at(give_up.into(), returned.notified())
                .await
                .is_err()
            {
                break None;
            }
        };
        let Some(slot) = slot else {
            not_sent = (i..)
                .map(at)
                .take_while(|t| *t < deadline)
                .filter(|t| *t >= record_from)
                .count() as u64;
            break;
        };
        let sent = Instant::now();
        peak_in_flight = peak_in_flight.max(in_flight.fetch_add(1, Ordering::Relaxed) + 1);
        let record = scheduled >= record_from;
        let (recorder, idle, returned, in_flight) = (
            Arc::clone(recorder),
            Arc::clone(&idle),
            Arc::clone(&returned),
            Arc::clone(&in_flight),
        );
        let destroys = spec.scenario.destroys();
        tasks.spawn(async move {
            let mut slot = slot;
            let (batch, destroying) = match slot.owed.take() {
                Some(owed) => (owed, true),
                None => (slot.generator.next(), false),
            };
            let timing = timed_pair(&mut slot.conn, &batch, scheduled).await;
            if destroys && !destroying && timing.succeeded() {
                slot.owed = Some(batch.destroying());
            }
            in_flight.fetch_sub(1, Ordering::Relaxed);
            lock(&idle).push(slot);
            returned.notify_one();
            if record {
                let sample = Sample {
                    scheduled,
                    sent,
                    waited,
                    timing,
                };
                lock(&recorder).record(sample);
            }
        });
        i += 1;
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| format!("an open-loop pair failed: {e}"))?;
    }
    let mut slots = std::mem::take(&mut *lock(&idle));
    futures::future::join_all(slots.iter_mut().map(|slot| async move {
        if let Some(owed) = slot.owed.take() {
            timed_pair(&mut slot.conn, &owed, Instant::now()).await;
        }
    }))
    .await;
    slots.sort_by_key(|slot| slot.client);
    pool.extend(slots.into_iter().map(|slot| slot.conn));
    Ok(Driven {
        not_sent,
        peak_in_flight,
        connections: opened,
    })
}

/// The data behind a mutex even if a holder panicked (the panic is reported by its task).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// One measured open-loop segment of one system (or its rounds, merged).
#[derive(Clone)]
pub struct OpenSegment {
    pub system: String,
    pub scenario: String,
    /// Offered load, pairs/s.
    pub rate: f64,
    /// Measured time (the warm-up is not in it).
    pub duration: Duration,
    pub max_in_flight: usize,
    pub tally: OpenTally,
}

impl OpenSegment {
    /// Completed pairs scheduled in the measured part, per second of it.
    pub fn pairs_per_s(&self) -> f64 {
        per_second(self.tally.tally.pairs, self.duration)
    }

    pub fn to_json(&self) -> Value {
        let t = &self.tally;
        json!({
            "system": self.system,
            "scenario": self.scenario,
            "rate": self.rate,
            "seconds": self.duration.as_secs_f64(),
            "arrivals": t.arrivals(),
            "sent": t.sent,
            "pairs": t.tally.pairs,
            "pairs_per_s": self.pairs_per_s(),
            "claims_per_s": per_second(t.tally.claims, self.duration),
            "missed": t.missed(),
            "late": t.late,
            "not_sent": t.not_sent,
            "waited_for_connection": t.waited,
            "send_lag": t.send_lag.tail_json(),
            "max_in_flight": self.max_in_flight,
            "peak_in_flight": t.peak_in_flight,
            "connections": t.connections,
            "failed": { "begin": t.begin_failed, "commit": t.commit_failed },
            "latency": {
                "begin": t.tally.begin.tail_json(),
                "commit": t.tally.commit.tail_json(),
                "pair": t.tally.pair.tail_json(),
            },
            "outcomes": t.tally.outcomes,
        })
    }
}

/// One open-loop segment of `system` on the connections of `pool` (kept there for its next
/// segment).
pub async fn run(
    system: &mut System,
    pool: &mut Vec<Conn>,
    spec: &Spec,
) -> Result<OpenSegment, String> {
    system.check_alive()?;
    let label = system.label();
    let recorder = Arc::new(Mutex::new(OpenTally::default()));
    let driven = {
        let system = &*system;
        drive(spec, pool, |client| system.connect(client), &recorder).await?
    };
    system.check_alive()?;
    let mut tally = std::mem::take(&mut *recorder.lock().unwrap_or_else(|p| p.into_inner()));
    tally.not_sent = driven.not_sent;
    tally.peak_in_flight = driven.peak_in_flight;
    tally.connections = driven.connections;
    let segment = OpenSegment {
        system: label,
        scenario: spec.scenario.name().to_owned(),
        rate: spec.rate,
        duration: spec.duration,
        max_in_flight: spec.max_in_flight,
        tally,
    };
    eprintln!(
        "bench: {} {} at {:.0} pairs/s: {:.0} pairs/s done, begin p99.9 {:.2} ms, commit p99.9 {:.2} ms, {} missed their schedule",
        segment.system,
        segment.scenario,
        segment.rate,
        segment.pairs_per_s(),
        segment.tally.tally.begin.ms(0.999),
        segment.tally.tally.commit.ms(0.999),
        segment.tally.missed(),
    );
    Ok(segment)
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology_claims::LeaseId;

    /// A server every call goes through one at a time, which stalls once: the begin numbered
    /// `stall_at` holds it for `stall`, and when the stall ended is written down.
    #[derive(Clone)]
    struct StallingServer {
        lock: Arc<tokio::sync::Mutex<u64>>,
        stall_at: u64,
        stall: Duration,
        stalled: Arc<Mutex<Option<(Instant, Instant)>>>,
    }

    impl PairConn for StallingServer {
        async fn begin(&mut self, _: &Batch, _: LeaseId) -> Result<(), String> {
            let mut calls = self.lock.lock().await;
            *calls += 1;
            if *calls == self.stall_at {
                let from = Instant::now();
                tokio::time::sleep(self.stall).await;
                *self.stalled.lock().unwrap() = Some((from, Instant::now()));
            }
            Ok(())
        }

        async fn commit(&mut self, _: &Batch, _: LeaseId) -> Result<(), String> {
            drop(self.lock.lock().await);
            Ok(())
        }
    }

    impl Record for Vec<Sample> {
        fn record(&mut self, sample: Sample) {
            self.push(sample);
        }
    }

    fn spec(rate: f64, max_in_flight: usize, duration: Duration) -> Spec {
        Spec {
            scenario: Scenario::Unique,
            batch: 1,
            rate,
            max_in_flight,
            warmup: Duration::ZERO,
            duration,
            prefix: "t".into(),
            zipf: Arc::new(Zipf::new(1, 1.0)),
            seed: 1,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stall_shows_in_the_latency_of_every_pair_scheduled_during_it() {
        // One connection, as a closed-loop client would have: during the stall nothing more can
        // even be sent, so latency measured from the send would not see the stall at all.
        let server = StallingServer {
            lock: Arc::new(tokio::sync::Mutex::new(0)),
            stall_at: 10,
            stall: Duration::from_millis(200),
            stalled: Arc::new(Mutex::new(None)),
        };
        let rate = 100.0;
        let spec = spec(rate, 1, Duration::from_millis(800));
        let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
        let mut pool = Vec::new();
        let connect = |_| {
            let server = server.clone();
            async move { Ok(server) }
        };
        let driven = drive(&spec, &mut pool, connect, &samples).await.unwrap();
        let (stall_from, stall_until) = server.stalled.lock().unwrap().expect("the server stalled");
        let mut samples = std::mem::take(&mut *samples.lock().unwrap());
        // Recorded as they finish; the schedule is their order.
        samples.sort_by_key(|s| s.scheduled);

        assert_eq!(pool.len(), 1, "the connection is back in the pool");
        assert_eq!(driven.connections, 1);
        assert_eq!(driven.peak_in_flight, 1);
        // Every pair of the schedule was sent (the backlog of 200 ms drains well within the
        // segment), at 10 ms intervals: `scheduled` is the schedule, not the send time.
        assert_eq!(samples.len(), 80);
        for (i, sample) in samples.iter().enumerate() {
            let offset = sample.scheduled - samples[0].scheduled;
            let expected = Duration::from_secs_f64(i as f64 / rate);
            assert!(
                offset.abs_diff(expected) < Duration::from_micros(10),
                "pair {i} scheduled at {offset:?}, expected {expected:?}"
            );
        }
        let during: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.scheduled > stall_from && s.scheduled < stall_until)
            .collect();
        // 200 ms at 10 ms intervals: about 20 pairs (generous bounds for a slow machine).
        assert!(
            during.len() >= 10,
            "{} pairs scheduled during the stall",
            during.len()
        );
        for sample in &during {
            // Answered only after the stall, and the latency says so: it covers the rest of
            // the stall from the pair's scheduled start, although it was sent afterwards.
            let answered = sample.scheduled + sample.timing.begin;
            assert!(
                answered >= stall_until,
                "scheduled {:?} into the stall, begin latency {:?} ends {:?} before the stall did",
                sample.scheduled - stall_from,
                sample.timing.begin,
                stall_until - answered
            );
            // The one connection was busy: sent only after the stall.
            assert!(
                sample.sent >= stall_until,
                "scheduled {:?} into the stall and sent during it",
                sample.scheduled - stall_from,
            );
        }
        let during = during.len() as u64;
        // What the tally makes of them: the waits, and the stall in the tail.
        let mut tally = OpenTally::default();
        for sample in samples {
            tally.record(sample);
        }
        // The first pair after the stall began found the connection busy; later ones of the
        // backlog may find it free again, but all were sent late.
        assert!(tally.waited >= 1, "waited {}", tally.waited);
        assert!(tally.late >= during, "late {}", tally.late);
        assert!(tally.tally.begin.ms(1.0) >= 200.0);
        assert!(
            tally.tally.begin.ms(0.95) >= 100.0,
            "{}",
            tally.tally.begin.ms(0.95)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_pool_opens_up_to_the_bound_before_the_schedule_and_comes_back_in_client_order() {
        let server = StallingServer {
            lock: Arc::new(tokio::sync::Mutex::new(0)),
            stall_at: 3,
            stall: Duration::from_millis(100),
            stalled: Arc::new(Mutex::new(None)),
        };
        // 200 pairs/s meet a 100 ms stall: the pairs queue up at the server, each on a
        // connection of its own, until all 4 are busy; then arrivals wait for one.
        let spec = spec(200.0, 4, Duration::from_millis(300));
        let opened = Arc::new(Mutex::new(Vec::new()));
        let connect = |client: usize| {
            opened.lock().unwrap().push(client);
            let server = server.clone();
            async move { Ok((client, server)) }
        };
        struct Numbered(usize, StallingServer);
        impl PairConn for Numbered {
            async fn begin(&mut self, batch: &Batch, lease: LeaseId) -> Result<(), String> {
                self.1.begin(batch, lease).await
            }

            async fn commit(&mut self, batch: &Batch, lease: LeaseId) -> Result<(), String> {
                self.1.commit(batch, lease).await
            }
        }
        let mut pool = Vec::new();
        let samples = Arc::new(Mutex::new(OpenTally::default()));
        let driven = drive(
            &spec,
            &mut pool,
            |client| {
                let made = connect(client);
                async move { made.await.map(|(c, s)| Numbered(c, s)) }
            },
            &samples,
        )
        .await
        .unwrap();
        assert_eq!(driven.connections, 4);
        assert_eq!(driven.peak_in_flight, 4);
        assert_eq!(*opened.lock().unwrap(), [0, 1, 2, 3]);
        let clients: Vec<usize> = pool.iter().map(|c| c.0).collect();
        assert_eq!(clients, [0, 1, 2, 3]);
        let tally = samples.lock().unwrap();
        assert!(tally.waited > 0, "the bound was hit");
        assert_eq!(tally.sent, 60);
    }

    #[test]
    fn rates_are_positive_numbers() {
        assert_eq!(parse_rate("250"), Ok(250.0));
        assert_eq!(parse_rate(" 0.5 "), Ok(0.5));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("-3").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("inf").is_err());
    }
}
