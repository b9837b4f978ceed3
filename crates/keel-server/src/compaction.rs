//! `keel compaction plan`: the passes, reads, writes, time and disk a
//! compacted topic's cleaning takes, for Keel's cleaner and Kafka's, from
//! a described workload or a scan of a topic's partition directories. The
//! model and the scan are `keel_log::plan`; this is its front end.

use std::fmt::Write as _;
use std::path::PathBuf;

use keel_log::plan::{scan_partition, CleanerBudget, PartitionScan, Section, Shape, TopicPlan, Workload};
use serde_json::{json, Value};

use crate::stats::{aligned_table, bytes};

#[derive(clap::Args, Debug)]
pub struct CompactionArgs {
    #[command(subcommand)]
    pub command: CompactionCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum CompactionCommand {
    /// Plan the cleaning of a compacted topic: passes, bytes read and
    /// written, time at the I/O budget and disk to provision, for Keel and
    /// for Kafka. Describe the workload (--keys, --record-bytes, ...) or
    /// scan an existing topic (--topic with --data-dir).
    Plan(PlanArgs),
}

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// Scan this topic's partition directories (read-only; the broker may
    /// be running) instead of describing a workload.
    #[arg(long, requires = "data_dir")]
    pub topic: Option<String>,
    /// A `log.dirs` directory holding the topic's partitions (repeat for
    /// several).
    #[arg(long = "data-dir", value_name = "DIR")]
    pub data_dir: Vec<PathBuf>,
    /// A `keel.tier.capacity.dirs` directory, for segments whose only copy
    /// is in the capacity tier (repeat for several).
    #[arg(long = "capacity-dir", value_name = "DIR")]
    pub capacity_dir: Vec<PathBuf>,
    /// Distinct keys in the whole topic (1600000000, 1.6e9 or 1.6G).
    #[arg(long, value_parser = parse_count, required_unless_present = "topic")]
    pub keys: Option<f64>,
    /// Mean bytes per record on disk, batch overhead included (5000, 5kB,
    /// 4KiB).
    #[arg(long, value_parser = parse_bytes, required_unless_present = "topic")]
    pub record_bytes: Option<u64>,
    #[arg(long, default_value_t = 1)]
    pub partitions: u32,
    /// How the dirty part arises: `steady` (updates spread over the keys)
    /// or `republish` (a bulk load of every key, then every key again).
    #[arg(long, default_value = "steady", value_parser = ["steady", "republish"])]
    pub shape: String,
    /// With `republish`: the share of the bulk load not cleaned yet when
    /// the republish starts (default: --dirty-ratio, the most it can be).
    #[arg(long)]
    pub uncleaned: Option<f64>,
    /// Updates per second to the whole topic (steady state: whether the
    /// cleaner keeps up).
    #[arg(long, value_parser = parse_count)]
    pub update_rate: Option<f64>,
    /// The topic's `min.cleanable.dirty.ratio`.
    #[arg(long, default_value_t = 0.5)]
    pub dirty_ratio: f64,
    /// `log.cleaner.dedupe.buffer.size`.
    #[arg(long, value_parser = parse_bytes, default_value = "128MiB")]
    pub map_bytes: u64,
    /// `log.cleaner.threads`.
    #[arg(long, default_value_t = 1)]
    pub threads: u32,
    /// `log.cleaner.io.max.bytes.per.second` (0: unlimited).
    #[arg(long, value_parser = parse_bytes, default_value = "50MiB")]
    pub io_bytes_per_sec: u64,
    /// The topic's `segment.bytes`.
    #[arg(long, value_parser = parse_bytes, default_value = "1GiB")]
    pub segment_bytes: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &CompactionArgs) -> Result<(), String> {
    let CompactionCommand::Plan(plan_args) = &args.command;
    let text = plan(plan_args)?;
    print!("{text}");
    if !text.ends_with('\n') {
        println!();
    }
    Ok(())
}

