//! A symbol name from a workload's symbol table, demangled.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| resourcewatch_agent::fuzzing::demangle(data));
