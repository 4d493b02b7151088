//! The fuzz targets' committed corpora (`node-agent/fuzz/corpus/`) replayed through the
//! entry points libFuzzer calls, each input as committed and in mutations of it, in this
//! test build: a panic or an allocation over 64 MiB at once fails (resourcewatch-fuzz-replay
//! says why this replaces libFuzzer in `make test`; `make fuzz` runs libFuzzer).

use std::path::PathBuf;

use resourcewatch_agent::fuzzing;
use resourcewatch_fuzz_replay::{MUTATIONS, corpus, replay, targets};

fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

#[test]
fn every_fuzz_target_is_replayed_here() {
    assert_eq!(
        targets(&fuzz_dir()),
        [
            "demangle",
            "elf_file",
            "jvm_reply",
            "perf_map",
            "proc_maps",
            "python_memory"
        ],
        "a fuzz target was added or removed: replay it below"
    );
}

#[test]
fn demangle() {
    replay(
        &corpus(&fuzz_dir(), "demangle"),
        MUTATIONS,
        fuzzing::demangle,
    );
}

#[test]
fn elf_file() {
    replay(
        &corpus(&fuzz_dir(), "elf_file"),
        MUTATIONS,
        fuzzing::elf_file,
    );
}

#[test]
fn jvm_reply() {
    replay(
        &corpus(&fuzz_dir(), "jvm_reply"),
        MUTATIONS,
        fuzzing::jvm_reply,
    );
}

#[test]
fn perf_map() {
    replay(
        &corpus(&fuzz_dir(), "perf_map"),
        MUTATIONS,
        fuzzing::perf_map,
    );
}

#[test]
fn proc_maps() {
    replay(&corpus(&fuzz_dir(), "proc_maps"), MUTATIONS, fuzzing::maps);
}

#[test]
fn python_memory() {
    replay(
        &corpus(&fuzz_dir(), "python_memory"),
        MUTATIONS,
        fuzzing::python_memory,
    );
}