/// The plan's text (a table, or JSON with `--json`).
pub fn plan(args: &PlanArgs) -> Result<String, String> {
    if !(0.0..1.0).contains(&args.dirty_ratio) {
        return Err(format!(
            "--dirty-ratio must be in [0, 1), not {}",
            args.dirty_ratio
        ));
    }
    let budget = CleanerBudget {
        dedupe_buffer_bytes: args.map_bytes,
        threads: args.threads.max(1),
        io_bytes_per_sec: (args.io_bytes_per_sec > 0).then_some(args.io_bytes_per_sec),
        segment_bytes: args.segment_bytes,
    };
    let (subject, sections, live_keys, workload, scans) = match &args.topic {
        Some(topic) => {
            let scans = scan_topic(topic, &args.data_dir, &args.capacity_dir)?;
            let sections: Vec<Section> = scans.iter().map(|(_, s)| s.section()).collect();
            let live: f64 = scans.iter().map(|(_, s)| s.keys).sum();
            (format!("topic {topic} as scanned"), sections, live, None, scans)
        }
        None => {
            let w = workload(args)?;
            let section = w.section();
            let subject = format!(
                "{} keys of {} in {} partition(s), {}",
                count(w.keys),
                bytes(Some(w.record_bytes as u64)),
                w.partitions,
                match w.shape {
                    Shape::Steady => format!("steady updates, cleaned at dirty ratio {}", w.dirty_ratio),
                    Shape::Republish { uncleaned } => format!(
                        "bulk load ({:.0}% uncleaned) then a full republish",
                        uncleaned * 100.0
                    ),
                }
            );
            let sections = vec![section; w.partitions.max(1) as usize];
            (subject, sections, w.keys, Some(w), Vec::new())
        }
    };
    let plan = TopicPlan::new(&sections, live_keys, &budget);
    let share = workload.as_ref().and_then(|w| plan.budget_share(w, &budget));
    Ok(if args.json {
        let mut v = to_json(&plan, &budget, share);
        v["subject"] = json!(subject);
        if !scans.is_empty() {
            v["scanned"] = scans
                .iter()
                .map(|(p, s)| {
                    json!({"partition": p, "records": s.records, "bytes": s.bytes,
                           "clean_records": s.clean_records, "active_records": s.active_records,
                           "keys": s.keys, "dirty_keys": s.dirty_keys, "segments": s.segments})
                })
                .collect();
        }
        format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default())
    } else {
        render(&subject, &plan, &budget, share, workload.is_some())
    })
}

fn workload(args: &PlanArgs) -> Result<Workload, String> {
    let keys = args.keys.ok_or("--keys is required without --topic")?;
    let record_bytes = args
        .record_bytes
        .ok_or("--record-bytes is required without --topic")?;
    if keys < 1.0 || record_bytes == 0 || args.partitions == 0 {
        return Err("--keys, --record-bytes and --partitions must be positive".into());
    }
    let shape = match args.shape.as_str() {
        "republish" => Shape::Republish {
            uncleaned: args.uncleaned.unwrap_or(args.dirty_ratio).clamp(0.0, 1.0),
        },
        _ => Shape::Steady,
    };
    Ok(Workload {
        keys,
        partitions: args.partitions,
        record_bytes: record_bytes as f64,
        shape,
        dirty_ratio: args.dirty_ratio,
        updates_per_sec: args.update_rate,
    })
}

/// Every `<topic>-<n>` directory in `dirs`, scanned, by partition.
fn scan_topic(
    topic: &str,
    dirs: &[PathBuf],
    capacity: &[PathBuf],
) -> Result<Vec<(u32, PartitionScan)>, String> {
    let mut found: Vec<(u32, PathBuf)> = Vec::new();
    for dir in dirs {
        let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            let partition = name
                .strip_prefix(topic)
                .and_then(|rest| rest.strip_prefix('-'))
                .and_then(|n| n.parse::<u32>().ok());
            if let Some(p) = partition.filter(|_| e.path().is_dir()) {
                found.push((p, e.path()));
            }
        }
    }
    if found.is_empty() {
        return Err(format!(
            "no partition directory of topic {topic} in {}",
            show(dirs)
        ));
    }
    found.sort();
    found
        .into_iter()
        .map(|(p, dir)| {
            scan_partition(&dir, capacity)
                .map(|s| (p, s))
                .map_err(|e| format!("{}: {e}", dir.display()))
        })
        .collect()
}

