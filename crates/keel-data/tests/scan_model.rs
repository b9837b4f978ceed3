//! A model test of the shared cold scan (`keel_data::scan::ScanCore`):
//! random readers join, leave, seek and fetch with random budgets while
//! the model log takes appends, rolls, retention, compaction of its oldest
//! segments and truncation, and reads complete (or fail) in random order.
//! Every delivery must be what a plain read at the fetch would have given:
//! whole batches from the one holding the fetch's offset, byte for byte the
//! log's, within the fetch's budget (one batch excepted). Held data must
//! always be the log's current bytes, within the buffer's limit, and gone
//! once every reader has left. Replay a failure with `KEEL_TEST_SEED`.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use keel_data::scan::{batch_ends, FetchAt, ReadOrder, ScanCore, ScanSettings, Step, Waiter};
use keel_log::testing::{test_seed, BatchBuilder};
use keel_tier::scan::ScanPool;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

struct Batch {
    base: i64,
    last: i64,
    bytes: Bytes,
}

struct Segment {
    base: i64,
    batches: Vec<Batch>,
}

struct Log {
    segments: Vec<Segment>,
    end: i64,
    version: u32,
}

fn batch(base: i64, count: i64, version: u32, rng: &mut SmallRng) -> Batch {
    let mut b = BatchBuilder::new(1_000).base_offset(base);
    for i in 0..count {
        let pad = rng.gen_range(10..200);
        let value = format!("v{version}-o{}-{}", base + i, "x".repeat(pad));
        b = b.record(Some(b"k"), Some(value.as_bytes()));
    }
    Batch {
        base,
        last: base + count - 1,
        bytes: Bytes::from(b.build()),
    }
}

impl Log {
    /// A log of `batches` random batches in one or more segments.
    fn new(batches: usize, rng: &mut SmallRng) -> Log {
        let mut log = Log {
            segments: vec![Segment {
                base: 0,
                batches: Vec::new(),
            }],
            end: 0,
            version: 0,
        };
        for _ in 0..batches {
            log.append(rng);
        }
        log
    }

    fn start(&self) -> i64 {
        self.segments[0].base
    }

    /// The batches from the one holding `offset` to the log end.
    fn from(&self, offset: i64) -> Vec<Bytes> {
        self.segments
            .iter()
            .flat_map(|s| &s.batches)
            .filter(|b| b.last >= offset)
            .map(|b| b.bytes.clone())
            .collect()
    }

    /// A plain read: whole batches from the one holding `offset`, within
    /// `max_bytes` (at least one), up to the end of its segment.
    fn read(&self, offset: i64, max_bytes: usize) -> Bytes {
        let mut out = Vec::new();
        for s in &self.segments {
            let batches: Vec<&Batch> = s.batches.iter().filter(|b| b.last >= offset).collect();
            if batches.is_empty() {
                continue;
            }
            for b in batches {
                if !out.is_empty() && out.len() + b.bytes.len() > max_bytes {
                    break;
                }
                out.extend_from_slice(&b.bytes);
            }
            break;
        }
        Bytes::from(out)
    }

    fn append(&mut self, rng: &mut SmallRng) {
        if rng.gen_bool(0.2) {
            self.segments.push(Segment {
                base: self.end,
                batches: Vec::new(),
            });
        }
        let count = rng.gen_range(1..5);
        let b = batch(self.end, count, self.version, rng);
        self.end += count;
        self.segments.last_mut().unwrap().batches.push(b);
    }
}

/// A fetch waiting for a read: still listening unless answered at its
/// deadline.
struct Token {
    id: u64,
    listening: Rc<Cell<bool>>,
}

impl Waiter for Token {
    fn is_waiting(&self) -> bool {
        self.listening.get()
    }
}

struct Fetch {
    reader: usize,
    offset: i64,
    max_bytes: usize,
    /// The log from the fetch's offset when it was made.
    expected: Vec<Bytes>,
    listening: Rc<Cell<bool>>,
}

struct ModelReader {
    offset: i64,
    waiting: Option<u64>,
}

