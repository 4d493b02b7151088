//! CPU profiles asked for on a watch: the hot function and its callers in each runtime, stored in a ConfigMap the watch owns.

use super::*;

/// A profile of the fixture `command` (a CPU burner in the C workloads image, run as a
/// non-root user) asked for on the watch for 5 s: it succeeds, its five hottest
/// functions and its ConfigMap. The watch `w` selects the pod `burner`.
pub(crate) async fn profiled(
    prefix: &str,
    command: &str,
) -> (
    Client,
    harness::TestNamespace,
    Api<ResourceWatch>,
    resourcewatch_crds::ProfileStatus,
    k8s_openapi::api::core::v1::ConfigMap,
) {
    profiled_of(prefix, Leaker::C(command)).await
}

/// [`profiled`] for any program a leak-site test runs.
pub(crate) async fn profiled_of(
    prefix: &str,
    program: Leaker<'_>,
) -> (
    Client,
    harness::TestNamespace,
    Api<ResourceWatch>,
    resourcewatch_crds::ProfileStatus,
    k8s_openapi::api::core::v1::ConfigMap,
) {
    let (client, ns) = harness::test_namespace(prefix).await;
    let n = ns.name.clone();
    // The operator may write ConfigMaps only where a namespace admin let it.
    harness::bind_to_operator(&n, "resourcewatch-profiler", "resourcewatch-system")
        .expect("bind the profiler role");
    let rws = harness::watch_app(&client, &n, "w", "burner").await;
    let command = match program {
        Leaker::C(command) => {
            harness::c_workload_pod(&client, &n, "burner", command, "64Mi").await;
            command.to_owned()
        }
        Leaker::CVm(command) => {
            let vm = harness::Placement::Vm;
            harness::c_workload_pod_on(&client, &n, "burner", command, "64Mi", vm).await;
            format!("{command} on {}", harness::VM_NODE)
        }
        Leaker::Node(args) => {
            harness::node_workload_pod(&client, &n, "burner", args, "256Mi").await;
            format!("node {}", args.join(" "))
        }
        Leaker::Python(args) => {
            harness::python_workload_pod(&client, &n, "burner", args, "64Mi").await;
            args.join(" ")
        }
        Leaker::Java(args) => {
            harness::java_workload_pod(&client, &n, "burner", args, "256Mi").await;
            format!("java {}", args.join(" "))
        }
    };
    wait_running(&client, &n, &["burner"]).await;
    status_where(&rws, "w", "the burner in topCPU", 60, |s| {
        s.top_cpu.iter().any(|e| e.pod == "burner")
    })
    .await;
    let asked = std::time::Instant::now();
    annotate(&rws, "pod=burner,duration=5s").await;
    let p = profile_done(&rws, "the profile done", 90).await;
    // 5 s at 99 Hz of a process on a CPU all the time: about 500 samples. On the VM node
    // the burner shares two emulated CPUs with that node's kubelet and agent.
    let least = if matches!(program, Leaker::CVm(_)) {
        150
    } else {
        300
    };
    assert!((least..=600).contains(&p.samples), "{} samples", p.samples);
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &n)
        .get(p.config_map.as_deref().expect("a ConfigMap"))
        .await
        .expect("the profile's ConfigMap");
    eprintln!(
        "profile of {command}: {} samples, hottest {:?}, Succeeded {:.1} s after the annotation",
        p.samples,
        p.hottest,
        asked.elapsed().as_secs_f64()
    );
    (client, ns, rws, p, cm)
}

/// The profile of watch `w` once it is no longer pending; it must have succeeded.
pub(crate) async fn profile_done(
    rws: &Api<ResourceWatch>,
    what: &str,
    secs: u64,
) -> resourcewatch_crds::ProfileStatus {
    use resourcewatch_crds::ProfileState;
    let s = status_where(rws, "w", what, secs, |s| {
        s.profile
            .as_ref()
            .is_some_and(|p| p.state != ProfileState::Pending)
    })
    .await;
    let p = s.profile.expect("profile");
    assert_eq!(p.state, ProfileState::Succeeded, "{p:?}");
    p
}

