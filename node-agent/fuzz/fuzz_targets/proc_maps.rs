//! A workload's /proc/PID/maps.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| resourcewatch_agent::fuzzing::maps(data));
