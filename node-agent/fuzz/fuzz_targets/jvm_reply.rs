//! An answer on a JVM's attach socket (or an impostor's).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| resourcewatch_agent::fuzzing::jvm_reply(data));
