//! The fuzz targets' committed corpora (`operator/fuzz/corpus/`) replayed through the
//! entry points libFuzzer calls, each input as committed and in mutations of it, in this
//! test build: a panic or an allocation over 64 MiB at once fails (resourcewatch-fuzz-replay
//! says why this replaces libFuzzer in `make test`; `make fuzz` runs libFuzzer).

use std::path::PathBuf;

use resourcewatch_fuzz_replay::{MUTATIONS, corpus, replay, targets};
use resourcewatch_operator_core::fuzzing;

fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

#[test]
fn every_fuzz_target_is_replayed_here() {
    assert_eq!(
        targets(&fuzz_dir()),
        ["agent_report", "watch_spec"],
        "a fuzz target was added or removed: replay it below"
    );
}

#[test]
fn agent_report() {
    replay(
        &corpus(&fuzz_dir(), "agent_report"),
        MUTATIONS,
        fuzzing::agent_report,
    );
}

#[test]
fn watch_spec() {
    replay(
        &corpus(&fuzz_dir(), "watch_spec"),
        MUTATIONS,
        fuzzing::watch_spec,
    );
}
