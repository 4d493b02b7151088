//! What the operator's and the agents' processes share at run time, so both behave the
//! same way to the people who run them: how they log ([`logging`]), how an error and its
//! causes are printed ([`error_chain`]), the standard `process_*` metrics and build info
//! ([`telemetry`]), and the HTTPS listener behind `/metrics` and the probes ([`https`]).
//! The operator's core does not depend on it: it decides, it does not run.

pub mod https;
pub mod logging;
pub mod telemetry;

/// An error and its causes as one line (`a: b: c`): what logs, NACK reasons, status
/// conditions and the command lines show. Each error's own message leaves its cause out
/// when it attaches it as its source (the convention of the standard library and kube's
/// errors), so every cause is printed once.
pub fn error_chain(e: &(dyn std::error::Error + '_)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("reading {path}")]
        Read {
            path: &'static str,
            #[source]
            source: std::io::Error,
        },
    }

    #[test]
    fn each_cause_is_printed_once() {
        let e = Outer::Read {
            path: "/x",
            source: std::io::Error::other("denied"),
        };
        assert_eq!(error_chain(&e), "reading /x: denied");
    }
}
