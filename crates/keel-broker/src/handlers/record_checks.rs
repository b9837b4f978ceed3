//! Kafka's per-record rules for produced batches (`LogValidator.validateRecord`)
//! and the answer that names the records they refuse (KIP-467): every
//! record of a batch is checked, from its records section (decompressed
//! once by the produce handler when the batch is compressed),
//! and each refused one is reported by its index in the batch
//! (`record_errors`), so that clients fail exactly those records and the
//! rest of the batch with a different error (librdkafka's
//! `_INVALID_DIFFERENT_RECORD`).
//!
//! A record is refused, in Kafka's order, for having no key on a compacted
//! topic (INVALID_RECORD), then for its timestamp: a batch claiming
//! LogAppendTime, or a CreateTime outside the topic's window
//! (INVALID_TIMESTAMP).

use std::collections::BTreeMap;

use bytes::Bytes;
use keel_log::batch::{set_log_append_time, BatchHeader, NO_TIMESTAMP};
use keel_log::records::{records_in, Record};
use keel_protocol::messages::produce_response::BatchIndexAndErrorMessage;
use keel_protocol::ResponseError;

use super::str_bytes;
use keel_config::{topic_def, BrokerConfig};

/// At most this many refused records are named in one answer. Kafka names
/// them all; a compressed batch may unpack to millions of records
/// (`MAX_DECOMPRESSED_BYTES`), and about a hundred bytes each would make the
/// answer far larger than the request. Producers' batches hold fewer
/// records (librdkafka's `batch.num.messages` defaults to 10,000).
const MAX_RECORD_ERRORS: usize = 100_000;

/// How a topic's records are timestamped (`message.timestamp.type`) and
/// which CreateTime timestamps it accepts (`message.timestamp.before.max.ms`
/// and `message.timestamp.after.max.ms`, relative to the broker's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimestampPolicy {
    pub log_append_time: bool,
    pub before_max_ms: i64,
    pub after_max_ms: i64,
}

/// What a topic asks of each record of a produced batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordRules {
    /// `cleanup.policy` includes `compact`: every record needs a key.
    pub compacted: bool,
    pub timestamps: TimestampPolicy,
}

/// Why a partition's batch was refused: INVALID_RECORD or INVALID_TIMESTAMP
/// naming the records, or CORRUPT_MESSAGE when the records cannot be read.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub error: ResponseError,
    pub message: String,
    pub record_errors: Vec<BatchIndexAndErrorMessage>,
}

/// Batches ready to append: with LogAppendTime, rewritten to carry the
/// broker's time, which the response reports.
pub(crate) struct Stamped {
    pub records: Bytes,
    pub headers: Vec<BatchHeader>,
    /// -1 for CreateTime topics, as Kafka answers.
    pub log_append_time_ms: i64,
}

impl TimestampPolicy {
    pub(crate) fn of(config: &BrokerConfig, overrides: &BTreeMap<String, String>) -> TimestampPolicy {
        let value = |name: &str| topic_def(name).map(|d| config.topic_value(overrides, d));
        let ms = |name: &str, default: i64| value(name).and_then(|v| v.parse().ok()).unwrap_or(default);
        TimestampPolicy {
            log_append_time: value("message.timestamp.type") == Some("LogAppendTime"),
            before_max_ms: ms("message.timestamp.before.max.ms", i64::MAX),
            after_max_ms: ms("message.timestamp.after.max.ms", 3_600_000),
        }
    }

    /// Whether a CreateTime `timestamp_ms` is outside `[now - before, now + after]`
    /// (a record without a timestamp never is).
    fn out_of_range(&self, timestamp_ms: i64, now_ms: i64) -> bool {
        timestamp_ms != NO_TIMESTAMP
            && (now_ms.saturating_sub(timestamp_ms) > self.before_max_ms
                || timestamp_ms.saturating_sub(now_ms) > self.after_max_ms)
    }

    /// Validated batches as they are appended: on a LogAppendTime topic,
    /// every batch stamped with the broker's time `now_ms`.
    pub(crate) fn stamp(&self, records: Bytes, mut headers: Vec<BatchHeader>, now_ms: i64) -> Stamped {
        if !self.log_append_time {
            return Stamped {
                records,
                headers,
                log_append_time_ms: -1,
            };
        }
        // One copy of the request's records: they are shared and immutable.
        let mut buf = records.to_vec();
        let mut at = 0;
        for h in &mut headers {
            let len = h.total_len();
            set_log_append_time(&mut buf[at..at + len], h, now_ms);
            at += len;
        }
        Stamped {
            records: Bytes::from(buf),
            headers,
            log_append_time_ms: now_ms,
        }
    }
}

