//! `keel stats`: a running broker's counters, fetched from its admin
//! endpoint (`keel.admin.listen`) and printed as a short table or as the
//! JSON the broker sent.
//!
//! Plain blocking `std::net`: one request, one connection, no HTTP client
//! library. Fields the table does not know are ignored and missing ones
//! print as `-`, so brokers with more (or fewer) counters still work.

use std::fmt::{self, Write as _};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde_json::Value;

#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// The broker's admin endpoint (its `keel.admin.listen`).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9644")]
    pub admin: String,
    /// Print the JSON as the broker sent it.
    #[arg(long)]
    pub json: bool,
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Larger answers are refused rather than buffered.
const MAX_RESPONSE_BYTES: u64 = 256 << 20;

pub fn run(args: &StatsArgs) -> Result<(), FetchError> {
    let body = fetch(&args.admin, "/stats")?;
    let text = if args.json {
        body
    } else {
        let stats: Value = serde_json::from_str(&body).map_err(|e| FetchError::BadResponse {
            admin: args.admin.clone(),
            reason: format!("the body is not JSON: {e}"),
        })?;
        render(&stats)
    };
    let mut out = std::io::stdout().lock();
    // A closed stdout (`keel stats | head`) is not worth an error.
    let _ = out.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
    Ok(())
}

/// Why `keel stats` has nothing to print.
#[derive(Debug)]
pub enum FetchError {
    /// No connection could be made.
    Unreachable { admin: String, error: std::io::Error },
    /// The connection broke or stalled mid-exchange.
    Io { admin: String, error: std::io::Error },
    /// Not an HTTP response Keel's admin endpoint sends.
    BadResponse { admin: String, reason: String },
    /// An answer other than 200.
    Status {
        admin: String,
        status: u16,
        body: String,
    },
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::Unreachable { admin, error } => write!(
                f,
                "cannot reach the admin endpoint at {admin}: {error} \
                 (is a broker running with keel.admin.listen={admin}?)"
            ),
            FetchError::Io { admin, error } => write!(f, "admin endpoint {admin}: {error}"),
            FetchError::BadResponse { admin, reason } => write!(f, "admin endpoint {admin}: {reason}"),
            FetchError::Status { admin, status, body } => {
                write!(f, "admin endpoint {admin} answered {status}: {}", body.trim_end())
            }
        }
    }
}

impl std::error::Error for FetchError {}

/// `GET path` from the admin endpoint at `admin`; the body of a 200.
pub fn fetch(admin: &str, path: &str) -> Result<String, FetchError> {
    let mut stream = connect(admin)?;
    let io = |error| FetchError::Io {
        admin: admin.to_string(),
        error,
    };
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    // An endpoint that wants `keel.admin.auth.bearer.token` gets it from
    // KEEL_ADMIN_TOKEN.
    let authorization = std::env::var("KEEL_ADMIN_TOKEN")
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {admin}\r\nAccept: application/json\r\n{authorization}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut raw = Vec::new();
    stream
        .take(MAX_RESPONSE_BYTES)
        .read_to_end(&mut raw)
        .map_err(io)?;
    let (status, body) = parse_response(&raw).map_err(|reason| FetchError::BadResponse {
        admin: admin.to_string(),
        reason,
    })?;
    if status != 200 {
        return Err(FetchError::Status {
            admin: admin.to_string(),
            status,
            body,
        });
    }
    Ok(body)
}

fn connect(admin: &str) -> Result<TcpStream, FetchError> {
    let unreachable = |error| FetchError::Unreachable {
        admin: admin.to_string(),
        error,
    };
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "the name has no address");
    for addr in admin.to_socket_addrs().map_err(unreachable)? {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(unreachable(last))
}

