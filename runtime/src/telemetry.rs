//! Metrics both binaries expose the same way, so one dashboard and one alert reads either:
//! Prometheus' standard `process_*` series (what every client library exports: CPU
//! seconds, resident and virtual memory, file descriptors, threads, start time) and a
//! `<component>_build_info` series naming the version and the gRPC protocol spoken.
//!
//! The figures come from `metrics-process` (a port of client_golang's process collector,
//! read from /proc), used without the `metrics` facade: this crate encodes them with
//! `prometheus-client`, which both binaries already use.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge, info::Info},
    registry::Registry,
};

/// The `process_*` series of this process, read at each scrape.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = metrics_process::collector::collect();
        if let Some(cpu) = m.cpu_seconds_total {
            let family = encoder.encode_descriptor(
                // The encoder appends `_total` to a counter's name.
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(cpu).encode(family)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                m.resident_memory_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                m.virtual_memory_bytes,
            ),
            (
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes (0: unlimited).",
                m.virtual_memory_max_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                m.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (0: unlimited).",
                m.max_fds,
            ),
            (
                "process_threads",
                "Number of OS threads in the process.",
                m.threads,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                m.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            // A figure /proc did not give is left out rather than exported as 0.
            let Some(v) = value else { continue };
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(v as f64).encode(family)?;
        }
        Ok(())
    }
}

/// Registers `process_*` and `<prefix>_build_info{version, protocol}` (value 1) in
/// `registry`, which must be unprefixed: `process_*` names are fixed by convention.
/// `protocol` is the operator-agent protocol version the binary speaks.
pub fn register(registry: &mut Registry, prefix: &str, protocol: u32) {
    registry.register_collector(Box::new(ProcessCollector));
    registry.register(
        format!("{prefix}_build"),
        "The version of this binary and the version of the operator-agent protocol it speaks",
        Info::new(vec![
            ("version", env!("CARGO_PKG_VERSION").to_string()),
            ("protocol", protocol.to_string()),
        ]),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_process_series_and_build_info_are_exposed() {
        let mut r = Registry::default();
        register(&mut r, "resourcewatch_agent", 7);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
        };
        assert!(value("process_cpu_seconds_total") >= 0.0);
        // A test binary holds at least a few MiB resident, and started before now.
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_threads") >= 1.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        let start = value("process_start_time_seconds");
        assert!(
            start > now - 86_400.0 && start <= now + 1.0,
            "{start} vs {now}"
        );
        let info = format!(
            r#"resourcewatch_agent_build_info{{version="{}",protocol="7"}} 1"#,
            env!("CARGO_PKG_VERSION"),
        );
        assert!(
            text.lines().any(|l| l == info),
            "{info} missing from:\n{text}"
        );
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
    }
}
