//! CPython code and str objects in a workload's memory (pointers and lengths are the workload's).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| resourcewatch_agent::fuzzing::python_memory(data));