/// Status code and body of a complete `Connection: close` response.
fn parse_response(raw: &[u8]) -> Result<(u16, String), String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP response ({} bytes, no end of head)", raw.len()))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "response head is not text".to_string())?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = match status_line.split(' ').collect::<Vec<_>>()[..] {
        [version, code, ..] if version.starts_with("HTTP/1.") => code.parse::<u16>().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("bad status line `{status_line}`"))?;
    let mut body = &raw[end + 4..];
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("content-length") {
            let len: usize = value
                .trim()
                .parse()
                .map_err(|_| format!("bad Content-Length `{}`", value.trim()))?;
            body = body
                .get(..len)
                .ok_or_else(|| format!("body cut short: {} of {len} bytes", body.len()))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(format!("unsupported Transfer-Encoding `{}`", value.trim()));
        }
    }
    let body = String::from_utf8(body.to_vec()).map_err(|_| "body is not UTF-8".to_string())?;
    Ok((status, body))
}

/// The counter at `path` in `v`, if present and a number.
fn num(v: &Value, path: &[&str]) -> Option<u64> {
    path.iter().try_fold(v, |v, key| v.get(key))?.as_u64()
}

pub(crate) fn bytes(n: Option<u64>) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    let Some(n) = n else {
        return "-".into();
    };
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn count(n: Option<u64>) -> String {
    n.map_or_else(|| "-".into(), |n| n.to_string())
}

fn percent(part: Option<u64>, whole: Option<u64>) -> String {
    match (part, whole) {
        (Some(part), Some(whole)) if whole > 0 => format!("{:.1}%", part as f64 * 100.0 / whole as f64),
        _ => "-".into(),
    }
}

/// The human table: the tail cache, where fetched bytes came from, and the
/// same per partition.
pub fn render(stats: &Value) -> String {
    let mut out = String::new();
    render_cluster(stats, &mut out);
    render_tail_cache(stats, &mut out);
    render_live(stats, &mut out);
    render_tiers(stats, &mut out);
    let partitions = stats.get("partitions").and_then(Value::as_array);
    let Some(partitions) = partitions.filter(|p| !p.is_empty()) else {
        out.push_str("\nno partitions\n");
        return out;
    };
    let clustered = stats["cluster"]["store"]
        .as_str()
        .is_some_and(|s| s.starts_with("etcd"));
    render_partitions(partitions, clustered, &mut out);
    render_holds(partitions, &mut out);
    render_share(stats, &mut out);
    render_cleaner(stats, partitions, &mut out);
    out
}

/// Each share partition's offsets, its records in flight (acquired by a
/// consumer, or available again) and what it redelivered.
fn render_share(stats: &Value, out: &mut String) {
    let Some(parts) = stats["share_groups"]["partitions"]
        .as_array()
        .filter(|p| !p.is_empty())
    else {
        return;
    };
    let rows: Vec<Vec<String>> = parts
        .iter()
        .map(|p| {
            vec![
                format!(
                    "{} {}-{}",
                    p["group"].as_str().unwrap_or("-"),
                    p["topic"].as_str().unwrap_or("-"),
                    count(num(p, &["partition"]))
                ),
                p["start_offset"].to_string(),
                p["end_offset"].to_string(),
                count(num(p, &["acquired"])),
                count(num(p, &["available"])),
                count(num(p, &["redeliveries"])),
                count(num(p, &["lock_expiries"])),
                count(num(p, &["archived_at_limit"])),
            ]
        })
        .collect();
    let _ = writeln!(
        out,
        "
share partitions (records in flight between start and end):"
    );
    out.push_str(&table(
        &[
            "group topic-partition",
            "start",
            "end",
            "acquired",
            "available",
            "redelivered",
            "locks expired",
            "archived at limit",
        ],
        &rows,
    ));
}

