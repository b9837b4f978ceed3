//! What one request spent its time on, stage by stage, and which
//! partitions, files and positions it touched.
//!
//! The server opens a [`RequestTrace`] when a request frame has arrived
//! and runs the broker's handling inside [`scope`]; code anywhere below
//! (the Produce and Fetch handlers, the partition's append queue results)
//! adds to the current trace through the free functions here, which do
//! nothing outside a scope (in tests, on maintenance paths). When the
//! response has been sent the server hands the trace to
//! [`crate::metrics::Metrics::finish`]: the stages feed the per-API
//! histograms, and a request slower than `keel.request.slow.ms` is logged
//! whole.
//!
//! A trace is per request, so its lock is hardly ever contended; work for
//! several partitions of one request runs concurrently, which is why
//! partition stages keep the longest partition's time (the request waited
//! for that one), not the sum.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A step of a request's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// From the kernel's receipt of the newest bytes of the read that
    /// completed the frame to that read: waiting in the socket's receive
    /// queue for a request thread (plaintext connections; the kernel's
    /// receive timestamp), counted from when the connection wanted to read.
    Socket,
    /// From the frame's first bytes read to the arrival of its last: the
    /// client's upload.
    Receive,
    /// From the frame's last byte to its handling: waiting behind the
    /// earlier requests of its connection, answered in order.
    Connection,
    /// Parsing the request.
    Decode,
    /// Checking a produced batch (CRC, records, timestamps): CPU.
    Validate,
    /// Waiting in a partition's append queue for its writer thread.
    Queue,
    /// Waiting for the partition's writer lock (maintenance holds it).
    Lock,
    /// Rolling to a new segment before the append.
    Roll,
    /// Writing the batches to the segment file.
    Write,
    /// The fsync `flush.messages` / `flush.ms` asked for.
    Flush,
    /// After the write: caching the batches, moving the high watermark,
    /// waking the fetches waiting for it.
    Publish,
    /// From the writer's answer to the request running again on a request
    /// thread.
    Reply,
    /// In a cluster, an acks=all produce waiting for its batches' WAL
    /// object to be written to the object store and committed.
    Commit,
    /// A transactional produce waiting for its transaction's coordinator.
    Coordinator,
    /// A fetch's long poll: waiting for data to arrive.
    Wait,
    /// Reading from the tail cache (memory).
    ReadCache,
    /// Taking data a read took before the fetch asked (a read-ahead or
    /// another reader's read), or waiting for such a read in flight.
    ReadAhead,
    /// Reading a local segment file (the cold-read executor).
    ReadLocal,
    /// Reading a segment from a capacity directory.
    ReadCapacity,
    /// Reading a segment from the object store.
    ReadRemote,
    /// Encoding the response.
    Encode,
    /// Writing the response to the socket.
    Send,
    /// From the frame's arrival to the response sent.
    Total,
}

impl Stage {
    pub const ALL: [Stage; 23] = [
        Stage::Socket,
        Stage::Receive,
        Stage::Connection,
        Stage::Decode,
        Stage::Validate,
        Stage::Queue,
        Stage::Lock,
        Stage::Roll,
        Stage::Write,
        Stage::Flush,
        Stage::Publish,
        Stage::Reply,
        Stage::Commit,
        Stage::Coordinator,
        Stage::Wait,
        Stage::ReadCache,
        Stage::ReadAhead,
        Stage::ReadLocal,
        Stage::ReadCapacity,
        Stage::ReadRemote,
        Stage::Encode,
        Stage::Send,
        Stage::Total,
    ];

