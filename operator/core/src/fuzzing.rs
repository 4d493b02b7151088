//! Entry points for the fuzz targets (`operator/fuzz/`) and their corpus replay (`make
//! unit`): what the operator reads from agents and users, from bytes. Not an API.

use prost::Message;
use resourcewatch_crds::ResourceWatchSpec;
use resourcewatch_proto as pb;

use crate::{profile, spec, validate};

/// A node agent's report and capabilities as the operator receives them (protobuf from
/// any holder of a node's credentials), cleaned by `validate` against the node's targets.
pub fn agent_report(data: &[u8]) {
    // The first byte splits the input: the node's configuration, then the report.
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let at = (split as usize * rest.len() / 256).min(rest.len());
    let config = pb::NodeConfig::decode(&rest[..at]).unwrap_or_default();
    if let Ok(mut report) = pb::Report::decode(&rest[at..]) {
        let _ = validate::report(&mut report, &validate::NodeTargets::new(&config));
    }
    if let Ok(mut caps) = pb::Capabilities::decode(rest) {
        validate::capabilities(&mut caps);
    }
}

/// A ResourceWatch's spec as a user writes it (JSON, after the API server's schema), read
/// into the operator's settings, and the profile annotation's value.
pub fn watch_spec(data: &[u8]) {
    if let Ok(s) = serde_json::from_slice::<ResourceWatchSpec>(data) {
        let _ = spec::WatchSettings::from_spec(&s, &spec::Floors::default());
        let _ = spec::validate_selector(&s.selector);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = profile::parse(text);
    }
}
