//! `oom`: the predicted time to OOM against the real kill of a leak into a cgroup limit.

use std::time::{Duration, Instant};

use resourcewatch_agent::pipelines::{PipelineOptions, Pipelines};

use crate::{fail, leaks::frame, workload::fork};

pub(crate) fn oom(limit: u64, rate: u64) {
    use resourcewatch_workloads::{MIB, Pattern};
    let mut pipes = Pipelines::load(PipelineOptions::default()).unwrap_or_else(|e| fail(&e));
    let layout = pipes.cgroup_layout().clone();
    let dir = limited_cgroup(layout.root(), limit);
    let mut builder = resourcewatch_agent::snapshot::FrameBuilder::new(1000, Some(layout.clone()));
    builder.leak_min_confidence = 0;
    // The child waits on a pipe until it is inside the cgroup.
    let mut p = [0i32; 2];
    // SAFETY: creating a pipe.
    unsafe { libc::pipe(p.as_mut_ptr()) };
    let gate = p[0];
    let pid = fork(move || {
        let mut b = [0u8; 1];
        // SAFETY: blocking read on our pipe end.
        unsafe { libc::read(gate, b.as_mut_ptr().cast(), 1) };
        resourcewatch_workloads::run(
            &Pattern::Leak {
                baseline: 10 * MIB,
                rate,
                delay: Duration::ZERO,
            },
            &|| false,
        );
    });
    std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap_or_else(|e| fail(&e));
    let start = Instant::now();
    // SAFETY: releasing the child.
    unsafe { libc::write(p[1], b"x".as_ptr().cast(), 1) };
    let mut half: Option<(f64, f64)> = None;
    let killed_at;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let mut status = 0;
        // SAFETY: non-blocking check on our child.
        if unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) } == pid as i32 {
            killed_at = start.elapsed().as_secs_f64();
            let sig = if libc::WIFSIGNALED(status) {
                libc::WTERMSIG(status)
            } else {
                0
            };
            println!(
                "child ended at {killed_at:.1} s, signal {sig} (9 = SIGKILL from the OOM killer)"
            );
            break;
        }
        let f = frame(&mut pipes, &mut builder);
        let usage = resourcewatch_agent::leak::memory_limit::read_one(&dir)
            .map(|l| l.usage_bytes)
            .unwrap_or(0);
        if half.is_none()
            && usage >= limit / 2
            && let Some(row) = f.leaks.iter().find(|r| r.pid == Some(pid))
            && let Some(tto) = row.time_to_oom_secs
        {
            let t = start.elapsed().as_secs_f64();
            println!(
                "half-way at {t:.1} s: usage {} MiB of {} MiB, confidence {}, growth {:.2} MiB/s, predicted OOM in {tto:.0} s",
                usage >> 20,
                limit >> 20,
                row.confidence,
                row.growth_bytes_per_sec / 1048576.0
            );
            half = Some((t, tto));
        }
        if start.elapsed() > Duration::from_secs(3600) {
            fail(&"no OOM kill within an hour");
        }
    }
    let _ = std::fs::remove_dir(&dir);
    report(half, killed_at);
}

/// A new memory cgroup under `root` (v1 or v2) limited to `limit` bytes.
fn limited_cgroup(root: &std::path::Path, limit: u64) -> std::path::PathBuf {
    let dir = root.join(format!("rw-oom-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(&format!("{}: {e}", dir.display())));
    let limit_file = if dir.join("memory.max").exists() {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    std::fs::write(dir.join(limit_file), limit.to_string()).unwrap_or_else(|e| fail(&e));
    dir
}

/// The prediction made half-way ((seconds since start, predicted seconds to OOM)) against
/// the kill, `killed_at` seconds after the start.
fn report(half: Option<(f64, f64)>, killed_at: f64) {
    match half {
        Some((t, tto)) => {
            let real = killed_at - t;
            crate::record::figure("oom.predicted_at_half_way", tto, "s");
            crate::record::figure("oom.real_from_half_way", real, "s");
            crate::record::figure("oom.error", 100.0 * (tto - real).abs() / real, "%");
            println!(
                "predicted {tto:.1} s, real {real:.1} s from half-way: error {:.1} %",
                100.0 * (tto - real).abs() / real
            );
        }
        None => println!("no prediction was made before half-way"),
    }
}
