//! What the agent's integration tests share: how a test that cannot run on this machine
//! says so.
//!
//! libtest has no runtime skip (`#[ignore]` is decided at compile time) and hides the
//! stderr of passing tests, so a kernel test returning early would pass silently. A skip
//! is therefore printed, appended to `<target>/tmp/skipped-tests.txt` (which `make unit`
//! lists with its count), and, when `RW_REQUIRE_PRIVILEGED_TESTS` is set (CI on a machine
//! that can run them all), a failure.

use std::io::Write;

/// Skips `test` for `why`, or fails it where every test is required to run.
pub fn skip(test: &str, why: &str) {
    if std::env::var_os("RW_REQUIRE_PRIVILEGED_TESTS").is_some_and(|v| v != "0") {
        panic!("{test} could not run here: {why} (RW_REQUIRE_PRIVILEGED_TESTS is set)");
    }
    eprintln!("SKIPPED {test}: {why}");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        let _ = writeln!(f, "{test}: {why}");
    }
}

/// Why the BPF tests cannot run here (not root, no BTF, a kernel without the tracepoints),
/// or None.
pub fn kernel_missing() -> Option<String> {
    resourcewatch_agent::capabilities::probe().fatal()
}

#[allow(
    dead_code,
    reason = "each test binary compiles this module; cli.rs has no BPF test"
)]
static KERNEL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The lock serialising the BPF tests of one binary, or None (with the reason recorded as
/// a skip) when this machine can't run them.
#[allow(
    dead_code,
    reason = "each test binary compiles this module; cli.rs has no BPF test"
)]
pub fn kernel_or_skip(test: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    if let Some(why) = kernel_missing() {
        skip(test, &why);
        return None;
    }
    Some(KERNEL.lock().unwrap_or_else(|e| e.into_inner()))
}