impl RecordRules {
    pub(crate) fn of(config: &BrokerConfig, overrides: &BTreeMap<String, String>) -> RecordRules {
        RecordRules {
            compacted: config.cleanup_policy(overrides).is_ok_and(|p| p.compact),
            timestamps: TimestampPolicy::of(config, overrides),
        }
    }

    /// Checks every record of one validated batch `h` of partition
    /// `index` of `topic` at broker time `now_ms`, from its records
    /// `section` (decompressed when the batch is compressed).
    pub(crate) fn check_section(
        &self,
        (topic, index): (&str, i32),
        h: &BatchHeader,
        section: &[u8],
        now_ms: i64,
    ) -> Result<(), Refusal> {
        let unreadable = |why: String| Refusal {
            error: ResponseError::CorruptMessage,
            message: why,
            record_errors: Vec::new(),
        };
        let mut refused = Vec::new();
        for (i, record) in records_in(section).enumerate() {
            let record = record.map_err(unreadable)?;
            if let Some(e) = self.record_error((topic, index), h, &record, now_ms) {
                refused.push((i32::try_from(i).unwrap_or(i32::MAX), e));
            }
        }
        match refused.is_empty() {
            true => Ok(()),
            false => Err(refusal(refused)),
        }
    }

    /// Kafka's verdict on one record, with its message.
    fn record_error(
        &self,
        (topic, index): (&str, i32),
        h: &BatchHeader,
        r: &Record<'_>,
        now_ms: i64,
    ) -> Option<(ResponseError, String)> {
        if self.compacted && r.key.is_none() {
            return Some((
                ResponseError::InvalidRecord,
                format!(
                    "Compacted topic cannot accept message without key in topic partition {topic}-{index}"
                ),
            ));
        }
        let offset = h.base_offset.saturating_add(r.offset_delta);
        // Kafka refuses a producer's LogAppendTime on LogAppendTime topics
        // and rewrites it on CreateTime ones; Keel refuses it on both.
        if h.timestamp_type_is_log_append() {
            return Some((
                ResponseError::InvalidTimestamp,
                format!(
                    "Invalid timestamp type in message {}. Producer should not set timestamp type to LogAppendTime.",
                    describe(offset, h.max_timestamp, r)
                ),
            ));
        }
        let policy = &self.timestamps;
        let timestamp_ms = h.base_timestamp.saturating_add(r.timestamp_delta);
        if policy.log_append_time || !policy.out_of_range(timestamp_ms, now_ms) {
            return None;
        }
        Some((
            ResponseError::InvalidTimestamp,
            format!(
                "Timestamp {timestamp_ms} of message with offset {offset} is out of range. \
                 The timestamp should be within [{}, {}]",
                now_ms.saturating_sub(policy.before_max_ms),
                now_ms.saturating_add(policy.after_max_ms)
            ),
        ))
    }
}

/// A record as Kafka's `DefaultRecord.toString` shows it.
fn describe(offset: i64, timestamp_ms: i64, r: &Record<'_>) -> String {
    format!(
        "DefaultRecord(offset={offset}, timestamp={timestamp_ms}, key={} bytes, value={} bytes)",
        r.key.map_or(0, <[u8]>::len),
        r.value.map_or(0, <[u8]>::len)
    )
}

