//! Replays the committed fuzz corpus (`fuzz/corpus/decode_request/`) and
//! any regression inputs (`fuzz/regressions/decode_request/`) through the
//! same path as the fuzz target, so CI checks them without nightly.
//!
//! Like the fuzz target (libfuzzer-sys aborts on any panic), a panic fails
//! the test even when `decode` catches it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use keel_protocol::alloc_guard::GuardedAlloc;
use keel_protocol::frame::{request_size, FRAME_PREFIX_BYTES};
use keel_protocol::{decode, RequestFrame};

#[global_allocator]
static ALLOC: GuardedAlloc = GuardedAlloc;

static PANICKED: AtomicBool = AtomicBool::new(false);

/// The body of `fuzz/fuzz_targets/decode_request.rs`.
fn fuzz_one(data: &[u8]) {
    if data.len() >= FRAME_PREFIX_BYTES {
        let mut prefix = [0u8; FRAME_PREFIX_BYTES];
        prefix.copy_from_slice(&data[..FRAME_PREFIX_BYTES]);
        let _ = request_size(prefix, 100 << 20);
    }
    if let Ok(frame) = RequestFrame::parse(Bytes::copy_from_slice(data)) {
        let _ = decode(&frame);
    }
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.map(|e| e.expect("dir entry").path()).collect();
    files.sort();
    files
}

#[test]
fn corpus_and_regressions_decode_without_panicking() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICKED.store(true, Ordering::SeqCst);
        default_hook(info);
    }));
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let corpus = inputs(&fuzz.join("corpus/decode_request"));
    assert!(
        corpus.len() > 100,
        "fuzz corpus missing or tiny: {} files",
        corpus.len()
    );
    let regressions = inputs(&fuzz.join("regressions/decode_request"));
    for path in corpus.iter().chain(&regressions) {
        let data = std::fs::read(path).expect("read input");
        fuzz_one(&data);
        assert!(!PANICKED.load(Ordering::SeqCst), "{} panicked", path.display());
    }
}
