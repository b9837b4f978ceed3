//! Replays the committed corpus of the `produce_append` fuzz target
//! (`fuzz/corpus/produce_append/`) and its regression inputs
//! (`fuzz/regressions/produce_append/`) through the same driver, so CI
//! checks them without nightly.

use std::path::{Path, PathBuf};

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.map(|e| e.expect("dir entry").path()).collect();
    files.sort();
    files
}

#[test]
fn produce_append_corpus_and_regressions_hold_their_invariants() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let corpus = inputs(&fuzz.join("corpus/produce_append"));
    assert!(
        corpus.len() > 20,
        "fuzz corpus missing or tiny: {} files",
        corpus.len()
    );
    for path in corpus
        .iter()
        .chain(&inputs(&fuzz.join("regressions/produce_append")))
    {
        let data = std::fs::read(path).expect("read input");
        let ran = std::panic::catch_unwind(|| keel_broker::fuzzing::produce_append(&data));
        assert!(ran.is_ok(), "{} broke an invariant", path.display());
    }
}