    /// The stage's label in metrics and in the slow-request log.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Socket => "socket",
            Stage::Receive => "receive",
            Stage::Connection => "connection",
            Stage::Decode => "decode",
            Stage::Validate => "validate",
            Stage::Queue => "queue",
            Stage::Lock => "lock",
            Stage::Roll => "roll",
            Stage::Write => "write",
            Stage::Flush => "flush",
            Stage::Publish => "publish",
            Stage::Reply => "reply",
            Stage::Commit => "commit",
            Stage::Coordinator => "coordinator",
            Stage::Wait => "wait",
            Stage::ReadCache => "read_cache",
            Stage::ReadAhead => "read_ahead",
            Stage::ReadLocal => "read_local",
            Stage::ReadCapacity => "read_capacity",
            Stage::ReadRemote => "read_remote",
            Stage::Encode => "encode",
            Stage::Send => "send",
            Stage::Total => "total",
        }
    }

    /// Where a fetch's data came from, as a read stage.
    pub fn of_tier(tier: keel_log::Tier) -> Stage {
        match tier {
            keel_log::Tier::Capacity => Stage::ReadCapacity,
            keel_log::Tier::Remote => Stage::ReadRemote,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One partition a request wrote or read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionTrace {
    pub topic: Arc<str>,
    pub partition: i32,
    /// Record bytes written or returned.
    pub bytes: u64,
    /// Where they went or came from: `append`, or a read stage's name.
    pub source: &'static str,
    /// The file and byte position written or read, if any.
    pub place: Option<Place>,
    /// Stages of this partition alone.
    pub stages: Vec<(Stage, Duration)>,
}

/// Where in a partition's data a request wrote or read. A segment is kept
/// by its base offset, so the produce path formats no path: only the
/// slow-request log names the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// The partition's own segment `<base offset>.log`.
    Segment { base_offset: i64, position: u64 },
    /// A file or a colder tier's object, named in full.
    Named { name: String, position: Option<u64> },
}

/// The parts of the slow-request log a partition list may take: a
/// request naming thousands of partitions logs the first ones and a count.
pub const MAX_TRACED_PARTITIONS: usize = 64;

/// One request's timings, filled in as it is handled.
#[derive(Debug)]
pub struct RequestTrace {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    /// The client's address.
    pub peer: SocketAddr,
    /// When the request arrived: its frame's first bytes read, or earlier,
    /// when the kernel had the whole frame before Keel read any of it (the
    /// `socket` stage).
    pub started: Instant,
    /// Partition appends a Produce makes ([`expect_appends`]; `u32::MAX`
    /// before it says), and how many are in their partitions' queues.
    appends_expected: AtomicU32,
    appends_queued: AtomicU32,
    /// How long the connection reads nothing more after the response
    /// (a client quota's throttle time, KIP-219).
    throttle_ms: AtomicU32,
    /// Time the request's own task has spent being polled (on a request
    /// thread), in ns, not counting a poll under way; and when that poll
    /// began, in ns after `started` (`NOT_POLLING` between polls).
    busy_ns: AtomicU64,
    poll_began_ns: AtomicU64,
    data: Mutex<TraceData>,
    /// The user its connection authenticated as (unset: ANONYMOUS).
    user: std::sync::OnceLock<Arc<str>>,
}

const NOT_POLLING: u64 = u64::MAX;

/// A poll of a request's task under way: counted as busy time when dropped.
pub struct Polling<'a> {
    trace: &'a RequestTrace,
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        let t = self.trace;
        let began = t.poll_began_ns.swap(NOT_POLLING, Ordering::AcqRel);
        if began != NOT_POLLING {
            let now = t.since_started_ns();
            t.busy_ns.fetch_add(now.saturating_sub(began), Ordering::AcqRel);
        }
    }
}

#[derive(Debug, Default)]
struct TraceData {
    client_id: String,
    stages: [Option<Duration>; Stage::ALL.len()],
    partitions: Vec<PartitionTrace>,
    untraced_partitions: usize,
}

/// What a finished trace holds.
#[derive(Debug, Clone)]
pub struct TraceSummary {
    pub client_id: String,
    /// The stages that happened, in [`Stage::ALL`] order.
    pub stages: Vec<(Stage, Duration)>,
    pub partitions: Vec<PartitionTrace>,
    /// Partitions past [`MAX_TRACED_PARTITIONS`], counted only.
    pub untraced_partitions: usize,
}

impl RequestTrace {
    pub fn new(
        api_key: i16,
        api_version: i16,
        correlation_id: i32,
        peer: SocketAddr,
        started: Instant,
    ) -> RequestTrace {
        RequestTrace {
            api_key,
            api_version,
            correlation_id,
            peer,
            started,
            appends_expected: AtomicU32::new(u32::MAX),
            appends_queued: AtomicU32::new(0),
            throttle_ms: AtomicU32::new(0),
            busy_ns: AtomicU64::new(0),
            poll_began_ns: AtomicU64::new(NOT_POLLING),
            data: Mutex::new(TraceData::default()),
            user: std::sync::OnceLock::new(),
        }
    }

