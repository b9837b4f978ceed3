//! Decodes request frames captured from real clients (confluent-kafka /
//! librdkafka, kafka-python, kcat) by `tests/tools/capture_frames.py`.
//!
//! Each fixture is named
//! `<client>-<version>__<api key>-<api name>-v<api version>__cid<correlation id>.bin`
//! and holds one frame without its size prefix. Every frame of an API and
//! version Keel implements must decode, with the header the name states, and
//! re-encode to the same bytes (nothing lost or reinterpreted); any other
//! frame must be refused as unsupported, never as malformed.

mod common;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use keel_protocol::versions::support;
use keel_protocol::{decode, DecodeError, RequestFrame};

struct Fixture {
    path: PathBuf,
    client: String,
    api_key: i16,
    api_version: i16,
    correlation_id: i32,
}

fn fixtures() -> Vec<Fixture> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/frames");
    let mut out: Vec<Fixture> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| parse_name(entry.expect("dir entry").path()))
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

fn parse_name(path: PathBuf) -> Fixture {
    let name = path.file_name().and_then(|n| n.to_str()).expect("utf-8 name");
    let stem = name
        .strip_suffix(".bin")
        .unwrap_or_else(|| panic!("{name}: not .bin"));
    let parts: Vec<&str> = stem.split("__").collect();
    let [client, api, cid] = parts[..] else {
        panic!("{name}: expected <client>__<key>-<api>-v<version>__cid<n>.bin");
    };
    let api_key = api.split('-').next().and_then(|k| k.parse().ok());
    let api_version = api.rsplit_once("-v").and_then(|(_, v)| v.parse().ok());
    let correlation_id = cid.strip_prefix("cid").and_then(|c| c.parse().ok());
    let (Some(api_key), Some(api_version), Some(correlation_id)) = (api_key, api_version, correlation_id)
    else {
        panic!("{name}: cannot read api key, version and correlation id from the name");
    };
    Fixture {
        client: client.to_string(),
        path,
        api_key,
        api_version,
        correlation_id,
    }
}

#[test]
fn fixtures_cover_every_client() {
    let all = fixtures();
    for client in ["confluent-kafka-", "kafka-python-", "kcat-"] {
        let n = all.iter().filter(|f| f.client.starts_with(client)).count();
        assert!(n >= 5, "only {n} fixtures from {client}*");
    }
}

#[test]
fn captured_frames_decode() {
    let mut decoded = 0;
    for f in fixtures() {
        let name = f
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let bytes = Bytes::from(std::fs::read(&f.path).expect("read fixture"));
        let frame = RequestFrame::parse(bytes.clone()).expect("frame has a fixed header");
        assert_eq!(
            (frame.api_key, frame.api_version, frame.correlation_id),
            (f.api_key, f.api_version, f.correlation_id),
            "{name}: fixed header"
        );
        let implemented = frame
            .known_api_key()
            .and_then(support)
            .is_some_and(|s| (s.min..=s.max).contains(&frame.api_version));
        match decode(&frame) {
            Ok(d) => {
                assert!(implemented, "{name}: decoded, but Keel does not implement it");
                assert_eq!(d.header.request_api_key, f.api_key, "{name}");
                assert_eq!(d.header.request_api_version, f.api_version, "{name}");
                assert_eq!(d.header.correlation_id, f.correlation_id, "{name}");
                let again = common::encode_frame(&d.header, &d.body)
                    .unwrap_or_else(|e| panic!("{name}: re-encode failed: {e}"));
                assert!(
                    again == bytes,
                    "{name}: re-encoded frame differs from the captured one"
                );
                decoded += 1;
            }
            Err(DecodeError::UnsupportedApi { .. } | DecodeError::UnsupportedVersion { .. })
                if !implemented => {}
            Err(e) => panic!("{name}: {e}"),
        }
    }
    assert!(decoded > 0, "no fixture decoded");
}
