//! The shared scan's convoy policy in simulated time: readers at different
//! offsets of one history, a disk that serves one read at a time at a
//! fixed rate, clients that fetch again as soon as they are answered (or
//! after a long poll when paced). With readers at 0, 25, 50 and 75 % the
//! disk must read about one history, not 2.5, everyone must finish within
//! about one history's time, and no reader may be slowed longer than the
//! bound; a stalled lead must hold nobody back.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use keel_data::scan::{batch_ends, FetchAt, ReadId, ScanCore, ScanSettings, Step, Waiter};
use keel_log::testing::BatchBuilder;
use keel_tier::scan::ScanPool;

/// One 10 kB record per batch, offset = index.
const BATCHES: i64 = 2_000;
const RECORD: usize = 10_000;
/// The disk: bytes per simulated ms (1 MB/s: the history takes ~20 s).
const DISK_BYTES_PER_MS: f64 = 1_000.0;
/// Each fetch asks for about 100 kB.
const FETCH_BYTES: usize = 100_000;
/// A paced fetch's long poll.
const LONG_POLL_MS: i64 = 100;

struct Token(Rc<Cell<bool>>);

impl Waiter for Token {
    fn is_waiting(&self) -> bool {
        self.0.get()
    }
}

fn history() -> Vec<Bytes> {
    let value = vec![b'x'; RECORD];
    (0..BATCHES)
        .map(|o| {
            Bytes::from(
                BatchBuilder::new(1_000)
                    .base_offset(o)
                    .record(None, Some(&value))
                    .build(),
            )
        })
        .collect()
}

