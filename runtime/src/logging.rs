//! How both binaries log: one filter variable ([`FILTER_ENV`], tracing's `EnvFilter`
//! directives) and one format switch (`--log-format`, or [`FORMAT_ENV`]): text for a
//! terminal, JSON lines for a log pipeline. In JSON the event's own fields are at the top
//! level (`pod`, `error`, ...), the innermost span's under `span` and every enclosing
//! span's, outermost first, under `spans` (`watch` of the operator's reconciliation,
//! `node` of an agent): a library's span at debug level (hyper, h2) can be innermost, so
//! a pipeline joins on `spans`.

use std::str::FromStr;

pub const FILTER_ENV: &str = "RESOURCEWATCH_LOG";
pub const FORMAT_ENV: &str = "RESOURCEWATCH_LOG_FORMAT";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    #[default]
    Text,
    Json,
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            _ => Err(format!("{s:?}: the log format is text or json")),
        }
    }
}

/// Installs the global subscriber, writing to stderr. The filter is [`FILTER_ENV`], else
/// `default_filter`. A filter that does not parse is an error, not a silent default.
pub fn init(format: Format, default_filter: &str) -> Result<(), String> {
    let (var, directives) = std::env::var(FILTER_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| (FILTER_ENV, s))
        .unwrap_or(("the default", default_filter.to_owned()));
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .map_err(|e| format!("log filter {var}={directives:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        Format::Text => builder.init(),
        Format::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_others_are_refused() {
        assert_eq!("json".parse::<Format>(), Ok(Format::Json));
        assert_eq!("text".parse::<Format>(), Ok(Format::Text));
        assert!("JSON ".parse::<Format>().is_err());
    }
}