/// Why local segments past their partition's local retention or the fast
/// tier's budget are still on the fast tier: the reader each is kept for.
fn render_holds(partitions: &[Value], out: &mut String) {
    let held: Vec<String> = partitions
        .iter()
        .filter_map(|p| {
            let h = p["tiers"].get("held_for_reader").filter(|h| !h.is_null())?;
            Some(format!(
                "  {}-{}: offsets {}..{} ({}) for {} at offset {}",
                p["topic"].as_str().unwrap_or("-"),
                count(num(p, &["partition"])),
                h["base_offset"],
                h["next_offset"],
                bytes(h["bytes"].as_u64()),
                h["reader"].as_str().unwrap_or("-"),
                h["reader_offset"],
            ))
        })
        .collect();
    if !held.is_empty() {
        let _ = writeln!(
            out,
            "\nkept on the fast tier for readers (released once they pass):"
        );
        for line in held {
            let _ = writeln!(out, "{line}");
        }
    }
}

/// The broker's membership, when it is in a cluster: the live brokers,
/// which one is controller, and whether this one is fenced.
fn render_cluster(stats: &Value, out: &mut String) {
    let cluster = &stats["cluster"];
    let Some(store) = cluster["store"].as_str().filter(|s| s.starts_with("etcd")) else {
        return;
    };
    let controller = cluster["controller"]["node_id"].as_i64();
    let brokers: Vec<String> = cluster["brokers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|b| b["node_id"].as_i64())
        .map(|id| {
            if Some(id) == controller {
                format!("{id} (controller)")
            } else {
                id.to_string()
            }
        })
        .collect();
    let _ = writeln!(
        out,
        "cluster      node {} epoch {}{} on {store}; live brokers: {}",
        cluster["node_id"],
        cluster["broker_epoch"],
        if cluster["fenced"].as_bool() == Some(true) {
            " (FENCED: its session is not confirmed)"
        } else {
            ""
        },
        brokers.join(", "),
    );
    for (key, line, keys, topic) in [
        ("group_log", "groups      ", "groups", "__consumer_offsets"),
        (
            "txn_log",
            "transactions",
            "transactional ids",
            "__transaction_state",
        ),
    ] {
        let log = &cluster[key];
        if log.is_object() {
            let n = |key: &str| log[key].as_u64().unwrap_or(0);
            let partitions = log["partitions"].as_array().map_or(0, Vec::len);
            let _ = writeln!(
                out,
                "{line} coordinating the {keys} of {partitions} partitions of {topic}; \
                 {} loads, {} snapshots, {} write failures",
                n("loads"),
                n("snapshots"),
                n("write_failures"),
            );
        }
    }
    if let Some(peers) = cluster["peer_requests"].as_object().filter(|p| !p.is_empty()) {
        let sent: Vec<String> = peers
            .iter()
            .map(|(api, n)| {
                format!(
                    "{} {api} ({} failed)",
                    n["requests"].as_u64().unwrap_or(0),
                    n["failures"].as_u64().unwrap_or(0)
                )
            })
            .collect();
        let _ = writeln!(out, "peers        sent other brokers {}", sent.join(", "));
    }
    let wal = &cluster["wal"];
    if wal.is_object() {
        let n = |key: &str| wal[key].as_u64().unwrap_or(0);
        let _ = writeln!(
            out,
            "wal          {} objects ({}) written to the object store, {} waiting; \
             {} write failures, {} commit failures, {} groups fenced; \
             {} objects ({}) collected",
            n("objects"),
            bytes(wal["bytes"].as_u64()),
            bytes(wal["pending_bytes"].as_u64()),
            n("write_failures"),
            n("commit_failures"),
            n("fenced_groups"),
            n("collected_objects"),
            bytes(wal["collected_bytes"].as_u64()),
        );
    }
}

/// The tail cache's use, and how much of what was fetched it served.
fn render_tail_cache(stats: &Value, out: &mut String) {
    let tail = |key| num(stats, &["tail_cache", key]);
    let (hit_bytes, cold_bytes) = (tail("hit_bytes"), num(stats, &["cold_reads", "bytes"]));
    let fetched = hit_bytes.zip(cold_bytes).map(|(h, c)| h + c);
    let _ = writeln!(
        out,
        "tail cache   budget {}, used {} ({}), {} batches",
        bytes(tail("budget_bytes")),
        bytes(tail("used_bytes")),
        percent(tail("used_bytes"), tail("budget_bytes")),
        count(tail("cached_batches")),
    );
    let _ = writeln!(
        out,
        "             inserted {}, evicted {} ({} batches)",
        bytes(tail("inserted_bytes")),
        bytes(tail("evicted_bytes")),
        count(tail("evicted_batches")),
    );
    let _ = writeln!(
        out,
        "fetched      from cache {} ({} reads), cold from disk {} ({} reads): {} from cache",
        bytes(hit_bytes),
        count(tail("hit_reads")),
        bytes(cold_bytes),
        count(num(stats, &["cold_reads", "reads"])),
        percent(hit_bytes, fetched),
    );
    if stats.get("scan").is_some() {
        let scan = |key| num(stats, &["scan", key]);
        let _ = writeln!(
            out,
            "scan buffer  limit {}, held {}; {} fetches answered by earlier reads ({}, {} of it another reader's)",
            bytes(scan("limit_bytes")),
            bytes(scan("held_bytes")),
            count(scan("hits")),
            bytes(scan("served_bytes")),
            bytes(scan("shared_bytes")),
        );
    }
}

/// The live path's p99 over the last 10 s, and the background budgets:
/// in force, and the ceiling each was set to when the governor holds it
/// below.
fn render_live(stats: &Value, out: &mut String) {
    let Some(live) = stats.get("live_latency") else {
        return;
    };
    let ms = |op: &str| {
        let q = &live[op]["last_10s"];
        match (q["count"].as_u64(), q["p99_us"].as_f64()) {
            (Some(n), Some(us)) if n > 0 => format!("{:.2} ms", us / 1e3),
            _ => "-".to_string(),
        }
    };
    let governor = match stats["io_governor"]["target_ms"].as_f64() {
        Some(t) => format!(
            "governor target {t} ms, {} cuts",
            count(num(stats, &["io_governor", "cuts"]))
        ),
        None => "governor off".to_string(),
    };
    let _ = writeln!(
        out,
        "live p99     produce {}, tail fetch {} (last 10 s); {governor}",
        ms("produce"),
        ms("tail_fetch"),
    );
    let rate = |n: Option<u64>| match n {
        Some(0) => "unlimited".to_string(),
        n => format!("{}/s", bytes(n)),
    };
    let budgets: Vec<String> = stats["io"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["class"] != "live")
        .map(|c| {
            let (budget, ceiling) = (
                c["budget_bytes_per_sec"].as_u64(),
                c["ceiling_bytes_per_sec"].as_u64(),
            );
            let name = c["class"].as_str().unwrap_or("-").replace('_', " ");
            if ceiling.is_some() && budget != ceiling {
                format!("{name} {} (of {})", rate(budget), rate(ceiling))
            } else {
                format!("{name} {}", rate(budget))
            }
        })
        .collect();
    if !budgets.is_empty() {
        let _ = writeln!(out, "budgets      {}", budgets.join(", "));
    }
}

/// The colder tiers' traffic and the fast tier's budget, when the broker
/// has a colder tier.
fn render_tiers(stats: &Value, out: &mut String) {
    let tier = |key| num(stats, &["tiers", key]);
    let tier_name = |key| {
        stats
            .get("tiers")
            .and_then(|t| t.get(key))
            .and_then(Value::as_str)
    };
    let Some(place) = tier_name("capacity").or(tier_name("remote")) else {
        return;
    };
    let _ = writeln!(
        out,
        "tiers        {}{}: copied {} ({} copies, {} failed), read {}, deleted {}",
        place,
        tier_name("remote")
            .filter(|_| tier_name("capacity").is_some())
            .map_or(String::new(), |r| format!(" and {r}")),
        bytes(tier("copied_bytes")),
        count(tier("copies")),
        count(tier("copy_failures")),
        bytes(tier("read_bytes")),
        count(tier("deletes")),
    );
    let _ = writeln!(
        out,
        "             fast tier {} of budget {}{}, fs {} free",
        bytes(tier("fast_bytes")),
        stats["tiers"]["fast_max_bytes"]
            .as_i64()
            .filter(|b| *b >= 0)
            .map_or("unlimited".into(), |b| bytes(Some(b as u64))),
        if stats["tiers"]["fast_over_budget"].as_bool() == Some(true) {
            " (OVER)"
        } else {
            ""
        },
        bytes(tier("fast_fs_free_bytes")),
    );
    if tier("reader_holds").is_some_and(|n| n > 0) || tier("held_read_bytes").is_some_and(|n| n > 0) {
        let _ = writeln!(
            out,
            "             readers hold {} segments ({}) on the fast tier; {} read from held segments, not the colder tier; {} released despite a reader",
            count(tier("reader_holds")),
            bytes(tier("reader_held_bytes")),
            bytes(tier("held_read_bytes")),
            count(tier("reader_hold_overrides")),
        );
    }
    if let Some(e) = tier_name("last_error") {
        let _ = writeln!(out, "             last error: {e}");
    }
}

/// A row per partition: its offsets, what its reads came from and where
/// its data is.
/// One row per partition; in a cluster, with its leader (and epoch).
fn render_partitions(partitions: &[Value], clustered: bool, out: &mut String) {
    let rows: Vec<Vec<String>> = partitions
        .iter()
        .map(|p| {
            let field = |key| num(p, &[key]);
            let mut row = vec![
                p.get("topic").and_then(Value::as_str).unwrap_or("-").to_string(),
                count(field("partition")),
            ];
            if clustered {
                row.push(leader(p));
            }
            row.extend([
                count(field("log_start_offset")),
                count(field("high_watermark")),
                bytes(field("cache_read_bytes")),
                bytes(field("cold_read_bytes")),
                bytes(num(p, &["tiers", "local_bytes"])),
                bytes(num(p, &["tiers", "cold_bytes"])),
            ]);
            row
        })
        .collect();
    let mut headers = vec!["topic", "partition"];
    if clustered {
        headers.push("leader (epoch)");
    }
    headers.extend([
        "log start",
        "high watermark",
        "cache read",
        "cold read",
        "local",
        "in colder tier",
    ]);
    out.push('\n');
    out.push_str(&table(&headers, &rows));
}

/// A partition's leader as the cluster holds it: the broker and epoch, or
/// none while the brokers holding its records are away.
fn leader(p: &Value) -> String {
    let epoch = p["leader_epoch"].as_i64().unwrap_or(-1);
    match p["leader"].as_i64() {
        Some(id) if id >= 0 => format!("{id} ({epoch})"),
        Some(_) => format!("none ({epoch}): its broker is away"),
        None => "-".into(),
    }
}

/// The cleaner's totals and a row per compacted partition, when there are
/// any.
fn render_cleaner(stats: &Value, partitions: &[Value], out: &mut String) {
    let compacted: Vec<&Value> = partitions
        .iter()
        .filter(|p| p.get("cleaner").is_some_and(Value::is_object))
        .collect();
    if compacted.is_empty() {
        return;
    }
    let c = |key| num(stats, &["cleaner", key]);
    let enabled = stats["cleaner"]["enabled"].as_bool() != Some(false);
    let _ = writeln!(
        out,
        "\ncleaner      {}{} thread(s), map {} ({} keys) each, I/O budget {}",
        if enabled { "" } else { "DISABLED, " },
        count(c("threads")),
        bytes(
            c("dedupe_buffer_bytes")
                .zip(c("threads"))
                .map(|(b, t)| b / t.max(1))
        ),
        count(c("map_keys_per_thread")),
        match c("io_bytes_per_sec") {
            Some(0) => "unlimited".to_string(),
            n => format!("{}/s", bytes(n)),
        },
    );
    let _ = writeln!(
        out,
        "             {} passes ({} failed): read {}, wrote {}, reclaimed {}, {} records removed",
        count(c("passes")),
        count(c("failed_passes")),
        bytes(c("bytes_read")),
        bytes(c("bytes_written")),
        bytes(c("bytes_reclaimed")),
        count(c("records_removed")),
    );
    let rows: Vec<Vec<String>> = compacted
        .iter()
        .map(|p| {
            let field = |key| num(p, &["cleaner", key]);
            let ratio = |key: &str| {
                p["cleaner"][key]
                    .as_f64()
                    .map_or_else(|| "-".into(), |r| format!("{:.1}%", r * 100.0))
            };
            vec![
                p.get("topic").and_then(Value::as_str).unwrap_or("-").to_string(),
                count(num(p, &["partition"])),
                ratio("dirty_ratio"),
                count(field("passes")),
                bytes(field("bytes_reclaimed")),
                ratio("map_fill"),
                p["cleaner"]["not_cleanable"]
                    .as_str()
                    .or(p["cleaner"]["last_error"].as_str())
                    .unwrap_or("")
                    .to_string(),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&aligned_table(
        &[
            "compacted topic",
            "partition",
            "dirty",
            "passes",
            "reclaimed",
            "map fill",
            "status",
        ],
        &rows,
        &[0, 6],
    ));
}

/// Aligned columns: the first left-aligned, the others (numbers) right.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    aligned_table(header, rows, &[0])
}

/// Aligned columns: those in `left` left-aligned, the others right.
pub(crate) fn aligned_table(header: &[&str], rows: &[Vec<String>], left: &[usize]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i == 0 {
                let _ = write!(line, "{cell:<w$}");
            } else if left.contains(&i) {
                let _ = write!(line, "  {cell:<w$}");
            } else {
                let _ = write!(line, "  {cell:>w$}");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clustered_broker_shows_its_cluster_and_one_node_does_not() {
        let stats = serde_json::json!({
            "cluster": {"store": "etcd at http://10.0.0.5:2379", "node_id": 2, "broker_epoch": 41,
                        "fenced": true, "controller": {"node_id": 1, "epoch": 9},
                        "brokers": [{"node_id": 1}, {"node_id": 2}, {"node_id": 3}],
                        "peer_requests": {"AddPartitionsToTxn": {"requests": 12, "failures": 0},
                                          "WriteTxnMarkers": {"requests": 7, "failures": 2}}},
        });
        let text = render(&stats);
        assert!(
            text.contains("peers        sent other brokers 12 AddPartitionsToTxn (0 failed), 7 WriteTxnMarkers (2 failed)"),
            "{text}"
        );
        assert!(
            text.contains(
                "cluster      node 2 epoch 41 (FENCED: its session is not confirmed) on etcd at \
                 http://10.0.0.5:2379; live brokers: 1 (controller), 2, 3"
            ),
            "{text}"
        );
        let alone = serde_json::json!({"cluster": {"store": "in-process (one node)", "node_id": 1}});
        assert!(!render(&alone).contains("cluster"));
    }

    #[test]
    fn compacted_partitions_get_a_cleaner_table() {
        let stats = serde_json::json!({
            "tail_cache": {}, "cold_reads": {},
            "cleaner": {"enabled": true, "threads": 2, "dedupe_buffer_bytes": 8 << 20,
                        "map_keys_per_thread": 261_120, "io_bytes_per_sec": 0, "passes": 7,
                        "failed_passes": 1, "bytes_read": 3 << 20, "bytes_written": 1 << 20,
                        "bytes_reclaimed": 2 << 20, "records_removed": 900},
            "partitions": [
                {"topic": "plain", "partition": 0, "cleaner": null},
                {"topic": "changelog", "partition": 3,
                 "cleaner": {"dirty_ratio": 0.25, "passes": 7, "bytes_reclaimed": 2 << 20,
                             "map_fill": 0.5, "not_cleanable": "dirty ratio 0.25 is below min.cleanable.dirty.ratio"}},
            ],
        });
        let text = render(&stats);
        assert!(
            text.contains("cleaner      2 thread(s), map 4.0 MiB (261120 keys) each, I/O budget unlimited"),
            "{text}"
        );
        assert!(
            text.contains(
                "7 passes (1 failed): read 3.0 MiB, wrote 1.0 MiB, reclaimed 2.0 MiB, 900 records removed"
            ),
            "{text}"
        );
        let row = text
            .lines()
            .skip_while(|l| !l.starts_with("compacted topic"))
            .find(|l| l.starts_with("changelog"))
            .expect("a row per compacted partition");
        assert!(
            row.contains("25.0%") && row.contains("2.0 MiB") && row.contains("50.0%"),
            "{text}"
        );
        assert!(
            row.ends_with("dirty ratio 0.25 is below min.cleanable.dirty.ratio"),
            "{text}"
        );
        assert!(
            !text.lines().any(|l| l.starts_with("plain ") && l.contains('%')),
            "{text}"
        );
        let no_compacted = serde_json::json!({"partitions": [{"topic": "plain", "partition": 0}]});
        assert!(!render(&no_compacted).contains("cleaner"));
    }

    #[test]
    fn byte_counts_are_human() {
        assert_eq!(bytes(Some(0)), "0 B");
        assert_eq!(bytes(Some(1023)), "1023 B");
        assert_eq!(bytes(Some(1024)), "1.0 KiB");
        assert_eq!(bytes(Some(10 << 20)), "10.0 MiB");
        assert_eq!(bytes(Some(3 << 30 | 512 << 20)), "3.5 GiB");
        assert_eq!(bytes(None), "-");
    }

    #[test]
    fn responses_parse() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(ok), Ok((200, "{}".to_string())));
        let no_length = b"HTTP/1.0 404 Not Found\r\n\r\nnot found\n";
        assert_eq!(parse_response(no_length), Ok((404, "not found\n".to_string())));
        let short = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}";
        assert!(parse_response(short).unwrap_err().contains("cut short"));
        assert!(parse_response(b"").is_err());
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        assert!(parse_response(chunked).is_err());
    }

    #[test]
    fn the_table_shows_the_cache_and_every_partition() {
        let stats = serde_json::json!({
            "tail_cache": {
                "budget_bytes": 1 << 20, "used_bytes": 1 << 19, "cached_batches": 8,
                "inserted_bytes": 10 << 20, "evicted_bytes": 9 << 20, "evicted_batches": 150,
                "hit_reads": 3, "hit_bytes": 1 << 20, "miss_reads": 40,
                "a_future_counter": 1,
            },
            "cold_reads": {"reads": 40, "bytes": 3 << 20},
            "scan": {"limit_bytes": 64 << 20, "held_bytes": 2 << 20, "hits": 30,
                     "served_bytes": 6 << 20, "shared_bytes": 4 << 20},
            "live_latency": {"produce": {"last_10s": {"count": 900, "p99_us": 1840}},
                             "tail_fetch": {"last_10s": {"count": 0, "p99_us": 0}}},
            "io_governor": {"target_ms": 5.0, "cuts": 3},
            "io": [{"class": "live", "budget_bytes_per_sec": 0, "ceiling_bytes_per_sec": 0},
                   {"class": "cold_read", "budget_bytes_per_sec": 4 << 20, "ceiling_bytes_per_sec": 0},
                   {"class": "tier_move", "budget_bytes_per_sec": 50 << 20, "ceiling_bytes_per_sec": 50 << 20}],
            "partitions": [
                {"topic": "orders", "partition": 0, "log_start_offset": 0, "high_watermark": 20000,
                 "cache_read_bytes": 1 << 20, "cold_read_bytes": 3 << 20,
                 "tiers": {"local_bytes": 2 << 20, "cold_bytes": 5 << 20,
                           "held_for_reader": {"base_offset": 1000, "next_offset": 2000, "bytes": 1 << 20,
                                               "reader": "group loader", "reader_offset": 900}}},
                {"topic": "a-much-longer-topic-name", "partition": 11, "high_watermark": 5,
                 "cache_read_bytes": 0, "cold_read_bytes": 0, "extra": [1, 2]},
            ],
            "share_groups": {"enabled": true, "groups": 1, "partitions": [
                {"group": "jobs", "topic": "orders", "partition": 0, "start_offset": 120, "end_offset": 170,
                 "acquired": 30, "available": 4, "acknowledged": 16, "archived": 0,
                 "redeliveries": 7, "lock_expiries": 2, "archived_at_limit": 1},
            ]},
            "something_new": {"x": 1},
        });
        let text = render(&stats);
        assert!(!text.contains("tiers "), "no tier lines without tiers: {text}");
        assert!(
            text.contains("budget 1.0 MiB, used 512.0 KiB (50.0%), 8 batches"),
            "{text}"
        );
        assert!(text.contains("evicted 9.0 MiB (150 batches)"), "{text}");
        assert!(
            text.contains("scan buffer  limit 64.0 MiB, held 2.0 MiB; 30 fetches answered by earlier reads (6.0 MiB, 4.0 MiB of it another reader's)"),
            "{text}"
        );
        assert!(
            text.contains(
                "live p99     produce 1.84 ms, tail fetch - (last 10 s); governor target 5 ms, 3 cuts"
            ),
            "{text}"
        );
        assert!(
            text.contains("budgets      cold read 4.0 MiB/s (of unlimited), tier move 50.0 MiB/s"),
            "{text}"
        );
        assert!(
            text.contains("kept on the fast tier for readers (released once they pass):\n  orders-0: offsets 1000..2000 (1.0 MiB) for group loader at offset 900"),
            "{text}"
        );
        assert!(
            text.contains("from cache 1.0 MiB (3 reads), cold from disk 3.0 MiB (40 reads): 25.0%"),
            "{text}"
        );
        assert!(
            text.contains("share partitions (records in flight between start and end):\ngroup topic-partition  start  end  acquired  available  redelivered  locks expired  archived at limit\njobs orders-0            120  170        30          4            7              2                  1"),
            "{text}"
        );
        let lines: Vec<&str> = text.lines().collect();
        let header = lines.iter().position(|l| l.starts_with("topic")).unwrap();
        let orders = lines[header + 1];
        assert!(orders.starts_with("orders "), "{text}");
        assert!(
            orders.ends_with("1.0 MiB    3.0 MiB  2.0 MiB         5.0 MiB"),
            "{text}"
        );
        // The missing log start prints as `-`; columns line up.
        let other = lines[header + 2];
        assert!(other.starts_with("a-much-longer-topic-name  "), "{text}");
        assert_eq!(orders.len(), other.len(), "{text}");
        assert!(other.contains(" - "), "{text}");
    }

    #[test]
    fn missing_sections_print_as_dashes() {
        let text = render(&serde_json::json!({}));
        assert!(text.contains("budget -, used - (-)"), "{text}");
        assert!(text.ends_with("no partitions\n"), "{text}");
    }

    #[test]
    fn an_unreachable_endpoint_is_named() {
        // Bind and drop: a port with nothing listening.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let admin = format!("127.0.0.1:{port}");
        let e = fetch(&admin, "/stats").unwrap_err();
        assert!(matches!(e, FetchError::Unreachable { .. }), "{e:?}");
        assert!(e.to_string().contains(&admin), "{e}");
    }
}
