//! A runtime's perf map (/tmp/perf-PID.map), written by the workload.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| resourcewatch_agent::fuzzing::perf_map(data));
