//! The broker's levels and counters for `/metrics`, read when scraped:
//! the tail cache, cold reads, the I/O classes, the tiers, the mover, the
//! cleaner, groups, partitions and the log dir. The request metrics are
//! `crate::metrics`'s.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use keel_tier::IoClass;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Broker;

impl Broker {
    /// Everything `/metrics` serves, in the Prometheus / OpenMetrics text
    /// format. Reads each partition's page-cache residency: call it on a
    /// blocking thread.
    pub fn metrics_text(&self) -> String {
        self.metrics.encode(&state_registry(self))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ApiLabels {
    api: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct IoLabels {
    class: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LiveLabels {
    op: &'static str,
    quantile: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TierLabels {
    tier: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PartitionLabels {
    topic: String,
    partition: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DirLabels {
    dir: String,
}

/// The broker's own counters and levels, read now.
pub(crate) fn state_registry(broker: &Broker) -> Registry {
    let mut r = Registry::default();
    register_levels(&mut r, broker);
    register_counters(&mut r, broker);
    register_io(&mut r, broker);
    register_groups(&mut r, broker);
    register_cluster(&mut r, broker);
    register_wal(&mut r, broker);
    register_partitions(&mut r, broker);
    let dirs = Family::<DirLabels, Gauge>::default();
    dirs.get_or_create(&DirLabels {
        dir: broker.data.dir_health.path().display().to_string(),
    })
    .set(i64::from(broker.data.dir_health.is_offline()));
    r.register("keel_log_dir_offline", "1 if the log dir is offline", dirs);
    r
}

/// The tail cache's, cold reads' and the mover's levels.
fn register_levels(r: &mut Registry, broker: &Broker) {
    let t = broker.data.tail_cache.stats();
    let c = broker.data.cold.stats();
    let scan = broker.data.cold.scan_pool().stats();
    let m = &broker.data.mover;
    let gauges: [(&str, &str, f64); 12] = [
        (
            "keel_tail_cache_budget_bytes",
            "Tail cache budget",
            t.budget_bytes as f64,
        ),
        (
            "keel_tail_cache_used_bytes",
            "Bytes in the tail cache",
            t.used_bytes as f64,
        ),
        (
            "keel_tail_cache_batches",
            "Batches in the tail cache",
            t.cached_batches as f64,
        ),
        (
            "keel_cold_read_queue_depth",
            "Cold reads waiting for a slot or for budget",
            c.queue_depth as f64,
        ),
        (
            "keel_cold_read_budget_bytes_per_second",
            "keel.cold.read.bytes.per.sec (0: unlimited)",
            c.budget_bytes_per_sec as f64,
        ),
        (
            "keel_scan_buffer_held_bytes",
            "Bytes held in the scan buffer for readers behind the read that took them",
            scan.held_bytes as f64,
        ),
        (
            "keel_scan_buffer_limit_bytes",
            "The scan buffer's limit",
            scan.limit_bytes as f64,
        ),
        (
            "keel_mover_fast_bytes",
            "Bytes in the fast (local) tier",
            m.fast_bytes.load(Relaxed) as f64,
        ),
        (
            "keel_mover_fast_max_bytes",
            "The fast tier's budget (keel.tier.fast.max.bytes, -1: none)",
            m.fast_max_bytes() as f64,
        ),
        (
            "keel_mover_move_bytes_per_second",
            "keel.tier.move.bytes.per.sec",
            broker.data.io.ceiling(IoClass::TierMove) as f64,
        ),
        (
            "keel_mover_reader_holds",
            "Partitions whose oldest local segment the mover keeps on the fast tier for a reader",
            m.reader_holds.load(Relaxed) as f64,
        ),
        (
            "keel_mover_reader_held_bytes",
            "Bytes of those segments",
            m.reader_held_bytes.load(Relaxed) as f64,
        ),
    ];
    for (name, help, value) in gauges {
        let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        g.set(value);
        r.register(name, help, g);
    }
}

/// What the tail cache, cold reads, the tiers, the mover and the cleaner
/// have done since start-up.
fn register_counters(r: &mut Registry, broker: &Broker) {
    let counters = read_counters(broker).into_iter().chain(tier_counters(broker));
    let c = broker.data.cold.stats();
    for (name, help, value) in counters {
        let c = Counter::<u64>::default();
        c.inc_by(value);
        r.register(name, help, c);
    }
    let seconds: [(&str, &str, u64); 2] = [
        (
            "keel_cold_read_wait_seconds",
            "Time cold reads waited before their I/O started",
            c.wait_us_total,
        ),
        (
            "keel_cold_read_throttled_seconds",
            "Time cold reads waited for the byte budget alone",
            c.throttled_us_total,
        ),
    ];
    for (name, help, micros) in seconds {
        let c = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        c.inc_by(Duration::from_micros(micros).as_secs_f64());
        r.register(name, help, c);
    }
}

/// The tail cache's and cold reads' counters: name, help, value.
fn read_counters(broker: &Broker) -> Vec<(&'static str, &'static str, u64)> {
    let t = broker.data.tail_cache.stats();
    let c = broker.data.cold.stats();
    let scan = broker.data.cold.scan_pool().stats();
    vec![
        (
            "keel_tail_cache_inserted_bytes",
            "Bytes put in the tail cache",
            t.inserted_bytes,
        ),
        (
            "keel_tail_cache_evicted_bytes",
            "Bytes evicted from the tail cache",
            t.evicted_bytes,
        ),
        (
            "keel_tail_cache_hit_reads",
            "Fetch reads answered from the tail cache",
            t.hit_reads,
        ),
        (
            "keel_tail_cache_hit_bytes",
            "Bytes answered from the tail cache",
            t.hit_bytes,
        ),
        (
            "keel_tail_cache_miss_reads",
            "Fetch reads the tail cache could not answer",
            t.miss_reads,
        ),
        (
            "keel_cold_reads",
            "Reads of log files on the cold-read executor",
            c.reads,
        ),
        ("keel_cold_read_bytes", "Bytes cold reads returned", c.bytes),
        (
            "keel_cold_read_disk_bytes",
            "Bytes cold reads took from the disk",
            c.disk_bytes,
        ),
        (
            "keel_scan_hits",
            "Fetches below the tail cache answered without a read of their own",
            scan.hits,
        ),
        (
            "keel_scan_served_bytes",
            "Bytes those fetches got",
            scan.served_bytes,
        ),
        (
            "keel_scan_shared_bytes",
            "Bytes fetches got from another reader's read",
            scan.shared_bytes,
        ),
        (
            "keel_scan_paced_fetches",
            "Fetches answered without data while their reader was paced behind a lead",
            scan.paced,
        ),
    ]
}

/// The colder tiers', the mover's and the cleaner's counters.
fn tier_counters(broker: &Broker) -> Vec<(&'static str, &'static str, u64)> {
    let s = broker.data.tiers.stats();
    let (m, cl) = (&broker.data.mover, &broker.data.cleaner);
    vec![
        ("keel_tier_copies", "Segments copied to a colder tier", s.copies),
        (
            "keel_tier_copied_bytes",
            "Bytes copied to colder tiers",
            s.copied_bytes,
        ),
        (
            "keel_tier_copy_failures",
            "Failed copies to a colder tier",
            s.copy_failures,
        ),
        ("keel_tier_reads", "Reads of colder tiers", s.reads),
        (
            "keel_tier_read_bytes",
            "Bytes read from colder tiers",
            s.read_bytes,
        ),
        (
            "keel_tier_read_failures",
            "Failed reads of colder tiers",
            s.read_failures,
        ),
        ("keel_tier_deletes", "Copies deleted from colder tiers", s.deletes),
        (
            "keel_mover_released_segments",
            "Local segments released after their colder copy",
            m.released_segments.load(Relaxed),
        ),
        (
            "keel_mover_released_bytes",
            "Local bytes released",
            m.released_bytes.load(Relaxed),
        ),
        (
            "keel_mover_passes",
            "Mover passes finished, failed ones included",
            m.passes.load(Relaxed),
        ),
        (
            "keel_mover_reader_hold_overrides",
            "Segments released although a reader was about to read them (the fast tier too far over its budget, or its filesystem low)",
            m.reader_hold_overrides.load(Relaxed),
        ),
        (
            "keel_mover_held_read_bytes",
            "Bytes fetches read from segments kept on the fast tier for readers: colder-tier reads saved",
            keel_data::mover::held_read_bytes(&broker.data),
        ),
        (
            "keel_mover_failed_passes",
            "Mover passes that failed",
            m.failed_passes.load(Relaxed),
        ),
        (
            "keel_mover_partitions_set_aside",
            "Partitions mover passes left alone because their log was unavailable (once per pass)",
            m.partitions_set_aside.load(Relaxed),
        ),
        (
            "keel_cleaner_passes",
            "Compaction passes",
            cl.passes.load(Relaxed),
        ),
        (
            "keel_cleaner_failed_passes",
            "Compaction passes that failed",
            cl.failed_passes.load(Relaxed),
        ),
        (
            "keel_cleaner_read_bytes",
            "Bytes compaction read",
            cl.bytes_read.load(Relaxed),
        ),
        (
            "keel_cleaner_written_bytes",
            "Bytes compaction wrote",
            cl.bytes_written.load(Relaxed),
        ),
        (
            "keel_cleaner_reclaimed_bytes",
            "Bytes compaction reclaimed",
            cl.bytes_reclaimed.load(Relaxed),
        ),
    ]
}

/// Each I/O class's budget, bytes and time waited for its budget; the
/// live path's latency and the I/O governor.
fn register_io(r: &mut Registry, broker: &Broker) {
    let ceiling = Family::<IoLabels, Gauge>::default();
    let live = Family::<LiveLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    for op in keel_tier::LiveOp::ALL {
        let q = broker.data.io.live().window(op, crate::broker::LIVE_WINDOW);
        for (quantile, us) in [("0.5", q.p50_us), ("0.99", q.p99_us), ("0.999", q.p999_us)] {
            live.get_or_create(&LiveLabels {
                op: op.name(),
                quantile,
            })
            .set(us as f64 / 1e6);
        }
    }
    r.register(
        "keel_io_live_latency_seconds",
        "The live path's latency as the broker sees it (produce; fetches answered from the tail cache, without their long poll), quantiles over the last 10 s (0 without requests)",
        live,
    );
    let governor = broker.data.io.governor_stats();
    let target = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    target.set(governor.target.map_or(0.0, |t| t.as_secs_f64()));
    r.register(
        "keel_io_live_latency_target_seconds",
        "keel.io.live.latency.target.ms, the I/O governor's target (0: off)",
        target,
    );
    let cuts = Counter::<u64>::default();
    cuts.inc_by(governor.cuts);
    r.register(
        "keel_io_governor_cuts",
        "Times the I/O governor cut the background budgets for a live p99 over its target",
        cuts,
    );
    let budget = Family::<IoLabels, Gauge>::default();
    let bytes = Family::<IoLabels, Counter>::default();
    let throttled = Family::<IoLabels, Counter<f64, std::sync::atomic::AtomicU64>>::default();
    for stats in broker.data.io.stats() {
        let labels = IoLabels {
            class: stats.class.name(),
        };
        budget
            .get_or_create(&labels)
            .set(i64::try_from(stats.budget_bytes_per_sec).unwrap_or(i64::MAX));
        ceiling
            .get_or_create(&labels)
            .set(i64::try_from(stats.ceiling_bytes_per_sec).unwrap_or(i64::MAX));
        bytes.get_or_create(&labels).inc_by(stats.bytes);
        throttled
            .get_or_create(&labels)
            .inc_by(stats.throttled_us as f64 / 1e6);
    }
    r.register(
        "keel_io_budget_bytes_per_second",
        "An I/O class's byte budget in force (0: unlimited; the live path is never paced): its ceiling, or what the I/O governor set below it",
        budget,
    );
    r.register(
        "keel_io_budget_ceiling_bytes_per_second",
        "An I/O class's budget as set (0: unlimited): the ceiling of the budget the I/O governor sets",
        ceiling,
    );
    r.register(
        "keel_io_bytes",
        "Bytes an I/O class read or wrote (live: appended)",
        bytes,
    );
    r.register(
        "keel_io_throttled_seconds",
        "Time an I/O class waited for its byte budget",
        throttled,
    );
}

/// This broker's view of the cluster.
fn register_cluster(r: &mut Registry, broker: &Broker) {
    let c = &broker.cluster;
    let gauges: [(&str, &str, i64); 4] = [
        (
            "keel_cluster_brokers",
            "Live brokers this broker sees",
            c.members().len() as i64,
        ),
        (
            "keel_cluster_controller_id",
            "The elected controller's node id (-1: none)",
            c.controller().map_or(-1, |c| i64::from(c.node_id)),
        ),
        (
            "keel_cluster_broker_epoch",
            "This broker's epoch (-1: not registered)",
            c.broker_epoch(),
        ),
        (
            "keel_cluster_fenced",
            "1 while this broker cannot confirm its session",
            i64::from(c.is_fenced()),
        ),
    ];
    for (name, help, value) in gauges {
        let g = Gauge::<i64>::default();
        g.set(value);
        r.register(name, help, g);
    }
    if !broker.topics_shared() {
        return;
    }
    let (mut led, mut leaderless) = (0i64, 0i64);
    let me = c.me().node_id;
    for topic in broker.data.topics.all() {
        for p in &topic.partitions {
            match broker.data.leader(&topic, p.index) {
                Some(l) if l.node_id == me => led += 1,
                Some(_) => {}
                None => leaderless += 1,
            }
        }
    }
    for (name, help, value) in [
        ("keel_cluster_partitions_led", "Partitions this broker leads", led),
        (
            "keel_cluster_partitions_leaderless",
            "Partitions without a live leader, as this broker sees them",
            leaderless,
        ),
    ] {
        let g = Gauge::<i64>::default();
        g.set(value);
        r.register(name, help, g);
    }
    let changes = Counter::<u64>::default();
    changes.inc_by(c.leader_changes());
    r.register(
        "keel_cluster_leader_changes",
        "Partition leader changes this broker made as controller",
        changes,
    );
    coordinator_log_metrics(
        r,
        "group",
        "__consumer_offsets",
        "groups",
        &broker.group_log.loaded(),
        &broker.group_log.stats,
    );
    coordinator_log_metrics(
        r,
        "txn",
        "__transaction_state",
        "transactional ids",
        &broker.txn_log.loaded(),
        &broker.txn_log.stats,
    );
    let (requests, failures) = (
        Family::<ApiLabels, Counter>::default(),
        Family::<ApiLabels, Counter>::default(),
    );
    for (api, n, failed) in broker.peer_stats.snapshot() {
        requests.get_or_create(&ApiLabels { api: api.clone() }).inc_by(n);
        failures.get_or_create(&ApiLabels { api }).inc_by(failed);
    }
    r.register(
        "keel_cluster_peer_requests",
        "Requests this broker sent other brokers (transaction markers, a transaction's partitions), by API",
        requests,
    );
    r.register(
        "keel_cluster_peer_request_failures",
        "Requests to other brokers that got no answer (unreachable, cut or timed out), by API",
        failures,
    );
}

/// A cluster's WAL: objects written to the object store and their
/// commits (see `keel_data::wal`).
fn register_wal(r: &mut Registry, broker: &Broker) {
    let Some(wal) = &broker.data.wal else {
        return;
    };
    let w = &wal.stats;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let counters = [
        (
            "keel_cluster_wal_objects",
            "WAL objects written to the object store",
            &w.objects,
        ),
        (
            "keel_cluster_wal_bytes",
            "Bytes of WAL objects written to the object store",
            &w.bytes,
        ),
        (
            "keel_cluster_wal_write_failures",
            "WAL object writes the object store failed (each retried)",
            &w.write_failures,
        ),
        (
            "keel_cluster_wal_commit_failures",
            "WAL commits the coordination store did not answer (each retried)",
            &w.commit_failures,
        ),
        (
            "keel_cluster_wal_fenced_groups",
            "Written groups never committed: their partition's leadership term ended first",
            &w.fenced_groups,
        ),
        (
            "keel_cluster_wal_collected_objects",
            "WAL objects this broker deleted as controller: every range below sealed segments, or of deleted topics",
            &w.collected_objects,
        ),
        (
            "keel_cluster_wal_collected_orphans",
            "WAL objects no commit named (written, never committed), deleted by this broker as controller an hour after their write",
            &w.collected_orphans,
        ),
        (
            "keel_cluster_wal_collected_bytes",
            "Bytes of the WAL objects this broker deleted as controller",
            &w.collected_bytes,
        ),
        (
            "keel_cluster_wal_collected_keys",
            "Coordination store keys this broker deleted as controller (WAL indexes, deleted topics' commits and segments)",
            &w.collected_keys,
        ),
    ];
    for (name, help, value) in counters {
        let c = Counter::<u64>::default();
        c.inc_by(load(value));
        r.register(name, help, c);
    }
    let seconds = [
        (
            "keel_cluster_wal_write_seconds",
            "Time spent writing WAL objects to the object store (successful writes)",
            &w.write_nanos,
        ),
        (
            "keel_cluster_wal_commit_seconds",
            "Time spent committing WAL objects in the coordination store",
            &w.commit_nanos,
        ),
    ];
    for (name, help, value) in seconds {
        let c = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        c.inc_by(load(value) as f64 / 1e9);
        r.register(name, help, c);
    }
    let unwritten = Gauge::<i64>::default();
    unwritten.set(i64::try_from(wal.unwritten_bytes()).unwrap_or(i64::MAX));
    r.register(
        "keel_cluster_wal_pending_bytes",
        "Bytes written by partitions and not yet committed",
        unwritten,
    );
}

/// Groups by state.
fn register_groups(r: &mut Registry, broker: &Broker) {
    let groups = Family::<StateLabels, Gauge>::default();
    for state in [
        "Empty",
        "PreparingRebalance",
        "CompletingRebalance",
        "Stable",
        "Dead",
        "Reconciling",
    ] {
        let _ = groups.get_or_create(&StateLabels { state });
    }
    for (_, _, state) in broker.groups.list() {
        groups.get_or_create(&StateLabels { state: state.name() }).inc();
    }
    // Consumer-protocol groups (KIP-848) share Empty and Stable.
    for (_, state) in broker.groups.list_consumer() {
        groups.get_or_create(&StateLabels { state: state.name() }).inc();
    }
    r.register("keel_groups", "Consumer groups, by state", groups);
}

/// Each partition's size, offsets, page-cache residency and health, and
/// the bytes in each colder tier.
fn register_partitions(r: &mut Registry, broker: &Broker) {
    let tiers = Family::<TierLabels, Gauge>::default();
    for tier in [keel_log::Tier::Capacity, keel_log::Tier::Remote] {
        let _ = tiers.get_or_create(&TierLabels { tier: tier.name() });
    }
    let partitions_offline = Family::<PartitionLabels, Gauge>::default();
    let size = Family::<PartitionLabels, Gauge>::default();
    let end = Family::<PartitionLabels, Gauge>::default();
    let start = Family::<PartitionLabels, Gauge>::default();
    let resident = Family::<PartitionLabels, Gauge>::default();
    let mut resident_total = 0u64;
    for topic in broker.data.topics.all() {
        for p in &topic.partitions {
            let labels = PartitionLabels {
                topic: topic.meta.name.clone(),
                partition: p.index.to_string(),
            };
            let (in_cache, _) = p.page_cache_residency();
            resident_total += in_cache;
            resident.get_or_create(&labels).set(in_cache as i64);
            end.get_or_create(&labels).set(p.high_watermark());
            start.get_or_create(&labels).set(p.log_start_offset());
            partitions_offline
                .get_or_create(&labels)
                .set(i64::from(p.unavailable().is_some()));
            if let Some(reader) = p.reader() {
                size.get_or_create(&labels).set(reader.total_bytes() as i64);
                for t in reader.tiered_segments().iter().filter(|t| t.is_cold()) {
                    tiers
                        .get_or_create(&TierLabels { tier: t.tier.name() })
                        .inc_by(t.size_bytes as i64);
                }
            }
        }
    }
    r.register("keel_log_size_bytes", "A partition's bytes in every tier", size);
    r.register(
        "keel_log_end_offset",
        "A partition's log end offset (high watermark)",
        end,
    );
    r.register("keel_log_start_offset", "A partition's log start offset", start);
    r.register(
        "keel_partition_offline",
        "1 if the partition cannot serve",
        partitions_offline,
    );
    r.register(
        "keel_page_cache_resident_bytes",
        "A partition's segment bytes in the page cache",
        resident,
    );
    let all = Gauge::<i64>::default();
    all.set(resident_total as i64);
    r.register(
        "keel_page_cache_resident_bytes_all",
        "Segment bytes in the page cache, all partitions",
        all,
    );
    r.register(
        "keel_tier_bytes",
        "Bytes whose only copy is in a colder tier, by tier",
        tiers,
    );
}

/// A cluster's coordinator log's metrics: `keel_cluster_<what>_partitions`
/// and its `_loads`, `_snapshots`, `_write_failures` and `_reloads`.
fn coordinator_log_metrics(
    r: &mut Registry,
    what: &str,
    topic: &str,
    keys: &str,
    loaded: &[i32],
    stats: &super::coord_log::CoordinatorLogStats,
) {
    let partitions = Gauge::<i64>::default();
    partitions.set(i64::try_from(loaded.len()).unwrap_or(i64::MAX));
    r.register(
        format!("keel_cluster_{what}_partitions"),
        format!("Partitions of {topic} whose {keys} this broker coordinates"),
        partitions,
    );
    for (name, help, value) in [
        (
            "loads",
            format!("Partitions of {topic} this broker loaded (their {keys} read from their log)"),
            &stats.loads,
        ),
        (
            "snapshots",
            format!("Snapshots this broker wrote to partitions of {topic}"),
            &stats.snapshots,
        ),
        (
            "write_failures",
            format!("Writes to partitions of {topic} that failed (answered COORDINATOR_NOT_AVAILABLE)"),
            &stats.write_failures,
        ),
        (
            "reloads",
            format!("Partitions of {topic} read again from their log after a failed write"),
            &stats.reloads,
        ),
    ] {
        let counter = Counter::<u64>::default();
        counter.inc_by(value.load(std::sync::atomic::Ordering::Relaxed));
        r.register(format!("keel_cluster_{what}_{name}"), help, counter);
    }
}