/// Checks a delivery against the log at the fetch: whole batches, the
/// log's own, from the one holding the offset; returns the offset after.
fn check(delivered: &Bytes, expected: &[Bytes], max_bytes: usize, what: &str) -> i64 {
    let ends = batch_ends(delivered);
    assert_eq!(
        ends.last().map_or(0, |e| e.1),
        delivered.len(),
        "{what}: whole batches only"
    );
    assert!(!ends.is_empty(), "{what}: at least one batch");
    assert!(
        ends.len() == 1 || delivered.len() <= max_bytes,
        "{what}: {} bytes over a budget of {max_bytes}",
        delivered.len()
    );
    let mut start = 0;
    for (i, (_, end)) in ends.iter().enumerate() {
        assert!(i < expected.len(), "{what}: batch {i} is past the log end");
        assert_eq!(
            &delivered[start..*end],
            &expected[i][..],
            "{what}: batch {i} is not the log's"
        );
        start = *end;
    }
    ends.last().unwrap().0 + 1
}

fn check_held(core: &ScanCore<usize, Token>, log: &Log, pool: &ScanPool, step: usize) {
    let mut held = 0;
    for (first, next, bytes) in core.held() {
        assert!(
            next > log.start(),
            "step {step}: data at {first}..{next} below the log start {} is held",
            log.start()
        );
        let expected = log.from(first);
        let after = check(
            bytes,
            &expected,
            usize::MAX,
            &format!("step {step}: held at {first}"),
        );
        assert_eq!(after, next, "step {step}: held at {first}");
        held += bytes.len() as u64;
    }
    assert_eq!(core.summary().held_bytes, held, "step {step}");
    assert_eq!(pool.held_bytes(), held, "step {step}");
    assert!(held <= pool.limit_bytes(), "step {step}: over the buffer's limit");
}