fn show(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn render(subject: &str, plan: &TopicPlan, budget: &CleanerBudget, share: Option<f64>, same: bool) -> String {
    let mut out = String::new();
    let io = budget
        .io_bytes_per_sec
        .map_or("unlimited".into(), |b| format!("{}/s", bytes(Some(b))));
    let _ = writeln!(out, "workload   {subject}");
    let _ = writeln!(
        out,
        "cleaner    map {} / {} thread(s): Keel {} keys a pass (16 B/key), Kafka {} (24 B/key at load 0.9); I/O budget {io}\n",
        bytes(Some(budget.dedupe_buffer_bytes)),
        budget.threads,
        count(plan.keel_map_keys as f64),
        count(plan.kafka_map_keys as f64),
    );
    // A described workload has identical partitions: one row stands for all.
    let rows: Vec<Vec<String>> = plan
        .partitions
        .iter()
        .enumerate()
        .take(if same { 1 } else { usize::MAX })
        .map(|(i, (s, keel, kafka))| {
            vec![
                if same { "each".into() } else { i.to_string() },
                count(s.clean + s.dirty),
                count(s.dirty_keys),
                keel.passes.to_string(),
                format!("{} ({} reclaim 0)", kafka.passes, kafka.barren_passes),
                fbytes(keel.bytes_read),
                fbytes(kafka.bytes_read),
                format!("{} -> {}", fbytes(keel.bytes_before), fbytes(keel.bytes_after)),
            ]
        })
        .collect();
    out.push_str(&aligned_table(
        &[
            "partition",
            "records",
            "dirty keys",
            "Keel passes",
            "Kafka passes",
            "Keel reads",
            "Kafka reads",
            "size",
        ],
        &rows,
        &[0, 4, 7],
    ));
    let time = |s: Option<f64>| s.map_or("-".into(), duration);
    let _ = writeln!(
        out,
        "\nall partitions\n  reads       Keel {} in {} at the budget; Kafka {} in {}",
        fbytes(plan.keel_bytes_read),
        time(plan.keel_seconds),
        fbytes(plan.kafka_bytes_read),
        time(plan.kafka_seconds),
    );
    let _ = writeln!(out, "  writes      Keel {}", fbytes(plan.keel_bytes_written));
    let _ = writeln!(
        out,
        "  disk        compacted {}, peak {} (the dirty part before its clean, and one cleaned segment group per thread): provision {} of headroom",
        fbytes(plan.compacted_bytes),
        fbytes(plan.peak_bytes),
        fbytes(plan.headroom_bytes()),
    );
    if let Some(share) = share {
        let verdict = if share <= 1.0 { "keeps up" } else { "falls behind" };
        let _ = writeln!(
            out,
            "  steady      the cleaner {verdict}: it needs {:.1}% of log.cleaner.io.max.bytes.per.second",
            share * 100.0
        );
    }
    out
}

fn to_json(plan: &TopicPlan, budget: &CleanerBudget, share: Option<f64>) -> Value {
    let cost = |c: &keel_log::plan::CleanCost| {
        json!({"passes": c.passes, "passes_reclaiming_nothing": c.barren_passes,
               "bytes_read": c.bytes_read, "bytes_written": c.bytes_written,
               "bytes_reclaimed": c.bytes_reclaimed, "bytes_before": c.bytes_before,
               "bytes_after": c.bytes_after, "bytes_reclaimed_per_pass": c.reclaimed_per_pass})
    };
    json!({
        "cleaner": {"dedupe_buffer_bytes": budget.dedupe_buffer_bytes, "threads": budget.threads,
                    "io_bytes_per_sec": budget.io_bytes_per_sec, "segment_bytes": budget.segment_bytes,
                    "keel_map_keys": plan.keel_map_keys, "kafka_map_keys": plan.kafka_map_keys},
        "partitions": plan.partitions.iter().enumerate().map(|(i, (s, keel, kafka))| json!({
            "partition": i, "clean_records": s.clean, "dirty_records": s.dirty,
            "dirty_keys": s.dirty_keys, "record_bytes": s.record_bytes,
            "keel": cost(keel), "kafka": cost(kafka)})).collect::<Vec<_>>(),
        "keel_bytes_read": plan.keel_bytes_read,
        "kafka_bytes_read": plan.kafka_bytes_read,
        "keel_bytes_written": plan.keel_bytes_written,
        "keel_seconds": plan.keel_seconds,
        "kafka_seconds": plan.kafka_seconds,
        "compacted_bytes": plan.compacted_bytes,
        "peak_bytes": plan.peak_bytes,
        "headroom_bytes": plan.headroom_bytes(),
        "budget_share": share,
    })
}

fn fbytes(n: f64) -> String {
    bytes(Some(n.max(0.0).round() as u64))
}

/// 1234567 -> "1.23 M".
fn count(n: f64) -> String {
    let (value, unit) = match n.abs() {
        x if x >= 1e9 => (n / 1e9, " G"),
        x if x >= 1e6 => (n / 1e6, " M"),
        x if x >= 1e4 => (n / 1e3, " k"),
        _ => return format!("{}", n.round()),
    };
    format!("{value:.2}{unit}")
}

fn duration(seconds: f64) -> String {
    match seconds {
        s if s >= 86_400.0 => format!("{:.1} d", s / 86_400.0),
        s if s >= 3_600.0 => format!("{:.1} h", s / 3_600.0),
        s if s >= 60.0 => format!("{:.1} min", s / 60.0),
        s => format!("{s:.1} s"),
    }
}

/// A count: digits, a decimal with an exponent (1.6e9), or a k/M/G suffix
/// (powers of ten).
pub fn parse_count(s: &str) -> Result<f64, String> {
    let t = s.trim().replace('_', "");
    let (number, scale) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1e3),
        Some('m' | 'M') => (&t[..t.len() - 1], 1e6),
        Some('g' | 'G' | 'b' | 'B') => (&t[..t.len() - 1], 1e9),
        _ => (t.as_str(), 1.0),
    };
    let v: f64 = number.trim().parse().map_err(|_| format!("not a count: {s}"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("not a count: {s}"));
    }
    Ok(v * scale)
}

