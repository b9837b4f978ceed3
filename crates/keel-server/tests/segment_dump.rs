//! `keel segment dump` on segment files written by Apache Kafka itself
//! (tests/fixtures/kafka-segment, see its README) and by Keel's log, and
//! on damaged copies of them.

use std::path::{Path, PathBuf};
use std::process::Command;

use keel_log::marker::Marker;
use keel_log::testing::BatchBuilder;
use keel_log::txnindex::AbortedTxn;
use keel_log::{LogConfig, PartitionLog};
use serde_json::Value;

const KAFKA_LOG: &str = "00000000000000000000.log";

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kafka-segment")
}

/// Runs `keel segment dump ARGS`; returns (exit code, stdout).
fn keel_dump(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["segment", "dump"])
        .args(args)
        .output()
        .expect("runs keel");
    let stdout = String::from_utf8(out.stdout).expect("utf-8 output");
    (out.status.code().expect("exited"), stdout)
}

/// `keel segment dump FILE --json ARGS`, parsed: (exit code, lines).
fn dump_json(file: &Path, args: &[&str]) -> (i32, Vec<Value>) {
    let mut all = vec![file.to_str().expect("utf-8 path"), "--json"];
    all.extend_from_slice(args);
    let (code, out) = keel_dump(&all);
    let lines = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (code, lines)
}

fn of_type<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["type"] == kind).collect()
}

/// A copy of the Kafka fixture in a temporary directory.
fn kafka_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for e in std::fs::read_dir(fixture_dir()).expect("fixture dir") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), dir.path().join(e.file_name())).expect("copy");
    }
    dir
}

/// Kafka's own DumpLogSegments on the fixture: position, base and last
/// offset, codec, transactional, control, stored CRC of every batch.
const KAFKA_BATCHES: [(u64, i64, i64, &str, bool, bool, u64); 9] = [
    (0, 0, 2, "none", false, false, 2305866008),
    (199, 3, 5, "gzip", false, false, 642779485),
    (343, 6, 8, "snappy", false, false, 3822766361),
    (488, 9, 11, "lz4", false, false, 1426718491),
    (650, 12, 14, "zstd", false, false, 2973013359),
    (795, 15, 16, "none", true, false, 3236839161),
    (902, 17, 17, "none", true, true, 1155751518),
    (980, 18, 19, "none", true, false, 1242096252),
    (1087, 20, 20, "none", true, true, 2278260708),
];

fn batch_tuple(b: &Value) -> (u64, i64, i64, &str, bool, bool, u64) {
    (
        b["position"].as_u64().unwrap(),
        b["base_offset"].as_i64().unwrap(),
        b["last_offset"].as_i64().unwrap(),
        b["codec"].as_str().unwrap(),
        b["transactional"].as_bool().unwrap(),
        b["control"].as_bool().unwrap(),
        b["crc"].as_u64().unwrap(),
    )
}

#[test]
fn kafkas_segment_reads_as_kafka_reads_it() {
    let (code, lines) = dump_json(&fixture_dir().join(KAFKA_LOG), &["--records"]);
    assert_eq!(code, 0, "{lines:?}");
    let batches = of_type(&lines, "batch");
    assert_eq!(
        batches.iter().map(|b| batch_tuple(b)).collect::<Vec<_>>(),
        KAFKA_BATCHES
    );
    for b in &batches {
        assert_eq!(b["crc_valid"], true, "{b}");
        assert_eq!(b["crc"], b["computed_crc"], "{b}");
        assert_eq!(b["magic"], 2);
        assert_eq!(
            b["records_count"].as_u64(),
            Some(b["records"].as_array().unwrap().len() as u64)
        );
    }
    let offsets: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            b["records"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["offset"].as_i64().unwrap())
        })
        .collect();
    assert_eq!(offsets, (0..=20).collect::<Vec<_>>());
    assert_eq!(batches[6]["records"][0]["control_type"], "COMMIT");
    assert_eq!(batches[8]["records"][0]["control_type"], "ABORT");
    // Records of the gzip batch: the second has no key; headers on the
    // first two; timestamps as produced.
    let gzip = batches[1]["records"].as_array().unwrap();
    assert_eq!(
        gzip.iter()
            .map(|r| (r["key_size"].as_i64().unwrap(), r["headers"].as_u64().unwrap()))
            .collect::<Vec<_>>(),
        [(5, 2), (-1, 2), (5, 0)]
    );
    assert_eq!(gzip[0]["timestamp"], 1_700_000_000_003i64);
    assert!(
        gzip[0].get("position").is_none(),
        "compressed records have no file position"
    );
    assert_eq!(batches[0]["records"][0]["position"], 61);
    let summary = of_type(&lines, "summary")[0];
    assert_eq!(
        (summary["batches"].as_u64(), summary["problems"].as_u64()),
        (Some(9), Some(0))
    );
}