fn run(seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let limit = if rng.gen_bool(0.3) { 4_000 } else { 200_000 };
    let pool = Arc::new(ScanPool::new(limit));
    let settings = ScanSettings {
        reader_idle_ms: 5_000,
        window_bytes: if rng.gen_bool(0.5) { 3_000 } else { 1 << 20 },
        max_readers: 6,
        ..ScanSettings::default()
    };
    let mut core: ScanCore<usize, Token> = ScanCore::new(settings, Arc::clone(&pool));
    let mut log = Log::new(60, &mut rng);
    let mut readers: HashMap<usize, ModelReader> = HashMap::new();
    let mut fetches: HashMap<u64, Fetch> = HashMap::new();
    let mut pending: Vec<(ReadOrder, Bytes)> = Vec::new();
    let (mut now, mut next_token, mut next_reader) = (0i64, 0u64, 0usize);
    let (mut served, mut delivered) = (0u64, 0u64);

    for step in 0..3_000 {
        now += rng.gen_range(0..50);
        match rng.gen_range(0..100) {
            0..=6 => {
                readers.insert(
                    next_reader,
                    ModelReader {
                        offset: rng.gen_range(log.start()..=log.end),
                        waiting: None,
                    },
                );
                next_reader += 1;
            }
            7..=8 => {
                if let Some(&id) = readers.keys().next() {
                    readers.remove(&id);
                    if rng.gen_bool(0.5) {
                        core.leave(&id);
                    }
                }
            }
            9..=11 => {
                if let Some(r) = readers.values_mut().next() {
                    r.offset = rng.gen_range(log.start()..=log.end);
                }
            }
            12..=20 => log.append(&mut rng),
            21..=22 => {
                // Retention: the oldest segment goes.
                if log.segments.len() > 1 {
                    log.segments.remove(0);
                    core.forget_below(log.start());
                }
            }
            23..=24 => {
                // The cleaner rewrites the oldest sealed segments.
                let sealed = log.segments.len() - 1;
                if sealed > 0 {
                    let k = rng.gen_range(1..=sealed);
                    log.version += 1;
                    for s in &mut log.segments[..k] {
                        let n = s.batches.len();
                        let old = std::mem::take(&mut s.batches);
                        for (i, b) in old.into_iter().enumerate() {
                            if i + 1 < n && rng.gen_bool(0.3) {
                                continue;
                            }
                            let mut fresh = batch(b.base, b.last - b.base + 1, log.version, &mut rng);
                            fresh.last = b.last;
                            s.batches.push(fresh);
                        }
                    }
                    core.invalidate_below(log.segments[k].base);
                }
            }
            25 => {
                // Truncation inside the active segment.
                let active = log.segments.last_mut().unwrap();
                if !active.batches.is_empty() {
                    let keep = rng.gen_range(0..active.batches.len());
                    active.batches.truncate(keep);
                    log.end = active.batches.last().map_or(active.base, |b| b.last + 1);
                    log.version += 1;
                    core.clear();
                }
            }
            26..=29 => {
                now += rng.gen_range(0..3_000);
                core.tick(now, log.start());
            }
            30..=34 => {
                // A waiting fetch is answered empty at its deadline.
                if let Some(r) = readers.values_mut().find(|r| r.waiting.is_some()) {
                    let token = r.waiting.take().unwrap();
                    fetches[&token].listening.set(false);
                }
            }
            35..=64 => {
                // A read completes (or fails).
                if pending.is_empty() {
                    continue;
                }
                let (order, bytes) = pending.swap_remove(rng.gen_range(0..pending.len()));
                let result = (!rng.gen_bool(0.05)).then_some(bytes);
                let done = core.complete(order.id, result, now, log.end);
                if let Some(ahead) = done.ahead {
                    pending.push((ahead, log.read(ahead.offset, ahead.max_bytes)));
                }
                for (token, data) in done.deliveries {
                    let f = fetches.remove(&token.id).expect("a known fetch");
                    let reader = readers.get_mut(&f.reader);
                    let current = reader.as_ref().is_some_and(|r| r.waiting == Some(token.id));
                    let Some(data) = data else {
                        if let (true, Some(r)) = (current, reader) {
                            r.waiting = None;
                        }
                        continue;
                    };
                    if data.is_empty() {
                        // The read found nothing: truncated under it.
                        if let (true, Some(r)) = (current, reader) {
                            r.waiting = None;
                        }
                        continue;
                    }
                    let what = format!("step {step}: read {} for fetch at {}", order.id, f.offset);
                    let after = check(&data, &f.expected, f.max_bytes, &what);
                    delivered += data.len() as u64;
                    if let (true, Some(r)) = (current, reader) {
                        assert!(f.listening.get());
                        r.offset = after;
                        r.waiting = None;
                    }
                }
            }
            _ => {
                // A reader fetches.
                let ids: Vec<usize> = readers
                    .iter()
                    .filter(|(_, r)| r.waiting.is_none())
                    .map(|(id, _)| *id)
                    .collect();
                if ids.is_empty() {
                    continue;
                }
                let id = ids[rng.gen_range(0..ids.len())];
                let r = readers.get_mut(&id).unwrap();
                r.offset = r.offset.clamp(log.start(), log.end);
                if r.offset == log.end {
                    continue;
                }
                let max_bytes = rng.gen_range(1..3_000);
                let listening = Rc::new(Cell::new(true));
                let token = Token {
                    id: next_token,
                    listening: Rc::clone(&listening),
                };
                next_token += 1;
                let expected = log.from(r.offset);
                let at = FetchAt {
                    offset: r.offset,
                    max_bytes,
                    now_ms: now,
                    ahead_limit: log.end,
                    contended: rng.gen_bool(0.5),
                };
                match core.fetch(&id, at, token) {
                    Step::Serve { data, ahead } => {
                        let data = data.join();
                        let what = format!("step {step}: held data for {id} at {}", r.offset);
                        r.offset = check(&data, &expected, max_bytes, &what);
                        served += data.len() as u64;
                        if let Some(ahead) = ahead {
                            pending.push((ahead, log.read(ahead.offset, ahead.max_bytes)));
                        }
                    }
                    Step::Wait => r.waiting = Some(next_token - 1),
                    Step::Defer => {}
                    Step::Read(order) => {
                        assert_eq!((order.offset, order.max_bytes), (r.offset, max_bytes));
                        pending.push((order, log.read(order.offset, order.max_bytes)));
                        r.waiting = Some(next_token - 1);
                    }
                }
                if let Some(token) = r.waiting.filter(|t| *t == next_token - 1) {
                    fetches.insert(
                        token,
                        Fetch {
                            reader: id,
                            offset: r.offset,
                            max_bytes,
                            expected,
                            listening,
                        },
                    );
                }
            }
        }
        check_held(&core, &log, &pool, step);
    }

    // Everyone leaves (their fetches answered empty); the reads in flight
    // complete: nothing stays held.
    for f in fetches.values() {
        f.listening.set(false);
    }
    for id in readers.keys() {
        core.leave(id);
    }
    for (order, bytes) in pending.drain(..) {
        let done = core.complete(order.id, Some(bytes), now, log.end);
        assert!(done.ahead.is_none(), "a read-ahead for nobody");
    }
    now += 10_000;
    core.tick(now, log.start());
    check_held(&core, &log, &pool, usize::MAX);
    assert_eq!(pool.held_bytes(), 0, "held for nobody");
    drop(core);
    assert_eq!(pool.held_bytes(), 0);
    eprintln!("seed={seed}: served {served} B from held data, delivered {delivered} B from reads");
}

