//! A ResourceWatch's spec as a user writes it (JSON, after the API server's schema), read
//! into the operator's settings, and the profile annotation's value.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| resourcewatch_operator_core::fuzzing::watch_spec(data));
