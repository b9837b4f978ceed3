//! The tail cache under concurrent appends and tail reads: what readers of
//! some partitions wait for while others append (and evict).
//!
//! ```sh
//! cargo bench -p keel-tier --bench tail_cache
//! ```
//!
//! 64 partitions, a 32 MiB budget, 16 KiB batches (so appends evict
//! once the cache is full). Writer threads append to their own
//! partitions; reader threads read the newest batch of random partitions,
//! as caught-up consumers do. Each thread count runs 2 s. Prints a
//! Markdown table: appends/s and their p99/max, reads/s and their
//! p50/p99/max (every 16th append and read timed).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel_tier::TailCache;
use rand::{Rng, SeedableRng};

const PARTITIONS: usize = 64;
const BATCH: usize = 16 * 1024;
const RUN: Duration = Duration::from_secs(2);

struct Outcome {
    appends: u64,
    reads: u64,
    append_ns: Vec<u64>,
    read_ns: Vec<u64>,
}

fn run(writers: usize, readers: usize) -> Outcome {
    let cache = TailCache::new(32 << 20);
    let parts: Arc<Vec<_>> = Arc::new((0..PARTITIONS).map(|_| cache.partition()).collect());
    let ends: Arc<Vec<AtomicI64>> = Arc::new((0..PARTITIONS).map(|_| AtomicI64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let payload = Bytes::from(vec![7u8; BATCH]);
    let mut handles = Vec::new();
    for w in 0..writers {
        let (parts, ends, stop, payload) = (
            Arc::clone(&parts),
            Arc::clone(&ends),
            Arc::clone(&stop),
            payload.clone(),
        );
        handles.push(std::thread::spawn(move || {
            let (mut n, mut timed) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                for p in (w..PARTITIONS).step_by(writers) {
                    let base = ends[p].load(Ordering::Relaxed);
                    let start = Instant::now();
                    parts[p].insert([(base, base + 9, payload.clone())]);
                    if n % 16 == 0 {
                        timed.push(start.elapsed().as_nanos() as u64);
                    }
                    ends[p].store(base + 10, Ordering::Release);
                    n += 1;
                }
            }
            Outcome {
                appends: n,
                reads: 0,
                append_ns: timed,
                read_ns: Vec::new(),
            }
        }));
    }
    for r in 0..readers {
        let (parts, ends, stop) = (Arc::clone(&parts), Arc::clone(&ends), Arc::clone(&stop));
        handles.push(std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(r as u64);
            let (mut n, mut timed) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let p = rng.gen_range(0..PARTITIONS);
                let end = ends[p].load(Ordering::Acquire);
                if end == 0 {
                    continue;
                }
                let start = Instant::now();
                std::hint::black_box(parts[p].read(end - 10, end, 1 << 20));
                if n % 16 == 0 {
                    timed.push(start.elapsed().as_nanos() as u64);
                }
                n += 1;
            }
            Outcome {
                appends: 0,
                reads: n,
                append_ns: Vec::new(),
                read_ns: timed,
            }
        }));
    }
    std::thread::sleep(RUN);
    stop.store(true, Ordering::Relaxed);
    let mut total = Outcome {
        appends: 0,
        reads: 0,
        append_ns: Vec::new(),
        read_ns: Vec::new(),
    };
    for h in handles {
        let o = h.join().expect("bench thread");
        total.appends += o.appends;
        total.reads += o.reads;
        total.append_ns.extend(o.append_ns);
        total.read_ns.extend(o.read_ns);
    }
    total.append_ns.sort_unstable();
    total.read_ns.sort_unstable();
    total
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1_000.0
}

fn main() {
    println!("| writers | readers | appends/s | append p99 (µs) | append max (µs) | reads/s | read p50 (µs) | read p99 (µs) | read max (µs) |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (writers, readers) in [(1, 1), (1, 3), (2, 2), (2, 6)] {
        let o = run(writers, readers);
        let secs = RUN.as_secs_f64();
        println!(
            "| {writers} | {readers} | {:.0} | {:.2} | {:.0} | {:.0} | {:.2} | {:.2} | {:.0} |",
            o.appends as f64 / secs,
            pct(&o.append_ns, 0.99),
            pct(&o.append_ns, 1.0),
            o.reads as f64 / secs,
            pct(&o.read_ns, 0.50),
            pct(&o.read_ns, 0.99),
            pct(&o.read_ns, 1.0),
        );
    }
}
