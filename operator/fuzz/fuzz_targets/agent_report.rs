//! A node agent's report and capabilities as the operator receives them (protobuf from
//! any holder of a node's credentials), cleaned by `validate` against the node's targets.
#![no_main]
use prost::Message;
use resourcewatch_operator_core::validate;
use resourcewatch_proto as pb;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The first byte splits the input: the node's configuration, then the report.
    let Some((&split, rest)) = data.split_first() else { return };
    let at = (split as usize * rest.len() / 256).min(rest.len());
    let config = pb::NodeConfig::decode(&rest[..at]).unwrap_or_default();
    if let Ok(mut report) = pb::Report::decode(&rest[at..]) {
        let _ = validate::report(&mut report, &validate::NodeTargets::new(&config));
    }
    if let Ok(mut caps) = pb::Capabilities::decode(rest) {
        validate::capabilities(&mut caps);
    }
});