#[test]
fn print_data_decompresses_keys_values_and_headers() {
    let (code, lines) = dump_json(&fixture_dir().join(KAFKA_LOG), &["--print-data"]);
    assert_eq!(code, 0);
    let batches = of_type(&lines, "batch");
    for (i, codec) in ["none", "gzip", "snappy", "lz4", "zstd"].iter().enumerate() {
        let r = &batches[i]["records"][0];
        let n = i * 3;
        assert_eq!(r["key"], format!("key-{n}"), "{codec}");
        assert_eq!(r["value"], format!("value-{n}-{}", codec.repeat(4)), "{codec}");
        assert_eq!(r["header_data"][0]["key"], "codec");
        assert_eq!(r["header_data"][0]["value"], *codec);
    }
    assert_eq!(batches[1]["records"][1]["key"], Value::Null);
    // The table shows the same.
    let (code, table) = keel_dump(&[
        fixture_dir().join(KAFKA_LOG).to_str().unwrap(),
        "--print-data-log",
    ]);
    assert_eq!(code, 0);
    assert!(
        table.contains(r#"key: "key-9"  value: "value-9-lz4lz4lz4lz4"  header codec="lz4""#),
        "{table}"
    );
    assert!(table.contains("control COMMIT"), "{table}");
}

#[test]
fn position_names_the_batch_and_record_holding_a_byte() {
    let log = fixture_dir().join(KAFKA_LOG);
    let (code, lines) = dump_json(&log, &["--position", "200"]);
    assert_eq!(code, 0);
    assert_eq!(of_type(&lines, "position")[0]["part"], "baseOffset field");
    assert_eq!(batch_tuple(of_type(&lines, "batch")[0]).0, 199);
    // Inside the records of the first (uncompressed) batch: the second
    // record, whose bytes the dump states.
    let (code, lines) = dump_json(&log, &["--position", "130", "--records"]);
    assert_eq!(code, 0);
    let records = of_type(&lines, "batch")[0]["records"].as_array().unwrap().clone();
    assert_eq!(records.len(), 1);
    let (at, len) = (
        records[0]["position"].as_u64().unwrap(),
        records[0]["size"].as_u64().unwrap(),
    );
    assert!((at..at + len).contains(&130), "{records:?}");
    assert_eq!(records[0]["offset"], 1);
    let (code, lines) = dump_json(&log, &["--position", "1087"]);
    assert_eq!((code, batch_tuple(of_type(&lines, "batch")[0]).1), (0, 20));
    let (code, lines) = dump_json(&log, &["--position", "1165"]);
    assert_eq!(code, 1);
    assert_eq!(of_type(&lines, "position")[0]["in"], "past_end");
}

#[test]
fn kafkas_index_files_list_and_verify() {
    let dir = fixture_dir();
    let (code, lines) = dump_json(&dir.join("00000000000000000000.index"), &["--verify-index"]);
    assert_eq!(code, 0, "{lines:?}");
    let entries: Vec<(i64, i64)> = of_type(&lines, "offset_index_entry")
        .iter()
        .map(|e| (e["offset"].as_i64().unwrap(), e["position"].as_i64().unwrap()))
        .collect();
    assert_eq!(
        entries,
        [
            (5, 199),
            (8, 343),
            (11, 488),
            (14, 650),
            (16, 795),
            (17, 902),
            (19, 980),
            (20, 1087)
        ]
    );
    let (code, lines) = dump_json(&dir.join("00000000000000000000.timeindex"), &["--verify-index"]);
    assert_eq!(code, 0, "{lines:?}");
    let times = of_type(&lines, "time_index_entry");
    assert_eq!(times.len(), 7);
    assert_eq!(
        (times[0]["timestamp"].as_i64(), times[0]["offset"].as_i64()),
        (Some(1_700_000_000_005), Some(5))
    );
    let (code, lines) = dump_json(&dir.join("00000000000000000000.txnindex"), &[]);
    assert_eq!(code, 0);
    let txns = of_type(&lines, "txn_index_entry");
    assert_eq!(txns.len(), 1);
    assert_eq!(
        [
            &txns[0]["producer_id"],
            &txns[0]["first_offset"],
            &txns[0]["last_offset"],
            &txns[0]["last_stable_offset"]
        ],
        [4, 18, 20, 21]
    );
    let (code, lines) = dump_json(&dir.join("00000000000000000000.txnindex"), &["--verify-index"]);
    assert_eq!(code, 0, "{lines:?}");
    // On the .log: all three siblings checked.
    let (code, lines) = dump_json(&dir.join(KAFKA_LOG), &["--verify-index"]);
    assert_eq!(code, 0);
    let summary = of_type(&lines, "summary")[0];
    assert_eq!(
        (summary["index_entries"].as_u64(), summary["mismatches"].as_u64()),
        (Some(16), Some(0))
    );
}

/// The fixture's one aborted transaction (producer 4, first offset 18,
/// ABORT marker at 20), tampered with field by field: each change is a
/// mismatch against the log.
#[test]
fn verify_index_checks_aborted_transactions_against_their_markers() {
    let dir = kafka_copy();
    let txn = dir.path().join("00000000000000000000.txnindex");
    let original = std::fs::read(&txn).unwrap();
    assert_eq!(original.len(), 34);
    let reasons = |field_at: usize, value: i64| {
        let mut bytes = original.clone();
        bytes[field_at..field_at + 8].copy_from_slice(&value.to_be_bytes());
        std::fs::write(&txn, &bytes).unwrap();
        let (code, lines) = dump_json(&txn, &["--verify-index"]);
        assert_eq!(code, 1, "{lines:?}");
        of_type(&lines, "mismatch")
            .iter()
            .map(|m| {
                assert_eq!(m["index"], "txn");
                m["reason"].as_str().unwrap().to_string()
            })
            .collect::<Vec<_>>()
    };
    // Fields: version (2 bytes), producer id, first offset, last offset,
    // last stable offset (8 bytes each).
    assert_eq!(
        reasons(2, 5),
        [
            "offset 20 is an ABORT marker of producer 4, not 5",
            "first offset 18 is a batch of producer 4, not 5"
        ]
    );
    assert_eq!(
        reasons(10, 19),
        ["first offset 19 is not the start of a transactional batch"]
    );
    assert_eq!(
        reasons(18, 17),
        [
            "first offset 18 is after its last offset 17",
            "offset 17 is a COMMIT marker, not an ABORT",
            "the ABORT marker at offset 20 (producer 4) has no entry"
        ]
    );
    assert_eq!(
        reasons(18, 16),
        [
            "first offset 18 is after its last offset 16",
            "offset 16 is not a transaction marker",
            "the ABORT marker at offset 20 (producer 4) has no entry"
        ]
    );
    assert_eq!(
        reasons(18, 40),
        [
            "its ABORT marker at offset 40 is not in the log",
            "the ABORT marker at offset 20 (producer 4) has no entry"
        ]
    );
    // An empty .txnindex beside a segment that holds an ABORT marker.
    std::fs::write(&txn, b"").unwrap();
    let (code, lines) = dump_json(&dir.path().join(KAFKA_LOG), &["--verify-index"]);
    assert_eq!(code, 1);
    let m = of_type(&lines, "mismatch");
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(
        (&m[0]["index"], &m[0]["entry"]),
        (&Value::from("txn"), &Value::from(0))
    );
    // Without --verify-index the file only lists.
    std::fs::write(&txn, &original).unwrap();
    assert_eq!(dump_json(&txn, &[]).0, 0);
    // As Kafka's cleaner leaves it: the aborted records (the batch at 980,
    // offsets 18-19) gone, the marker kept, and no entry for it.
    let log = dir.path().join(KAFKA_LOG);
    let mut bytes = std::fs::read(&log).unwrap();
    bytes.drain(980..1087);
    std::fs::write(&log, &bytes).unwrap();
    std::fs::write(&txn, b"").unwrap();
    let (code, lines) = dump_json(&txn, &["--verify-index"]);
    assert_eq!(code, 0, "{lines:?}");
}

#[test]
fn an_untrimmed_index_ends_at_its_first_zero_entry() {
    let dir = kafka_copy();
    let index = dir.path().join("00000000000000000000.index");
    let mut bytes = std::fs::read(&index).unwrap();
    bytes.extend_from_slice(&[0; 8 * 10]);
    std::fs::write(&index, &bytes).unwrap();
    let (code, lines) = dump_json(&index, &["--verify-index"]);
    assert_eq!(code, 0, "{lines:?}");
    assert_eq!(of_type(&lines, "offset_index_entry").len(), 8);
    let ignored = of_type(&lines, "ignored_entries")[0];
    assert_eq!(
        (ignored["entries"].as_u64(), ignored["all_zero"].as_bool()),
        (Some(10), Some(true))
    );
}

#[test]
fn verify_index_catches_tampered_entries() {
    let dir = kafka_copy();
    let index = dir.path().join("00000000000000000000.index");
    let mut bytes = std::fs::read(&index).unwrap();
    bytes[2 * 8 + 7] += 1; // entry 2: position 488 -> 489
    std::fs::write(&index, &bytes).unwrap();
    let (code, lines) = dump_json(&index, &["--verify-index"]);
    assert_eq!(code, 1);
    let m = of_type(&lines, "mismatch");
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(m[0]["entry"], 2);
    assert!(
        m[0]["reason"]
            .as_str()
            .unwrap()
            .contains("489 is not the start of a batch"),
        "{m:?}"
    );
    // Without --verify-index the entries are only listed.
    assert_eq!(dump_json(&index, &[]).0, 0);

    let time = dir.path().join("00000000000000000000.timeindex");
    let mut bytes = std::fs::read(&time).unwrap();
    bytes[12 + 7] -= 1; // entry 1: timestamp 1700000000008 -> ...007
    std::fs::write(&time, &bytes).unwrap();
    let (code, lines) = dump_json(&dir.path().join(KAFKA_LOG), &["--verify-index"]);
    assert_eq!(code, 1);
    let m = of_type(&lines, "mismatch");
    assert_eq!(
        m.iter()
            .map(|m| (m["index"].as_str().unwrap(), m["entry"].as_u64().unwrap()))
            .collect::<Vec<_>>(),
        [("offset", 2), ("time", 1)],
        "{m:?}"
    );
}

#[test]
fn a_flipped_byte_is_a_crc_mismatch_and_the_next_batch_still_lists() {
    let dir = kafka_copy();
    let log = dir.path().join(KAFKA_LOG);
    let mut bytes = std::fs::read(&log).unwrap();
    bytes[488 + 100] ^= 0x01; // inside the lz4 batch's records
    std::fs::write(&log, &bytes).unwrap();
    let (code, lines) = dump_json(&log, &[]);
    assert_eq!(code, 1);
    let batches = of_type(&lines, "batch");
    assert_eq!(
        batches.iter().map(|b| batch_tuple(b)).collect::<Vec<_>>(),
        KAFKA_BATCHES
    );
    let bad: Vec<u64> = batches
        .iter()
        .filter(|b| b["crc_valid"] == false)
        .map(|b| b["position"].as_u64().unwrap())
        .collect();
    assert_eq!(bad, [488]);
    assert_eq!(of_type(&lines, "summary")[0]["bad_crc"], 1);
}

#[test]
fn a_truncated_batch_is_a_corrupt_region_at_the_end() {
    let dir = kafka_copy();
    let log = dir.path().join(KAFKA_LOG);
    let bytes = std::fs::read(&log).unwrap();
    std::fs::write(&log, &bytes[..1087 + 40]).unwrap();
    let (code, lines) = dump_json(&log, &[]);
    assert_eq!(code, 1);
    assert_eq!(of_type(&lines, "batch").len(), 8);
    let c = of_type(&lines, "corrupt");
    assert_eq!(
        (c[0]["position"].as_u64(), c[0]["length"].as_u64()),
        (Some(1087), Some(40))
    );
    // Mid-header too.
    std::fs::write(&log, &bytes[..1087 + 70]).unwrap();
    let (_, lines) = dump_json(&log, &[]);
    let c = of_type(&lines, "corrupt");
    assert!(c[0]["reason"].as_str().unwrap().starts_with("truncated"), "{c:?}");
    let (code, lines) = dump_json(&log, &["--position", "1100"]);
    assert_eq!(code, 1);
    assert_eq!(of_type(&lines, "position")[0]["in"], "corrupt");
}

#[test]
fn garbage_in_the_middle_is_reported_and_skipped() {
    let dir = kafka_copy();
    let log = dir.path().join(KAFKA_LOG);
    let bytes = std::fs::read(&log).unwrap();
    let mut bad = bytes[..488].to_vec();
    bad.extend((0..53u32).map(|i| (i * 37 + 11) as u8));
    bad.extend_from_slice(&bytes[488..]);
    std::fs::write(&log, &bad).unwrap();
    let (code, lines) = dump_json(&log, &["--records"]);
    assert_eq!(code, 1);
    let c = of_type(&lines, "corrupt");
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0]["position"].as_u64(), c[0]["length"].as_u64()),
        (Some(488), Some(53))
    );
    let positions: Vec<u64> = of_type(&lines, "batch")
        .iter()
        .map(|b| b["position"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = KAFKA_BATCHES
        .iter()
        .map(|b| if b.0 >= 488 { b.0 + 53 } else { b.0 })
        .collect();
    assert_eq!(positions, expected);
    assert_eq!(of_type(&lines, "summary")[0]["records"], 21);
}

#[test]
fn empty_tiny_and_unknown_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let (code, lines) = dump_json(&p("00000000000000000000.log", &[]), &[]);
    assert_eq!(
        (code, of_type(&lines, "summary")[0]["batches"].as_u64()),
        (0, Some(0))
    );
    let (code, lines) = dump_json(&p("00000000000000000007.log", &[0, 0, 0, 1, 2]), &[]);
    assert_eq!(code, 1);
    assert_eq!(of_type(&lines, "segment")[0]["base_offset"], 7);
    assert_eq!(of_type(&lines, "corrupt")[0]["length"], 5);
    assert_eq!(dump_json(&p("00000000000000000000.index", &[]), &[]).0, 0);
    let (code, lines) = dump_json(&p("00000000000000000000.timeindex", &[1, 2, 3, 4, 5]), &[]);
    assert_eq!(
        (code, of_type(&lines, "partial_entry")[0]["bytes"].as_u64()),
        (1, Some(5))
    );
    let (code, lines) = dump_json(&p("00000000000000000000.txnindex", &[0; 40]), &[]);
    assert_eq!((code, of_type(&lines, "txn_index_entry").len()), (0, 1));
    assert_eq!(keel_dump(&[p("segment.data", b"x").to_str().unwrap()]).0, 2);
    assert_eq!(keel_dump(&[p("noname.log", b"").to_str().unwrap()]).0, 2);
    assert_eq!(
        keel_dump(&[p("noname.log", b"").to_str().unwrap(), "--base-offset", "5"]).0,
        0
    );
    assert_eq!(
        keel_dump(&[dir.path().join("missing.log").to_str().unwrap()]).0,
        2
    );
}