    /// Whether every append of this Produce is in its partition's queue:
    /// what follows on the connection can no longer overtake them.
    pub fn appends_queued(&self) -> bool {
        let expected = self.appends_expected.load(Ordering::Acquire);
        expected != u32::MAX && self.appends_queued.load(Ordering::Acquire) >= expected
    }

    fn since_started_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// Marks a poll of the request's task; its time counts as busy until
    /// the guard is dropped. The connection polls each request through it.
    pub fn polling(&self) -> Polling<'_> {
        self.poll_began_ns
            .store(self.since_started_ns(), Ordering::Release);
        Polling { trace: self }
    }

    /// The time the request's task has occupied a request thread so far
    /// (Kafka's request handler time, the measure of `request_percentage`):
    /// not its waits (a long poll, a rebalance, a partition's writer).
    pub fn busy(&self) -> Duration {
        let mut ns = self.busy_ns.load(Ordering::Acquire);
        let began = self.poll_began_ns.load(Ordering::Acquire);
        if began != NOT_POLLING {
            ns += self.since_started_ns().saturating_sub(began);
        }
        Duration::from_nanos(ns)
    }

    /// The throttle time a quota gave the request, in ms (0: none).
    pub fn throttle_ms(&self) -> u32 {
        self.throttle_ms.load(Ordering::Acquire)
    }

    /// Adds `d` to a stage that happens in sequence with the others.
    pub fn add(&self, stage: Stage, d: Duration) {
        let mut data = self.data.lock();
        let slot = &mut data.stages[stage.index()];
        *slot = Some(slot.unwrap_or_default() + d);
    }

    /// Raises a stage to `d`: for work several partitions do at once.
    pub fn longest(&self, stage: Stage, d: Duration) {
        let mut data = self.data.lock();
        let slot = &mut data.stages[stage.index()];
        *slot = Some(slot.unwrap_or_default().max(d));
    }

    pub fn set_client_id(&self, client_id: &str) {
        self.data.lock().client_id = client_id.to_string();
    }

    /// The user the connection authenticated as (a TLS client
    /// certificate's mapped name), for its quotas.
    pub fn set_user(&self, user: Arc<str>) {
        let _ = self.user.set(user);
    }

    /// Records a partition, and its stages as the longest of their kind.
    pub fn partition(&self, p: PartitionTrace) {
        for &(stage, d) in &p.stages {
            self.longest(stage, d);
        }
        let mut data = self.data.lock();
        if data.partitions.len() < MAX_TRACED_PARTITIONS {
            data.partitions.push(p);
        } else {
            data.untraced_partitions += 1;
        }
    }

    /// What the trace holds, taken out of it: called once, when the
    /// request is done.
    pub fn take_summary(&self) -> TraceSummary {
        let mut data = self.data.lock();
        TraceSummary {
            client_id: std::mem::take(&mut data.client_id),
            stages: Stage::ALL
                .iter()
                .filter_map(|&s| data.stages[s.index()].map(|d| (s, d)))
                .collect(),
            partitions: std::mem::take(&mut data.partitions),
            untraced_partitions: data.untraced_partitions,
        }
    }
}

tokio::task_local! {
    static CURRENT: Arc<RequestTrace>;
}

/// Runs `f` with `trace` as the current request's trace.
pub async fn scope<F: std::future::Future>(trace: Arc<RequestTrace>, f: F) -> F::Output {
    CURRENT.scope(trace, f).await
}

/// Runs `f` within `trace`, if there is one: carries the current trace
/// into a spawned task (`tokio::spawn(trace::within(trace::current(), f))`).
pub async fn within<F: std::future::Future>(trace: Option<Arc<RequestTrace>>, f: F) -> F::Output {
    match trace {
        Some(t) => CURRENT.scope(t, f).await,
        None => f.await,
    }
}

/// The current request's trace, if there is one.
pub fn current() -> Option<Arc<RequestTrace>> {
    CURRENT.try_with(Arc::clone).ok()
}

fn with(f: impl FnOnce(&RequestTrace)) {
    let _ = CURRENT.try_with(|t| f(t));
}

/// Says how many partition appends the current request (a Produce) makes.
pub fn expect_appends(n: usize) {
    with(|t| {
        let n = u32::try_from(n).unwrap_or(u32::MAX - 1);
        t.appends_expected.store(n, Ordering::Release);
    });
}

/// Notes that one of the current request's appends is in its partition's
/// queue, in the order the partition will write it.
pub fn append_queued() {
    with(|t| {
        t.appends_queued.fetch_add(1, Ordering::AcqRel);
    });
}

