//! `jvm-heap`: what reading a JVM's heap costs.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use crate::fail;

/// Times what the agent does once a second per tracked JVM: open (inside its root), read
/// and parse its hsperfdata file.
pub(crate) fn jvm_heap(reads: u32) {
    let dir = std::env::temp_dir().join(format!("rw-jvm-heap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(&e));
    let src = dir.join("Idle.java");
    std::fs::write(
        &src,
        "class Idle { public static void main(String[] a) throws Exception { Thread.sleep(600000); } }",
    )
    .unwrap_or_else(|e| fail(&e));
    let mut java = Command::new("java")
        .args(["-Xmx64m"])
        .arg(&src)
        .spawn()
        .unwrap_or_else(|e| fail(&format!("java: {e}")));
    let pid = java.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    let path = loop {
        if let Some(p) = resourcewatch_agent::leak::jvm::find(pid)
            && resourcewatch_agent::leak::jvm::read(pid, &p).is_some()
        {
            break p;
        }
        if Instant::now() > deadline {
            let _ = java.kill();
            fail(&format!("no readable hsperfdata for JVM {pid} within 30 s"));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // Let the JVM's start-up (class loading, JIT) finish: it shares the CPUs.
    std::thread::sleep(Duration::from_secs(5));
    let size = std::fs::metadata(format!("/proc/{pid}/root/{path}")).map_or(0, |m| m.len());
    let start = Instant::now();
    let mut sum = 0u64;
    for _ in 0..reads {
        sum = sum.wrapping_add(
            resourcewatch_agent::leak::jvm::read(pid, &path)
                .unwrap_or_else(|| fail(&"the hsperfdata file stopped parsing"))
                .retained_bytes,
        );
    }
    let each = start.elapsed().as_secs_f64() / f64::from(reads.max(1));
    let _ = java.kill();
    let _ = java.wait();
    let _ = std::fs::remove_dir_all(&dir);
    crate::record::figure("jvm_heap.read", each * 1e6, "us");
    println!(
        "{reads} reads of {path} inside JVM {pid}'s root ({} bytes): {:.1} us each, {:.5} % of a core at one read per second (retained sum {sum})",
        size,
        each * 1e6,
        each * 100.0
    );
}