#[test]
fn model_shared_scans_deliver_what_plain_reads_would() {
    let seed = test_seed();
    for round in 0..20 {
        run(seed.wrapping_add(round));
    }
}

/// Two readers riding the same stretch of the log: the one behind is
/// served what the one ahead read, and each chunk is read once.
#[test]
fn readers_riding_together_share_each_read() {
    let mut rng = SmallRng::seed_from_u64(7);
    let pool = Arc::new(ScanPool::new(1 << 20));
    let mut core: ScanCore<usize, Token> = ScanCore::new(ScanSettings::default(), Arc::clone(&pool));
    let log = Log::new(200, &mut rng);
    let token = |id| Token {
        id,
        listening: Rc::new(Cell::new(true)),
    };
    let (mut a, mut b, mut read_bytes) = (0i64, 0i64, 0u64);
    let mut pending: Vec<ReadOrder> = Vec::new();
    let mut run_read = |core: &mut ScanCore<usize, Token>, order: ReadOrder, pending: &mut Vec<ReadOrder>| {
        let bytes = log.read(order.offset, order.max_bytes);
        read_bytes += bytes.len() as u64;
        let done = core.complete(order.id, Some(bytes), 0, log.end);
        pending.extend(done.ahead);
        done.deliveries
            .into_iter()
            .map(|(_, d)| d.unwrap())
            .last()
            .unwrap_or_default()
    };
    while a < log.end || b < log.end {
        for (id, at) in [(0usize, &mut a), (1usize, &mut b)] {
            if *at >= log.end {
                core.leave(&id);
                continue;
            }
            let fetch = FetchAt {
                offset: *at,
                max_bytes: 2_000,
                now_ms: 0,
                ahead_limit: log.end,
                contended: false,
            };
            let got = match core.fetch(&id, fetch, token(id as u64)) {
                Step::Serve { data, ahead } => {
                    pending.extend(ahead);
                    data.join()
                }
                Step::Wait => {
                    let order = pending.remove(0);
                    run_read(&mut core, order, &mut pending)
                }
                Step::Read(order) => run_read(&mut core, order, &mut pending),
                Step::Defer => unreachable!("nothing contends"),
            };
            *at = batch_ends(&got).last().unwrap().0 + 1;
        }
    }
    core.leave(&0);
    core.leave(&1);
    let total: u64 = log.from(0).iter().map(|b| b.len() as u64).sum();
    let s = pool.stats();
    assert!(
        read_bytes <= total + 2_000,
        "read {read_bytes} B of a {total} B log"
    );
    assert!(s.shared_bytes > total / 2, "{s:?}");
    assert_eq!(s.held_bytes, 0, "{s:?}");
}