/// [`RequestTrace::add`] on the current trace, if there is one.
pub fn add(stage: Stage, d: Duration) {
    with(|t| t.add(stage, d));
}

/// [`RequestTrace::longest`] on the current trace, if there is one.
pub fn longest(stage: Stage, d: Duration) {
    with(|t| t.longest(stage, d));
}

/// [`RequestTrace::partition`] on the current trace, if there is one.
pub fn partition(p: PartitionTrace) {
    with(|t| t.partition(p));
}

/// Throttles the connection of the current request for `ms` after its
/// response (the longest of what the request's quotas ask).
pub fn throttle(ms: u32) {
    with(|t| {
        t.throttle_ms.fetch_max(ms, Ordering::AcqRel);
    });
}

/// [`RequestTrace::busy`] of the current trace, if there is one.
pub fn busy() -> Option<Duration> {
    CURRENT.try_with(|t| t.busy()).ok()
}

/// [`RequestTrace::set_client_id`] on the current trace, if there is one.
pub fn set_client_id(client_id: &str) {
    with(|t| t.set_client_id(client_id));
}

/// The current request's user, if its connection authenticated.
pub fn user() -> Option<Arc<str>> {
    CURRENT.try_with(|t| t.user.get().cloned()).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace() -> Arc<RequestTrace> {
        Arc::new(RequestTrace::new(
            0,
            9,
            7,
            "127.0.0.1:5".parse().unwrap(),
            Instant::now(),
        ))
    }

    #[test]
    fn busy_time_is_the_time_inside_polls_only() {
        let t = trace();
        assert_eq!(t.busy(), Duration::ZERO);
        let slept = Duration::from_millis(3);
        {
            let _polling = t.polling();
            std::thread::sleep(slept);
            // A poll under way counts as far as it has got.
            assert!(t.busy() >= slept);
        }
        let after_poll = t.busy();
        assert!(after_poll >= slept);
        // Between polls (a long poll, a writer's queue) nothing is added.
        std::thread::sleep(slept);
        assert_eq!(t.busy(), after_poll);
        {
            let _polling = t.polling();
            std::thread::sleep(slept);
        }
        assert!(t.busy() >= after_poll + slept);
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn sequential_stages_add_up_and_partition_stages_keep_the_longest() {
        let t = trace();
        t.add(Stage::Decode, ms(1));
        t.add(Stage::Decode, ms(2));
        for (i, write) in [5, 9, 3].into_iter().enumerate() {
            t.partition(PartitionTrace {
                topic: "t".into(),
                partition: i as i32,
                bytes: 10,
                source: "append",
                place: None,
                stages: vec![(Stage::Write, ms(write)), (Stage::Queue, ms(1))],
            });
        }
        let s = t.take_summary();
        assert_eq!(
            s.stages,
            vec![
                (Stage::Decode, ms(3)),
                (Stage::Queue, ms(1)),
                (Stage::Write, ms(9))
            ]
        );
        assert_eq!(s.partitions.len(), 3);
    }

    #[test]
    fn a_huge_request_traces_its_first_partitions_and_counts_the_rest() {
        let t = trace();
        for i in 0..MAX_TRACED_PARTITIONS + 5 {
            t.partition(PartitionTrace {
                topic: "t".into(),
                partition: i as i32,
                bytes: 0,
                source: "read_cache",
                place: None,
                stages: Vec::new(),
            });
        }
        let s = t.take_summary();
        assert_eq!(
            (s.partitions.len(), s.untraced_partitions),
            (MAX_TRACED_PARTITIONS, 5)
        );
    }

    #[tokio::test]
    async fn the_free_functions_reach_the_scoped_trace_and_nothing_outside_one() {
        add(Stage::Wait, ms(4));
        let t = trace();
        scope(Arc::clone(&t), async {
            add(Stage::Wait, ms(4));
            set_client_id("c1");
        })
        .await;
        let s = t.take_summary();
        assert_eq!(
            (s.client_id.as_str(), s.stages),
            ("c1", vec![(Stage::Wait, ms(4))])
        );
    }

    #[test]
    fn every_stage_is_listed_once_in_order() {
        for (i, s) in Stage::ALL.iter().enumerate() {
            assert_eq!(s.index(), i, "{s:?}");
        }
    }
}
