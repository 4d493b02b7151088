//! A ResourceWatch's spec as a user writes it (JSON, after the API server's schema), read
//! into the operator's settings, and the profile annotation's value.
#![no_main]
use resourcewatch_crds::ResourceWatchSpec;
use resourcewatch_operator_core::{profile, spec};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(s) = serde_json::from_slice::<ResourceWatchSpec>(data) {
        let _ = spec::WatchSettings::from_spec(&s, &spec::Floors::default());
        let _ = spec::validate_selector(&s.selector);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = profile::parse(text);
    }
});