fn read(log: &[Bytes], offset: i64, max_bytes: usize) -> Bytes {
    let mut out = Vec::new();
    for b in &log[offset as usize..] {
        if !out.is_empty() && out.len() + b.len() > max_bytes {
            break;
        }
        out.extend_from_slice(b);
    }
    Bytes::from(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Wake(usize),
    ReadDone(ReadId),
}

struct Outcome {
    disk_bytes: u64,
    history_bytes: u64,
    finished_ms: Vec<i64>,
    slowed_ms: Vec<i64>,
}

/// A reader that changes pace once it has read to `from` (a share of the
/// history): it stops fetching (`think_ms` None), or waits `think_ms`
/// before each fetch.
#[derive(Clone, Copy)]
struct Slows {
    reader: usize,
    from: f64,
    think_ms: Option<i64>,
}

/// Runs readers from `starts` (shares of the history) to its end.
fn simulate(starts: &[f64], settings: ScanSettings, slows: Option<Slows>) -> Outcome {
    let log = history();
    let history_bytes: u64 = log.iter().map(|b| b.len() as u64).sum();
    let pool = Arc::new(ScanPool::new(64 << 20));
    let mut core: ScanCore<usize, Token> = ScanCore::new(settings, Arc::clone(&pool));
    let mut offsets: Vec<i64> = starts.iter().map(|s| (s * BATCHES as f64) as i64).collect();
    let mut finished = vec![0i64; starts.len()];
    let mut slowed = vec![0i64; starts.len()];
    let mut events = BinaryHeap::new();
    for i in 0..starts.len() {
        events.push(Reverse((0i64, Event::Wake(i))));
    }
    // The disk: reads queue and are served one at a time.
    let (mut busy_until, mut outstanding, mut disk_bytes) = (0i64, 0usize, 0u64);
    let mut in_flight: HashMap<ReadId, Bytes> = HashMap::new();
    let mut waiting: HashMap<usize, bool> = HashMap::new();
    let mut issue = |order: keel_data::scan::ReadOrder,
                     now: i64,
                     events: &mut BinaryHeap<Reverse<(i64, Event)>>,
                     in_flight: &mut HashMap<ReadId, Bytes>,
                     outstanding: &mut usize| {
        let bytes = read(&log, order.offset, order.max_bytes);
        disk_bytes += bytes.len() as u64;
        let start = now.max(busy_until);
        busy_until = start + (bytes.len() as f64 / DISK_BYTES_PER_MS).ceil() as i64;
        events.push(Reverse((busy_until, Event::ReadDone(order.id))));
        in_flight.insert(order.id, bytes);
        *outstanding += 1;
    };
    let mut steps = 0;
    while let Some(Reverse((now, event))) = events.pop() {
        steps += 1;
        assert!(steps < 1_000_000, "the simulation does not end");
        match event {
            Event::Wake(i) => {
                if offsets[i] >= BATCHES {
                    finished[i] = now;
                    core.leave(&i);
                    continue;
                }
                let slow = slows.filter(|s| s.reader == i && offsets[i] >= (s.from * BATCHES as f64) as i64);
                let think = match slow {
                    Some(Slows { think_ms: None, .. }) => continue,
                    Some(Slows {
                        think_ms: Some(ms), ..
                    }) => ms,
                    None => 1,
                };
                let at = FetchAt {
                    offset: offsets[i],
                    max_bytes: FETCH_BYTES,
                    now_ms: now,
                    ahead_limit: BATCHES,
                    contended: outstanding >= 2,
                };
                match core.fetch(&i, at, Token(Rc::new(Cell::new(true)))) {
                    Step::Serve { data, ahead } => {
                        if let Some(order) = ahead {
                            issue(order, now, &mut events, &mut in_flight, &mut outstanding);
                        }
                        offsets[i] = batch_ends(&data.join()).last().unwrap().0 + 1;
                        events.push(Reverse((now + think, Event::Wake(i))));
                    }
                    Step::Wait => {
                        waiting.insert(i, true);
                    }
                    Step::Read(order) => {
                        issue(order, now, &mut events, &mut in_flight, &mut outstanding);
                        waiting.insert(i, true);
                    }
                    Step::Defer => events.push(Reverse((now + LONG_POLL_MS, Event::Wake(i)))),
                }
                if let Some((s, _)) = core.slowed(&i) {
                    slowed[i] = slowed[i].max(s);
                }
            }
            Event::ReadDone(id) => {
                outstanding -= 1;
                let bytes = in_flight.remove(&id).unwrap();
                let done = core.complete(id, Some(bytes), now, BATCHES);
                if let Some(order) = done.ahead {
                    issue(order, now, &mut events, &mut in_flight, &mut outstanding);
                }
                for (token, data) in done.deliveries {
                    let _ = token;
                    let data = data.unwrap();
                    // Which reader: the one waiting at the data's offset.
                    let first = batch_ends(&data)[0].0;
                    let who: Vec<usize> = (0..offsets.len())
                        .filter(|r| waiting.get(r) == Some(&true) && offsets[*r] == first)
                        .collect();
                    for r in who {
                        waiting.insert(r, false);
                        offsets[r] = batch_ends(&data).last().unwrap().0 + 1;
                        events.push(Reverse((now + 1, Event::Wake(r))));
                    }
                }
            }
        }
    }
    Outcome {
        disk_bytes,
        history_bytes,
        finished_ms: finished,
        slowed_ms: slowed,
    }
}

fn settings() -> ScanSettings {
    ScanSettings {
        // 2 % of the history, as 64 MiB is of a few GiB.
        window_bytes: 400_000,
        max_slowed_ms: 60_000,
        ..ScanSettings::default()
    }
}

fn report(name: &str, o: &Outcome) {
    eprintln!(
        "{name}: disk read {:.2} histories; finished at {:?} ms; slowed {:?} ms",
        o.disk_bytes as f64 / o.history_bytes as f64,
        o.finished_ms,
        o.slowed_ms
    );
}

/// One history's time on this disk, in ms.
fn history_ms(o: &Outcome) -> f64 {
    o.history_bytes as f64 / DISK_BYTES_PER_MS
}

#[test]
fn four_staggered_readers_ride_one_pass() {
    let starts = [0.0, 0.25, 0.5, 0.75];
    let fair = simulate(
        &starts,
        ScanSettings {
            max_slowed_ms: 0,
            ..settings()
        },
        None,
    );
    report("without pacing", &fair);
    let convoy = simulate(&starts, settings(), None);
    report("convoy", &convoy);
    let histories = convoy.disk_bytes as f64 / convoy.history_bytes as f64;
    assert!(histories <= 1.3, "the convoy read {histories:.2} histories");
    assert!(
        fair.disk_bytes as f64 / fair.history_bytes as f64 >= 2.3,
        "without pacing each reader reads its own range"
    );
    let last = *convoy.finished_ms.iter().max().unwrap() as f64;
    assert!(
        last <= 1.25 * history_ms(&convoy),
        "the last reader finished after {last} ms, one history takes {} ms",
        history_ms(&convoy)
    );
    let fair_last = *fair.finished_ms.iter().max().unwrap() as f64;
    assert!(
        last < fair_last,
        "the convoy finished later ({last} ms) than fair shares ({fair_last} ms)"
    );
    for s in &convoy.slowed_ms {
        assert!(*s <= settings().max_slowed_ms, "a reader was slowed {s} ms");
    }
}

/// A lead that stops reading holds the readers ahead of it back for at
/// most `STALLED_MS` (plus a long poll): they finish as they would alone.
#[test]
fn a_stalled_lead_holds_nobody_back() {
    let starts = [0.0, 0.5];
    let stalls = Slows {
        reader: 0,
        from: 0.1,
        think_ms: None,
    };
    let stalled = simulate(&starts, settings(), Some(stalls));
    report("stalled lead", &stalled);
    let alone = simulate(&[0.5], settings(), None);
    report("alone", &alone);
    // Held back while the lead read its 10 % (at most its time) and until
    // it counted as stalled.
    let lead_active = (0.1 * history_ms(&stalled)) as i64 * 2;
    let bound = alone.finished_ms[0] + lead_active + keel_data::scan::STALLED_MS + 2 * LONG_POLL_MS;
    assert!(
        stalled.finished_ms[1] <= bound,
        "the reader ahead finished at {} ms, alone at {} ms",
        stalled.finished_ms[1],
        alone.finished_ms[0]
    );
}

/// A lead that slows down after the reader ahead of it was paced does not
/// hold it back past the bound (it is let go as soon as the lead can no
/// longer reach it in time, and for good once slowed that long); and a
/// reader the lead cannot reach within the bound is not paced once the
/// lead's rate is known.
#[test]
fn nobody_is_slowed_past_the_bound() {
    let bound = 15_000;
    let bounded = ScanSettings {
        max_slowed_ms: bound,
        ..settings()
    };
    let slows = Slows {
        reader: 0,
        from: 0.05,
        think_ms: Some(1_000),
    };
    let o = simulate(&[0.0, 0.25], bounded, Some(slows));
    report("slowing lead", &o);
    assert!(
        o.slowed_ms[1] > 0,
        "the reader ahead was paced: {:?}",
        o.slowed_ms
    );
    assert!(
        o.slowed_ms[1] <= bound + LONG_POLL_MS,
        "slowed {} ms",
        o.slowed_ms[1]
    );
    let far = simulate(&[0.0, 0.9], bounded, None);
    report("out of reach", &far);
    // Held only until the lead's rate was measured (a rate sample and a
    // long poll), then let go: the lead cannot reach it within the bound.
    assert!(
        far.slowed_ms[1] <= 500,
        "slowed {} ms out of reach",
        far.slowed_ms[1]
    );
}

/// A reader within a window of the tail is a live one, even where the
/// tail cache does not hold its offsets: never paced, however far behind
/// the lead is.
#[test]
fn a_reader_near_the_tail_is_never_paced() {
    let o = simulate(&[0.0, 0.99], settings(), None);
    report("near the tail", &o);
    assert_eq!(o.slowed_ms[1], 0, "the reader near the tail was paced");
}