pub(crate) async fn annotate(rws: &Api<ResourceWatch>, value: &str) {
    let patch = serde_json::json!({"metadata": {"annotations": {
        resourcewatch_crds::PROFILE_ANNOTATION: value}}});
    rws.patch("w", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate");
}

pub(crate) fn folded(cm: &k8s_openapi::api::core::v1::ConfigMap) -> String {
    cm.data
        .as_ref()
        .and_then(|d| d.get("profile.folded").cloned())
        .unwrap_or_default()
}

/// A CPU profile asked for on the watch (`resourcewatch.io/profile`): a C program burning
/// a core in `burn_here`, reached through `outer` and `middle` (frame pointers), run as a
/// non-root user, profiled for 5 s at 99 Hz. The status says Succeeded with `burn_here`
/// the hottest function, the ConfigMap holds folded stacks naming the call path, an SVG
/// flame graph and gzipped pprof, and an Event says where it is. The same annotation value
/// is not taken twice; a new one within the namespace's minute is refused, with an Event.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_profile_asked_for_on_the_watch_names_the_hot_function() {
    use resourcewatch_crds::ProfileState;
    let (client, ns, rws, p, cm) = profiled("rw-e2e-profile", "/burn-c").await;
    let n = ns.name.as_str();
    assert_eq!(p.hottest[0].function, "burn_here", "{:?}", p.hottest);
    assert!(p.hottest[0].percent >= 80.0, "{:?}", p.hottest);
    let folded = folded(&cm);
    assert!(
        folded
            .lines()
            .any(|l| l.contains("main;outer;middle;burn_here")),
        "{folded}"
    );
    let data = cm.data.unwrap_or_default();
    assert!(
        data["profile.svg"].contains("burn_here"),
        "an SVG naming it"
    );
    let pprof = &cm.binary_data.unwrap_or_default()["profile.pb.gz"];
    assert_eq!(pprof.0[..2], [0x1f, 0x8b], "gzipped pprof");
    harness::event_where(&client, n, "ProfileSucceeded", 30, |t| {
        t.contains("burn_here")
    })
    .await;
    // The value stays on the watch: it is not taken again.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let again = rws.get("w").await.expect("rw").status.unwrap_or_default();
    assert_eq!(again.profile.map(|x| x.id), Some(p.id));
    // A new value within the namespace's minute: refused, and said so.
    annotate(&rws, "pod=burner,duration=5s,request=2").await;
    let s = status_where(&rws, "w", "the second request refused", 30, |s| {
        s.profile
            .as_ref()
            .is_some_and(|p| p.state == ProfileState::Refused)
    })
    .await;
    assert!(
        s.profile
            .expect("profile")
            .message
            .contains("one profile per namespace")
    );
    wait_for("a ProfileRefused Event", Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            Ok((!harness::events(&client, n, "ProfileRefused")
                .await
                .is_empty())
            .then_some(()))
        }
    })
    .await
    .expect("ProfileRefused");
    // Deleting and recreating the watch does not reset the namespace's minute.
    rws.delete("w", &Default::default()).await.expect("delete");
    wait_for("the watch gone", Duration::from_secs(30), || {
        let rws = rws.clone();
        async move { Ok(rws.get_opt("w").await?.is_none().then_some(())) }
    })
    .await
    .expect("gone");
    let rws = harness::watch_app(&client, n, "w", "burner").await;
    annotate(&rws, "pod=burner,duration=5s,request=3").await;
    let s = status_where(
        &rws,
        "w",
        "the recreated watch's request refused",
        30,
        |s| {
            s.profile
                .as_ref()
                .is_some_and(|p| p.state != ProfileState::Pending)
        },
    )
    .await;
    let p = s.profile.expect("profile");
    assert_eq!(p.state, ProfileState::Refused, "{p:?}");
    assert!(p.message.contains("one profile per namespace"), "{p:?}");
    ns.delete().await;
}

/// A profile's result never replaces an object the watch does not own: with a ConfigMap
/// `w-profile` already there (someone else's), the profile fails saying so and the
/// ConfigMap is untouched.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_profile_never_overwrites_a_configmap_it_does_not_own() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use resourcewatch_crds::ProfileState;
    let (client, ns) = harness::test_namespace("rw-e2e-profile-owner").await;
    let n = ns.name.clone();
    harness::bind_to_operator(&n, "resourcewatch-profiler", "resourcewatch-system")
        .expect("bind the profiler role");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &n);
    let theirs: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "w-profile"}, "data": {"settings": "keep me"}
    }))
    .expect("cm");
    cms.create(&PostParams::default(), &theirs)
        .await
        .expect("someone else's ConfigMap");
    let rws = harness::watch_app(&client, &n, "w", "burner").await;
    harness::c_workload_pod(&client, &n, "burner", "/burn-c", "64Mi").await;
    wait_running(&client, &n, &["burner"]).await;
    status_where(&rws, "w", "the burner in topCPU", 60, |s| {
        s.top_cpu.iter().any(|e| e.pod == "burner")
    })
    .await;
    annotate(&rws, "pod=burner,duration=2s").await;
    let s = status_where(&rws, "w", "the profile done", 90, |s| {
        s.profile
            .as_ref()
            .is_some_and(|p| p.state != ProfileState::Pending)
    })
    .await;
    let p = s.profile.expect("profile");
    assert_eq!(p.state, ProfileState::Failed, "{p:?}");
    assert!(p.message.contains("does not own"), "{p:?}");
    let after = cms.get("w-profile").await.expect("still there");
    assert_eq!(
        after
            .data
            .unwrap_or_default()
            .get("settings")
            .map(String::as_str),
        Some("keep me")
    );
    assert!(
        after
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );
    ns.delete().await;
}

