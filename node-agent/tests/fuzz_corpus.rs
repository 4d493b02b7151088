//! The fuzz targets' committed corpora (`node-agent/fuzz/corpus/`) replayed through the
//! entry points libFuzzer calls, each input as committed and in mutations of it, in this
//! test build: a panic or an allocation over 64 MiB at once fails (resourcewatch-fuzz-replay
//! says why this replaces libFuzzer in `make test`; `make fuzz` runs libFuzzer).

use std::path::PathBuf;

use resourcewatch_agent::fuzzing;
use resourcewatch_fuzz_replay::{replay, targets};

/// Mutations of each committed input (about 1,300 inputs here).
const MUTATIONS: u32 = 256;

fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

fn corpus(target: &str) -> PathBuf {
    fuzz_dir().join("corpus").join(target)
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
    replay(&corpus("demangle"), MUTATIONS, fuzzing::demangle);
}

#[test]
fn elf_file() {
    replay(&corpus("elf_file"), MUTATIONS, fuzzing::elf_file);
}

#[test]
fn jvm_reply() {
    replay(&corpus("jvm_reply"), MUTATIONS, fuzzing::jvm_reply);
}

#[test]
fn perf_map() {
    replay(&corpus("perf_map"), MUTATIONS, fuzzing::perf_map);
}

#[test]
fn proc_maps() {
    replay(&corpus("proc_maps"), MUTATIONS, fuzzing::maps);
}

#[test]
fn python_memory() {
    replay(&corpus("python_memory"), MUTATIONS, fuzzing::python_memory);
}