/// A size in bytes: digits, or with kB/MB/GB/TB (powers of ten) or
/// KiB/MiB/GiB/TiB (powers of two).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024f64.powi(2),
        "GiB" => 1024f64.powi(3),
        "TiB" => 1024f64.powi(4),
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s} (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            ))
        }
    };
    let v: f64 = number.trim().parse().map_err(|_| format!("not a size: {s}"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("not a size: {s}"));
    }
    Ok((v * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        plan: PlanArgs,
    }

    fn plan_of(args: &str) -> String {
        let cli = Cli::try_parse_from(std::iter::once("plan").chain(args.split_whitespace())).unwrap();
        plan(&cli.plan).unwrap()
    }

    #[test]
    fn sizes_and_counts_parse_with_units() {
        assert_eq!(parse_bytes("128MiB"), Ok(128 << 20));
        assert_eq!(parse_bytes("5kB"), Ok(5_000));
        assert_eq!(parse_bytes("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("5 parsecs").is_err());
        assert_eq!(parse_count("1.6e9"), Ok(1.6e9));
        assert_eq!(parse_count("1.6G"), Ok(1.6e9));
        assert_eq!(parse_count("300_000"), Ok(3e5));
        assert!(parse_count("-3").is_err());
    }

    #[test]
    fn the_articles_workload_plans_as_the_docs_show() {
        let text = plan_of("--keys 1.6e9 --record-bytes 5kB --partitions 8 --shape republish");
        assert!(text.contains("Keel 8.39 M keys a pass"), "{text}");
        assert!(text.contains("Kafka 5.03 M"), "{text}");
        let row = text.lines().find(|l| l.starts_with("each")).unwrap();
        let cells: Vec<&str> = row.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
        assert_eq!(cells[3], "24", "{text}");
        assert_eq!(cells[4], "60 (19 reclaim 0)", "{text}");
        let v: Value = serde_json::from_str(&plan_of(
            "--keys 1.6e9 --record-bytes 5kB --partitions 60 --shape republish --map-bytes 1GiB --json",
        ))
        .unwrap();
        assert_eq!(v["partitions"].as_array().unwrap().len(), 60);
        assert_eq!(v["partitions"][0]["keel"]["passes"], 1);
        assert_eq!(v["partitions"][0]["kafka"]["passes"], 1);
    }

    #[test]
    fn a_steady_workload_says_whether_the_cleaner_keeps_up() {
        let keeps = plan_of("--keys 10M --record-bytes 1KiB --update-rate 1000");
        assert!(keeps.contains("the cleaner keeps up"), "{keeps}");
        let behind = plan_of("--keys 10M --record-bytes 1KiB --update-rate 1M --io-bytes-per-sec 10MiB");
        assert!(behind.contains("the cleaner falls behind"), "{behind}");
    }

    #[test]
    fn a_scan_needs_the_topics_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let e = plan(
            &Cli::try_parse_from(["plan", "--topic", "t", "--data-dir", tmp.path().to_str().unwrap()])
                .unwrap()
                .plan,
        )
        .unwrap_err();
        assert!(e.contains("no partition directory of topic t"), "{e}");
        assert!(
            Cli::try_parse_from(["plan", "--keys", "5"]).is_err(),
            "--record-bytes is required"
        );
    }
}
