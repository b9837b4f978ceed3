//! Round-trip property: for every API and version in `versions::SUPPORTED`,
//! random requests built with the codec's builders, encoded as a client
//! would (request header of the right version, then the body), decode
//! through `RequestFrame::parse` + `decode` to exactly the original.
//!
//! The seed is printed; `KEEL_TEST_SEED=<seed>` replays a failure.
//! `KEEL_ROUNDTRIP_CASES` sets the requests per (api, version) (default 200).

mod common;

use std::path::PathBuf;

use common::Gen;
use keel_protocol::messages::ApiKey;
use keel_protocol::versions::SUPPORTED;
use keel_protocol::{decode, RequestFrame};

fn cases() -> usize {
    std::env::var("KEEL_ROUNDTRIP_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

#[test]
fn every_supported_version_round_trips() {
    let seed = common::test_seed();
    let mut g = Gen::new(seed);
    let mut checked = 0;
    for api in SUPPORTED {
        for v in api.min..=api.max {
            for case in 0..cases() {
                let header = common::header(&mut g, api.key, v);
                let Some(body) = common::body(&mut g, api.key, v) else {
                    panic!(
                        "{:?} is in versions::SUPPORTED but tests/common has no generator for it",
                        api.key
                    );
                };
                let bytes = common::encode_frame(&header, &body)
                    .unwrap_or_else(|e| panic!("{:?} v{v} case {case}: encode failed: {e}", api.key));
                let frame = RequestFrame::parse(bytes.clone()).expect("frame has a fixed header");
                assert_eq!(
                    (frame.api_key, frame.api_version, frame.correlation_id),
                    (api.key as i16, v, header.correlation_id)
                );
                let decoded = decode(&frame).unwrap_or_else(|e| {
                    panic!("{:?} v{v} case {case}: {e}\nsent {header:?}\n{body:?}", api.key)
                });
                assert_eq!(decoded.header, header, "{:?} v{v} case {case}: header", api.key);
                assert!(
                    common::same_body(&decoded.body, &body),
                    "{:?} v{v} case {case} (seed {seed}): decoded body differs\nsent    {body:?}\ndecoded {:?}",
                    api.key,
                    decoded.body
                );
                checked += 1;
            }
        }
    }
    eprintln!("{checked} requests round-tripped");
}

/// The generators cover every field of at least one version: a default
/// request is not what most cases produce. Guards against a generator that
/// silently returns empty requests.
#[test]
fn generators_vary_their_output() {
    let mut g = Gen::new(7);
    for api in SUPPORTED {
        let v = api.max;
        let mut distinct = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let body = common::body(&mut g, api.key, v).expect("generator exists");
            let header = common::header(&mut g, api.key, v);
            distinct.insert(common::encode_frame(&header, &body).expect("encodes").to_vec());
        }
        assert!(
            distinct.len() > 25,
            "{:?}: only {} distinct requests",
            api.key,
            distinct.len()
        );
    }
}

/// Writes a few encoded requests of every supported (api, version) into
/// `$KEEL_FUZZ_SEED_DIR`, as seeds for `cargo fuzz` (`make fuzz-seeds`).
#[test]
#[ignore = "writes files; run through `make fuzz-seeds`"]
fn write_fuzz_seeds() {
    let dir = PathBuf::from(std::env::var("KEEL_FUZZ_SEED_DIR").expect("KEEL_FUZZ_SEED_DIR is set"));
    std::fs::create_dir_all(&dir).expect("seed dir");
    let mut g = Gen::new(0x5eed);
    let mut written = 0;
    for api in SUPPORTED {
        for v in api.min..=api.max {
            for n in 0..4 {
                let header = common::header(&mut g, api.key, v);
                let body = common::body(&mut g, api.key, v).expect("generator exists");
                let bytes = common::encode_frame(&header, &body).expect("encodes");
                let name = format!("{}-v{v}-{n}", api_name(api.key));
                std::fs::write(dir.join(name), &bytes).expect("write seed");
                written += 1;
            }
        }
    }
    eprintln!("wrote {written} seeds to {}", dir.display());
}

fn api_name(key: ApiKey) -> String {
    format!("{key:?}").to_lowercase()
}
