//! Profiles to the cluster's OTLP collector: a CPU profile and a leak's growth sites, with their pod's labels.

use super::*;

/// The collector a test runs, killed when dropped.
pub(crate) struct Collector(std::process::Child);

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A CPU profile sent on to the cluster's OTLP collector, named by the Secret
/// `resourcewatch-otlp` in the operator's namespace (read at each export: no restart). An
/// OpenTelemetry Collector built from its Go modules (`e2e/otel/collector.sh`) runs on
/// this machine with the profiles feature gate and prints what it receives (its debug
/// exporter, detailed): the profile arrives with its pod's namespace, name and node as
/// resource attributes, its container and PID on the samples, the hot function and the
/// program's file with its GNU build ID in the dictionary. Then a leak in the same
/// namespace: once its growth site is announced, its sites arrive as a memory profile
/// (`resident_growth`) with the leaking pod's labels and the site's functions.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_profile_is_sent_to_the_clusters_otlp_collector_with_its_pods_labels() {
    use k8s_openapi::api::core::v1::Secret;
    let bin = std::env::var("RW_OTELCOL").expect(
        "RW_OTELCOL: the collector e2e/otel/collector.sh build makes (run-cluster-tests.sh sets it)",
    );
    let client = harness::client().await.expect("cluster");
    // The operator reaches this machine at the address of the node it runs on.
    let operator = Api::<Pod>::namespaced(client.clone(), SYSTEM)
        .list(&ListParams::default().labels("app.kubernetes.io/name=resourcewatch-operator"))
        .await
        .expect("operator pods");
    let host_ip = operator
        .items
        .iter()
        .find_map(|p| p.status.as_ref()?.host_ip.clone())
        .expect("the operator's node address");
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let dir = tempfile_dir("rw-e2e-otelcol");
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 0.0.0.0:{port}\n\
             exporters:\n  debug:\n    verbosity: detailed\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    profiles:\n      \
             receivers: [otlp]\n      exporters: [debug]\n"
        ),
    )
    .expect("collector config");
    let out = dir.join("received.log");
    let log = std::fs::File::create(&out).expect("collector log");
    let _collector = Collector(
        Command::new(&bin)
            .arg(format!("--config=file:{}", config.display()))
            .arg("--feature-gates=service.profilesSupport")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("the collector starts"),
    );
    let read = || std::fs::read_to_string(&out).unwrap_or_default();
    wait_for("the collector ready", Duration::from_secs(30), || async {
        Ok(read().contains("Everything is ready").then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", read()));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "resourcewatch-otlp"},
        "stringData": {
            "endpoint": format!("http://{host_ip}:{port}"),
            "headers": "x-scope-orgid: e2e",
        }
    }))
    .expect("secret");
    let _ = secrets
        .delete("resourcewatch-otlp", &DeleteParams::default())
        .await;
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the Secret");
    let (_client, ns, _rws, p, _cm) = profiled("rw-e2e-otlp", "/burn-c").await;
    let n = ns.name.clone();
    let wanted = [
        format!("k8s.namespace.name: Str({n})"),
        "k8s.pod.name: Str(burner)".to_owned(),
        format!("k8s.node.name: Str({})", p.node),
        "k8s.container.name: Str(main)".to_owned(),
        "process.pid: Int(".to_owned(),
        "burn_here".to_owned(),
        "/burn-c".to_owned(),
        "process.executable.build_id.gnu".to_owned(),
    ];
    let arrived = |what: &'static str, wanted: Vec<String>| async move {
        let got = wait_for(what, Duration::from_secs(30), || async {
            let text = read();
            Ok(wanted
                .iter()
                .all(|w| text.contains(w.as_str()))
                .then_some(()))
        })
        .await;
        if let Err(e) = got {
            let text = read();
            let missing: Vec<_> = wanted
                .iter()
                .filter(|w| !text.contains(w.as_str()))
                .collect();
            panic!("{e:#}; missing {missing:?} from what the collector printed:\n{text}");
        }
    };
    arrived("the CPU profile at the collector", wanted.to_vec()).await;
    eprintln!(
        "profile {} of {n}/burner received by the collector over OTLP",
        p.id
    );
    // A leak's growth sites, once a site is announced: a memory profile of the bytes each
    // stack added.
    let leaks = harness::watch_app(&client, &n, "wl", "leaker").await;
    harness::c_workload_pod(&client, &n, "leaker", "/leak-c", "1Gi").await;
    // Announced once its top site names a function (status::announced_site).
    let named = |l: &resourcewatch_crds::LeakEntry| -> Vec<String> {
        l.growth_sites
            .first()
            .map(|g| {
                g.frames
                    .iter()
                    .filter(|f| !f.starts_with('['))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    };
    let s = status_where(&leaks, "wl", "the leak's growth site named", 180, |s| {
        s.leaks
            .iter()
            .any(|l| l.pod == "leaker" && !named(l).is_empty())
    })
    .await;
    let leak = s.leaks.iter().find(|l| l.pod == "leaker").expect("leak");
    arrived(
        "the growth sites at the collector",
        vec![
            "k8s.pod.name: Str(leaker)".to_owned(),
            "resident_growth".to_owned(),
        ],
    )
    .await;
    // The sites sent are those of the announcement, a reconcile or two before this
    // status: one of the top site's functions is among them.
    let functions = named(leak);
    let text = read();
    assert!(
        functions.iter().any(|f| text.contains(f.as_str())),
        "none of {functions:?} in what the collector printed:\n{text}"
    );
    eprintln!(
        "growth sites of {n}/leaker received by the collector over OTLP (top: {:?})",
        leak.growth_sites[0].frames
    );
    let _ = secrets
        .delete("resourcewatch-otlp", &DeleteParams::default())
        .await;
    ns.delete().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory under the system's temporary one.
pub(crate) fn tempfile_dir(prefix: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}