/// Go (frame pointers): the profile's hottest function is `main.burnHere`, and its folded
/// stacks hold the whole call path.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_go_profile_names_the_hot_function_and_its_callers() {
    let (_client, ns, _rws, p, cm) = profiled("rw-e2e-profile-go", "/burn-go").await;
    assert_eq!(p.hottest[0].function, "main.burnHere", "{:?}", p.hottest);
    assert!(p.hottest[0].percent >= 80.0, "{:?}", p.hottest);
    let folded = folded(&cm);
    assert!(
        folded
            .lines()
            .any(|l| l.contains("main.outer;main.middle;main.burnHere")),
        "{folded}"
    );
    ns.delete().await;
}

/// Samples of folded stacks (`a;b;c N` lines) whose frames include, in this order, frames
/// that are each of `path` (`frame_is`).
pub(crate) fn folded_samples_through(folded: &str, path: &[&str]) -> (u64, u64) {
    let (mut with, mut all) = (0, 0);
    for line in folded.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        all += n;
        let mut frames = stack.split(';');
        if path.iter().all(|p| frames.any(|f| frame_is(f, p))) {
            with += n;
        }
    }
    (with, all)
}

/// Rust without frame pointers: the hottest function is `burn_here`, and its stacks are
/// walked with .eh_frame through `middle` and `outer` to `main`.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_rust_profile_without_frame_pointers_names_the_hot_function_and_its_callers() {
    let (_client, ns, _rws, p, cm) = profiled("rw-e2e-profile-rs", "/burn-rs").await;
    assert!(
        frame_is(&p.hottest[0].function, "burn_here"),
        "{:?}",
        p.hottest
    );
    assert!(p.hottest[0].percent >= 80.0, "{:?}", p.hottest);
    let (with, all) =
        folded_samples_through(&folded(&cm), &["main", "outer", "middle", "burn_here"]);
    assert!(with * 10 >= all * 8, "{with} of {all}: {}", folded(&cm));
    ns.delete().await;
}

/// C at -O2 without frame pointers: `burn_here` under `middle`, `outer` and `main`.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_c_profile_without_frame_pointers_names_the_hot_function_and_its_callers() {
    let (_client, ns, _rws, p, cm) = profiled("rw-e2e-profile-c-nofp", "/burn-c-nofp").await;
    c_profile_names_burn_here(ns, p, cm).await;
}

/// The same on the VM node: its agent's perf events and .eh_frame unwinding on Linux 6.1.
#[tokio::test]
#[ignore = "needs the e2e cluster with its VM node: make e2e"]
async fn on_the_cgroup_v2_node_a_c_profile_names_the_hot_function_and_its_callers() {
    let (_client, ns, _rws, p, cm) =
        profiled_of("rw-e2e-profile-c-v2", Leaker::CVm("/burn-c-nofp")).await;
    c_profile_names_burn_here(ns, p, cm).await;
}

pub(crate) async fn c_profile_names_burn_here(
    ns: harness::TestNamespace,
    p: resourcewatch_crds::ProfileStatus,
    cm: k8s_openapi::api::core::v1::ConfigMap,
) {
    assert_eq!(p.hottest[0].function, "burn_here", "{:?}", p.hottest);
    assert!(p.hottest[0].percent >= 80.0, "{:?}", p.hottest);
    let folded = folded(&cm);
    assert!(
        folded
            .lines()
            .any(|l| l.contains("main;outer;middle;burn_here")),
        "{folded}"
    );
    ns.delete().await;
}