#[test]
fn a_segment_keel_wrote_dumps_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        index_interval_bytes: 100,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir.path(), config).unwrap();
    let mut expected = Vec::new();
    for i in 0..12i64 {
        let mut b = BatchBuilder::new(5_000 + 10 * (i % 5)).producer(3, 0, (i * 2) as i32);
        if i % 3 == 1 {
            b = b.compressed(keel_log::codec::Codec::Zstd);
        }
        let mut batch = b
            .record(Some(b"k"), Some(&[b'v'; 90]))
            .record(None, Some(b"w"))
            .build();
        let headers = keel_log::batch::validate_batches(&batch).unwrap();
        let info = log.append(&mut batch, &headers, 0).unwrap();
        expected.push((info.position as u64, info.base_offset));
    }
    // An aborted transaction: two records of producer 9, its ABORT marker,
    // and the .txnindex entry the broker adds for it.
    let mut txn = BatchBuilder::new(6_000)
        .producer(9, 0, 0)
        .transactional(true)
        .record(Some(b"t"), Some(b"x"))
        .record(Some(b"t"), Some(b"y"))
        .build();
    let marker = Marker {
        commit: false,
        coordinator_epoch: 0,
    };
    let mut abort = keel_log::marker::marker_batch(9, 0, marker, 6_001);
    for batch in [&mut txn, &mut abort] {
        let headers = keel_log::batch::validate_batches(batch).unwrap();
        let info = log.append(batch, &headers, 0).unwrap();
        expected.push((info.position as u64, info.base_offset));
    }
    log.add_aborted_txn(AbortedTxn {
        producer_id: 9,
        first_offset: 24,
        last_offset: 26,
        last_stable_offset: 27,
    })
    .unwrap();
    log.close().unwrap();
    let seg = dir.path().join(KAFKA_LOG);
    let (code, lines) = dump_json(&seg, &["--verify-index", "--records"]);
    assert_eq!(code, 0, "{lines:?}");
    let batches = of_type(&lines, "batch");
    let got: Vec<(u64, i64)> = batches
        .iter()
        .map(|b| {
            (
                b["position"].as_u64().unwrap(),
                b["base_offset"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, expected);
    assert_eq!(batches[1]["codec"], "zstd");
    let summary = of_type(&lines, "summary")[0];
    assert!(summary["index_entries"].as_u64().unwrap() >= 11, "{summary}");
    assert_eq!(summary["records"], 27);
    let txns = of_type(&lines, "txn_index_entry");
    assert_eq!(txns.len(), 1, "{lines:?}");
    assert_eq!(
        (&txns[0]["first_offset"], &txns[0]["last_offset"]),
        (&Value::from(24), &Value::from(26))
    );
}
