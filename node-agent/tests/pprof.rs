//! The agent's pprof as Go's own pprof reads it (Go ships `go tool pprof`; Pyroscope and
//! Parca read the same format): the samples' labels (`-tags`), a filter on them
//! (`-tagfocus`) and the stacks under it.

mod common;

use std::{path::PathBuf, process::Command, sync::Arc, time::Duration};

use resourcewatch_agent::stacks::{
    Module, Stack,
    output::{Label, PprofKind, pprof},
};

/// Go's toolchain: on PATH, or where the machine keeps it.
fn go() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("go"))
        .chain([PathBuf::from("/usr/local/go/bin/go")])
        .find(|g| g.is_file())
}

fn stack(tgid: u32, comm: &str, frames: &[&str], value: u64) -> Stack {
    // The command has no file; the rest are in the program.
    let program = Arc::new(Module {
        path: format!("/usr/bin/{comm}").into(),
        build_id: Some(format!("{tgid:08x}").into()),
    });
    Stack {
        tgid,
        comm: Some(comm.into()),
        frames: std::iter::once(comm)
            .chain(frames.iter().copied())
            .map(String::from)
            .collect(),
        modules: std::iter::once(None)
            .chain(frames.iter().map(|_| Some(program.clone())))
            .collect(),
        kernel_frames: 0,
        value,
    }
}

#[test]
fn go_tool_pprof_reads_the_samples_labels_and_filters_on_them() {
    const TEST: &str = "go_tool_pprof_reads_the_samples_labels_and_filters_on_them";
    let Some(go) = go() else {
        return common::skip(TEST, "no Go toolchain for `go tool pprof`");
    };
    // A pod of two containers: its app burning CPU, its proxy polling.
    let stacks = [
        stack(4242, "api", &["main", "handle", "burn_here"], 30),
        stack(4343, "envoy", &["main", "poll_here"], 10),
    ];
    let gz = pprof(
        &stacks,
        PprofKind {
            sample_type: "samples",
            sample_unit: "count",
            scaled: Some(("cpu", "nanoseconds", 10_101_010)),
            duration: Duration::from_secs(5),
        },
        |s| {
            vec![
                Label::Number("pid", s.tgid.into()),
                Label::Text("process", s.comm.clone().unwrap_or_default()),
                Label::Text("namespace", "team-a".into()),
                Label::Text("pod", "api-7f9c".into()),
                Label::Text(
                    "container",
                    if s.tgid == 4242 { "app" } else { "proxy" }.into(),
                ),
                Label::Text("node", "n1".into()),
            ]
        },
    )
    .expect("pprof");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("labels-{}.pb.gz", std::process::id()));
    std::fs::write(&path, gz).expect("write the profile");
    let pprof_tool = |args: &[&str]| {
        let out = Command::new(&go)
            .args(["tool", "pprof"])
            .args(args)
            .arg(&path)
            .output()
            .expect("run go tool pprof");
        assert!(
            out.status.success(),
            "go tool pprof {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let tags = pprof_tool(&["-tags"]);
    for want in [
        "container: Total",
        "app",
        "proxy",
        "namespace: Total",
        "team-a",
        "pod: Total",
        "api-7f9c",
        "node: Total",
        "process: Total",
        "envoy",
        "pid: Total",
        "4242",
    ] {
        assert!(tags.contains(want), "{want} not in:\n{tags}");
    }
    // Only the app container's samples, by its label: its functions, not the proxy's.
    let top = pprof_tool(&["-top", "-tagfocus=container=app"]);
    assert!(
        top.contains("burn_here") && !top.contains("poll_here"),
        "{top}"
    );
    // The files the functions are in, with their build IDs (`-raw` lists the mappings).
    let raw = pprof_tool(&["-raw"]);
    for want in [
        "/usr/bin/api",
        "/usr/bin/envoy",
        &format!("{:08x}", 4242),
        &format!("{:08x}", 4343),
    ] {
        assert!(raw.contains(want), "{want} not in:\n{raw}");
    }
    let _ = std::fs::remove_file(&path);
}