/// CPython 3.12+ with `-X perf` (its perf map, in the pod's /tmp) and Debian's 3.11 with
/// no flag (its frames, read by the kernel): the Python function burning the CPU is on
/// >= 80 % of the samples, under its Python caller (the leaf is the interpreter's C code:
/// "self" time stays honest).
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_python_profile_names_the_python_function_and_its_caller() {
    // Two namespaces: one profile per namespace per minute.
    for (prefix, argv) in [
        (
            "rw-e2e-profile-py",
            &["/usr/local/bin/python3", "-S", "-X", "perf", "/burn.py"][..],
        ),
        (
            "rw-e2e-profile-py311",
            &["/usr/bin/python3.11", "-S", "/burn.py"][..],
        ),
    ] {
        python_profile_names_burn_in_python(prefix, argv).await;
    }
}

pub(crate) async fn python_profile_names_burn_in_python(prefix: &str, args: &[&str]) {
    let (_client, ns, _rws, _p, cm) = profiled_of(prefix, Leaker::Python(args)).await;
    let folded = folded(&cm);
    let (with, all) = folded_samples_through(&folded, &["outer_python", "burn_in_python"]);
    assert!(with * 10 >= all * 8, "{with} of {all}: {folded}");
    ns.delete().await;
}

/// Node.js with `--perf-basic-prof` (node-agent/tests/fixtures/stacks/burn.js): the
/// JavaScript function burning the CPU is on >= 80 % of the samples, under its caller,
/// named from the perf map V8 writes in the pod's /tmp.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_node_profile_names_the_javascript_function_and_its_caller() {
    let args = [
        "--perf-basic-prof",
        "--interpreted-frames-native-stack",
        "/burn.js",
    ];
    let before = host_agents_anon_mib();
    let (_client, ns, _rws, _p, cm) = profiled_of("rw-e2e-profile-node", Leaker::Node(&args)).await;
    let folded = folded(&cm);
    let (with, all) = folded_samples_through(&folded, &["outerJs", "burnInJavaScript"]);
    assert!(with * 10 >= all * 8, "{with} of {all}: {folded}");
    ns.delete().await;
    // Naming a Node.js binary's frames takes some 50 MiB, which the agent must give back:
    // kept (glibc kept 57 of them), they filled its 192Mi limit over a few profiles until
    // the next one's BPF maps could not be allocated (ENOMEM). The same agent process's
    // anonymous memory (its file pages are the kernel's to reclaim), at most 32 MiB above
    // where it was before the profile: with the memory given back, what stays (arenas
    // split, caches) measured up to 15 MiB over the profile tests (18 MiB of the whole RSS
    // in a CI run; docs/ci-runs/2026-11-30-agent-profile-memory.md).
    let mut after = Vec::new();
    for _ in 0..20 {
        after = host_agents_anon_mib();
        let kept = after.iter().all(|&(pid, mib)| {
            before
                .iter()
                .find(|&&(p, _)| p == pid)
                .is_none_or(|&(_, was)| mib <= was + 32)
        });
        if !after.is_empty() && kept {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!(
        "the agent keeps its profile's memory: (pid, anonymous MiB) {before:?} before, {after:?} after"
    );
}

/// The anonymous resident memory (RssAnon) of the agents running in pods on this host,
/// (pid, MiB).
fn host_agents_anon_mib() -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let read =
            |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap_or_default();
        // The kernel's comm is the name cut to 15 bytes.
        if read("comm").trim() != "resourcewatch-a" || !read("cgroup").contains("kubepods") {
            continue;
        }
        let kib = read("status")
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
        if let Some(kib) = kib {
            out.push((pid, kib / 1024));
        }
    }
    out
}

/// OpenJDK 17 with `-XX:+PreserveFramePointer` and no JDK tool run: the agent asks the
/// JVM for its perf map, and the Java method burning the CPU is on >= 80 % of the samples,
/// under its Java caller.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_java_profile_names_the_java_method_and_its_caller() {
    let args = [
        "-XX:+PreserveFramePointer",
        "-XX:CompileCommand=quiet",
        "-XX:CompileCommand=dontinline,Burn::burnInJava",
        "-cp",
        "/",
        "Burn",
    ];
    let (_client, ns, _rws, _p, cm) = profiled_of("rw-e2e-profile-java", Leaker::Java(&args)).await;
    let folded = folded(&cm);
    let (with, all) = folded_samples_through(&folded, &["outerJava", "burnInJava"]);
    assert!(with * 10 >= all * 8, "{with} of {all}: {folded}");
    ns.delete().await;
}