/// Kafka's answer for a batch with refused records (`processRecordErrors`):
/// INVALID_TIMESTAMP when any record's timestamp was refused, else
/// INVALID_RECORD quoting the first three.
fn refusal(refused: Vec<(i32, (ResponseError, String))>) -> Refusal {
    let timestamps = refused
        .iter()
        .any(|(_, (e, _))| *e == ResponseError::InvalidTimestamp);
    let message = if timestamps {
        "One or more records have been rejected due to invalid timestamp".to_string()
    } else {
        let first: Vec<String> = refused
            .iter()
            .take(3)
            .map(|(i, (_, m))| format!("RecordError(batchIndex={i}, message='{m}')"))
            .collect();
        format!(
            "One or more records have been rejected due to {} record errors in total, \
             and only showing the first three errors at most: [{}]",
            refused.len(),
            first.join(", ")
        )
    };
    let error = match timestamps {
        true => ResponseError::InvalidTimestamp,
        false => ResponseError::InvalidRecord,
    };
    let record_errors = refused
        .into_iter()
        .take(MAX_RECORD_ERRORS)
        .map(|(index, (_, m))| {
            BatchIndexAndErrorMessage::default()
                .with_batch_index(index)
                .with_batch_index_error_message(Some(str_bytes(m)))
        })
        .collect();
    Refusal {
        error,
        message,
        record_errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_log::batch::validate_batches;
    use keel_log::codec::Codec;
    use keel_log::testing::{BatchBuilder, TestRecord};

    const NOW_MS: i64 = 1_800_000_000_000;
    const HOUR_MS: i64 = 3_600_000;
    const CODECS: [Codec; 5] = [Codec::None, Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd];

    fn rules(compacted: bool, log_append_time: bool) -> RecordRules {
        RecordRules {
            compacted,
            timestamps: TimestampPolicy {
                log_append_time,
                before_max_ms: HOUR_MS,
                after_max_ms: HOUR_MS,
            },
        }
    }

    /// One batch in `codec` whose records have these keys and timestamps.
    fn batch(codec: Codec, records: &[(Option<&[u8]>, i64)]) -> Vec<u8> {
        let base = records[0].1;
        let mut b = BatchBuilder::new(base).compressed(codec);
        for &(key, ts) in records {
            b = b.push(TestRecord {
                key: key.map(<[u8]>::to_vec),
                value: Some(b"v".to_vec()),
                timestamp_delta_ms: ts - base,
                headers: Vec::new(),
            });
        }
        b.build()
    }

    fn timed(codec: Codec, timestamps: &[i64]) -> Vec<u8> {
        let records: Vec<_> = timestamps.iter().map(|&ts| (Some(&b"k"[..]), ts)).collect();
        batch(codec, &records)
    }

    /// Checks each batch in turn, as produce requests with one batch
    /// each: the first with a refused record refuses.
    fn check(rules: RecordRules, bufs: &[Vec<u8>]) -> Result<(), Refusal> {
        for buf in bufs {
            let h = validate_batches(buf).unwrap()[0];
            let section = keel_log::records::records_section(buf, &h).unwrap();
            rules.check_section(("t", 0), &h, &section, NOW_MS)?;
        }
        Ok(())
    }

    fn indexes(refused: &Refusal) -> Vec<i32> {
        refused.record_errors.iter().map(|e| e.batch_index).collect()
    }

    fn message(refused: &Refusal, i: usize) -> String {
        refused.record_errors[i]
            .batch_index_error_message
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn every_keyless_record_is_named_in_every_codec() {
        let records: Vec<(Option<&[u8]>, i64)> = (0..100)
            .map(|i| ((i % 10 != 9).then_some(&b"k"[..]), NOW_MS))
            .collect();
        for codec in CODECS {
            let refused = check(rules(true, false), &[batch(codec, &records)]).unwrap_err();
            assert_eq!(refused.error, ResponseError::InvalidRecord, "{codec:?}");
            assert_eq!(
                indexes(&refused),
                (0..10).map(|i| i * 10 + 9).collect::<Vec<_>>(),
                "{codec:?}"
            );
            assert_eq!(
                message(&refused, 0),
                "Compacted topic cannot accept message without key in topic partition t-0"
            );
            assert!(
                refused.message.starts_with(
                    "One or more records have been rejected due to 10 record errors in total, \
                     and only showing the first three errors at most: [RecordError(batchIndex=9, \
                     message='Compacted topic cannot accept message without key in topic partition t-0'), "
                ),
                "{}",
                refused.message
            );
            // Without compaction, keys are optional.
            assert!(check(rules(false, false), &[batch(codec, &records)]).is_ok());
        }
    }

    #[test]
    fn every_record_outside_the_window_is_named_in_every_codec() {
        for codec in CODECS {
            let stamps = [
                NOW_MS,
                NOW_MS - HOUR_MS - 1,
                NO_TIMESTAMP,
                NOW_MS + HOUR_MS + 1,
                NOW_MS,
            ];
            let refused = check(rules(false, false), &[timed(codec, &stamps)]).unwrap_err();
            assert_eq!(refused.error, ResponseError::InvalidTimestamp, "{codec:?}");
            assert_eq!(indexes(&refused), vec![1, 3], "{codec:?}");
            assert_eq!(
                refused.message,
                "One or more records have been rejected due to invalid timestamp"
            );
            assert_eq!(
                message(&refused, 0),
                format!(
                    "Timestamp {} of message with offset 1 is out of range. \
                     The timestamp should be within [{}, {}]",
                    NOW_MS - HOUR_MS - 1,
                    NOW_MS - HOUR_MS,
                    NOW_MS + HOUR_MS
                )
            );
            // A LogAppendTime topic ignores CreateTime bounds.
            assert!(check(rules(false, true), &[timed(codec, &stamps)]).is_ok());
        }
    }

    #[test]
    fn a_missing_key_is_reported_before_a_bad_timestamp() {
        let b = batch(
            Codec::Lz4,
            &[(None, NOW_MS - 2 * HOUR_MS), (Some(b"k"), NOW_MS - 2 * HOUR_MS)],
        );
        let refused = check(rules(true, false), &[b]).unwrap_err();
        assert_eq!(indexes(&refused), vec![0, 1]);
        assert!(message(&refused, 0).starts_with("Compacted topic"));
        assert!(message(&refused, 1).starts_with("Timestamp"));
        // Any refused timestamp makes the whole answer INVALID_TIMESTAMP.
        assert_eq!(refused.error, ResponseError::InvalidTimestamp);
    }

    #[test]
    fn extreme_timestamps_do_not_overflow() {
        let bufs = [
            timed(Codec::None, &[i64::MIN + 1]),
            timed(Codec::None, &[i64::MAX]),
        ];
        let mut unbounded = rules(false, false);
        unbounded.timestamps.before_max_ms = i64::MAX;
        unbounded.timestamps.after_max_ms = i64::MAX;
        assert!(check(unbounded, &bufs).is_ok());
        // The first batch with a refused record refuses the request.
        let refused = check(rules(false, false), &bufs).unwrap_err();
        assert_eq!(indexes(&refused), vec![0]);
    }

    #[test]
    fn producers_cannot_claim_log_append_time() {
        let mut b = timed(Codec::Gzip, &[NOW_MS, NOW_MS + 1]);
        let mut h = BatchHeader::parse(&b).unwrap();
        set_log_append_time(&mut b, &mut h, NOW_MS);
        for log_append_time in [false, true] {
            let refused = check(rules(false, log_append_time), std::slice::from_ref(&b)).unwrap_err();
            assert_eq!(refused.error, ResponseError::InvalidTimestamp);
            assert_eq!(indexes(&refused), vec![0, 1]);
            assert_eq!(
                message(&refused, 1),
                format!(
                    "Invalid timestamp type in message DefaultRecord(offset=1, timestamp={NOW_MS}, \
                     key=1 bytes, value=1 bytes). Producer should not set timestamp type to LogAppendTime."
                )
            );
        }
    }

    #[test]
    fn log_append_time_stamps_every_batch_with_broker_time() {
        let all = [timed(Codec::None, &[5, 6]), timed(Codec::None, &[7])].concat();
        let headers = validate_batches(&all).unwrap();
        let stamped = rules(false, true)
            .timestamps
            .stamp(Bytes::from(all), headers, NOW_MS);
        assert_eq!(stamped.log_append_time_ms, NOW_MS);
        let reparsed = validate_batches(&stamped.records).expect("CRCs valid after the rewrite");
        assert_eq!(reparsed, stamped.headers);
        for h in &reparsed {
            assert!(h.timestamp_type_is_log_append());
            assert_eq!(h.max_timestamp, NOW_MS);
        }
        // CreateTime topics keep their batches as sent.
        let records = Bytes::from(timed(Codec::None, &[5]));
        let headers = validate_batches(&records).unwrap();
        let kept = rules(false, false)
            .timestamps
            .stamp(records.clone(), headers, NOW_MS);
        assert_eq!((kept.records, kept.log_append_time_ms), (records, -1));
    }

    #[test]
    fn rules_read_topic_overrides_over_broker_defaults() {
        let config = BrokerConfig::from_map(&BTreeMap::new()).unwrap();
        let defaults = RecordRules::of(&config, &BTreeMap::new());
        assert_eq!(
            defaults,
            RecordRules {
                compacted: false,
                timestamps: TimestampPolicy {
                    log_append_time: false,
                    before_max_ms: i64::MAX,
                    after_max_ms: HOUR_MS,
                }
            }
        );
        let overrides: BTreeMap<String, String> = [
            ("message.timestamp.type", "LogAppendTime"),
            ("message.timestamp.before.max.ms", "1000"),
            ("cleanup.policy", "compact,delete"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let topic = RecordRules::of(&config, &overrides);
        assert!(topic.compacted && topic.timestamps.log_append_time);
        assert_eq!(topic.timestamps.before_max_ms, 1000);
    }
}
