//! A node agent's report and capabilities as the operator receives them (protobuf from
//! any holder of a node's credentials), cleaned by `validate` against the node's targets.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| resourcewatch_operator_core::fuzzing::agent_report(data));
