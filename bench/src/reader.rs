//! `reader`: what a request to the reader process costs (node-agent/src/reader/): the
//! round trip of each kind (the descriptor sent, the parse, the answer read back and
//! decoded by the agent), per file, cold (a reader started for the file) and warm, and
//! the reader's and this process's resident memory after.

use std::time::Instant;

use resourcewatch_agent::reader::{Kind, Reader};

use crate::fail;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub(crate) fn reader_cost(files: &[String], rounds: usize) {
    println!(
        "{:<48} {:>8} {:>11} {:>11} {:>10}",
        "file / kind", "rounds", "cold ms", "warm ms", "answer KiB"
    );
    let me = std::process::id();
    let maps = format!("/proc/{me}/maps");
    let mut cases: Vec<(String, Kind)> = vec![(maps, Kind::Maps)];
    for f in files {
        cases.push((f.clone(), Kind::Tables));
        cases.push((f.clone(), Kind::Symbols));
    }
    for (path, kind) in &cases {
        let (mut cold, mut warm, mut bytes) = (Vec::new(), Vec::new(), 0usize);
        for _ in 0..rounds {
            for (first, into) in [(true, &mut cold), (false, &mut warm)] {
                let mut reader = Reader::default();
                if !first {
                    // Started, and its pages touched, by a request before the one timed.
                    let f = std::fs::File::open(path).unwrap_or_else(|e| fail(&e));
                    let _ = reader.call(*kind, std::os::fd::AsFd::as_fd(&f));
                }
                let f = std::fs::File::open(path).unwrap_or_else(|e| fail(&e));
                let t = Instant::now();
                let out = reader.call(*kind, std::os::fd::AsFd::as_fd(&f));
                into.push(t.elapsed().as_secs_f64() * 1e3);
                match out {
                    Ok(b) => bytes = b.len(),
                    Err(e) => fail(&format!("{path} as {kind:?}: refused ({})", e.reason())),
                }
            }
        }
        let name = std::path::Path::new(path)
            .file_name()
            .map_or_else(|| path.clone(), |n| n.to_string_lossy().into_owned());
        let (c, w) = (median(&mut cold), median(&mut warm));
        println!(
            "{:<48} {:>8} {:>11.2} {:>11.2} {:>10.1}",
            format!("{name} {kind:?}"),
            rounds,
            c,
            w,
            bytes as f64 / 1024.0
        );
        let key = format!("reader.{}.{kind:?}", name.replace('.', "_"));
        crate::record::figure(&format!("{key}.cold_ms"), c, "ms");
        crate::record::figure(&format!("{key}.warm_ms"), w, "ms");
        crate::record::figure(&format!("{key}.answer_kib"), bytes as f64 / 1024.0, "KiB");
    }
    // A reader at rest: started, confined, and one maps request answered (what stays of
    // it beside an idle agent; one that passed 24 MiB after an answer is restarted).
    let mut idle = Reader::default();
    let f = std::fs::File::open(format!("/proc/{me}/maps")).unwrap_or_else(|e| fail(&e));
    if let Err(e) = idle.call(Kind::Maps, std::os::fd::AsFd::as_fd(&f)) {
        fail(&format!("a maps request: refused ({})", e.reason()));
    }
    let idle_rss = idle
        .pid()
        .and_then(resourcewatch_agent::procfs::resident_pages)
        .unwrap_or_else(|| fail(&"the reader is gone after a maps request"))
        * resourcewatch_agent::procfs::page_size();
    report_mib(
        "a reader at rest (one maps request answered)",
        "reader.idle_rss_mib",
        idle_rss,
    );
    let rss = resourcewatch_agent::procfs::resident_pages(me).unwrap_or(0)
        * resourcewatch_agent::procfs::page_size();
    report_mib("this process after", "reader.bench_rss_mib", rss);
}

/// Prints `bytes` resident as MiB and records it as the figure `key`.
fn report_mib(what: &str, key: &str, bytes: u64) {
    let mib = bytes as f64 / f64::from(1 << 20);
    println!("{what}: {mib:.1} MiB resident");
    crate::record::figure(key, mib, "MiB");
}
