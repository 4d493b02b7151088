//! The operator against a real kube-apiserver (the e2e cluster, or any `KUBECONFIG`), with
//! simulated agents speaking the real protocol. Run by `make e2e-api` (which starts the
//! API server); ignored by plain `cargo test`, since they need a cluster.
//!
//! Each test makes its own namespace and its own operator process; tests run one at a
//! time (`--test-threads=1`): two operators would both reconcile every watch.

use std::{collections::BTreeMap, process::Command, sync::Arc, time::Duration};

use kube::{Api, Client, ResourceExt, api::PostParams};
use resourcewatch_crds::{ConditionStatus, ResourceWatch};
use resourcewatch_e2e::{
    harness::{self, TestNamespace, events, wait_for},
    operator::OperatorProcess,
    sim::{AgentTls, PodPlan, SimAgent},
};

const MIB: u64 = 1 << 20;

fn labels(app: &str) -> BTreeMap<String, String> {
    [("app".to_string(), app.to_string())].into()
}

fn kubectl(args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    use std::io::Write;
    let mut cmd = Command::new(harness::kubectl());
    cmd.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl runs");
    if let Some(s) = stdin
        && let Some(mut i) = child.stdin.take()
    {
        i.write_all(s.as_bytes()).expect("stdin");
    }
    let out = child.wait_with_output().expect("kubectl output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn setup(prefix: &str) -> (Client, TestNamespace) {
    let client = harness::client().await.expect("a cluster (KUBECONFIG)");
    harness::install_crd(&client).await.expect("CRD installs");
    let ns = TestNamespace::create(&client, prefix)
        .await
        .expect("namespace");
    (client, ns)
}

/// Running pods (name, app label) on `node`, as kubelet would report them.
async fn fake_pods(client: &Client, ns: &str, node: &str, pods: &[(&str, &str)]) {
    for (name, app) in pods {
        harness::fake_running_pod(
            client,
            ns,
            name,
            &labels(app),
            node,
            &harness::container_id(&format!("{ns}/{name}")),
        )
        .await
        .expect("pod");
    }
}

/// The agent certificate and `node`'s pod-bound token.
async fn node_agent_tls(client: &Client, ns: &str, node: &str) -> AgentTls {
    AgentTls::from_secret(client, ns, "resourcewatch-agent-tls")
        .await
        .expect("agent secret")
        .for_node(
            harness::agent_token(client, ns, node)
                .await
                .expect("the node's agent token"),
        )
}

/// An eviction names the pod decided on by its UID: a pod replaced under the same name in
/// the window (a StatefulSet's) is left alone, and the decided pod counts as gone.
#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn an_eviction_never_reaches_a_pod_replaced_under_the_same_name() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::DeleteParams;
    use resourcewatch_operator::{controller::evict_pod, decide::EvictResult};
    let (client, ns) = setup("rw-uid").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let decided =
        harness::fake_running_pod(&client, &ns.name, "db-0", &labels("db"), "node-a", "c1")
            .await
            .expect("pod");
    let old_uid = decided.uid().expect("uid");
    pods.delete("db-0", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    wait_for("db-0 gone", Duration::from_secs(30), || async {
        Ok(pods.get_opt("db-0").await?.is_none().then_some(()))
    })
    .await
    .expect("the decided pod is deleted");
    let replacement =
        harness::fake_running_pod(&client, &ns.name, "db-0", &labels("db"), "node-a", "c2")
            .await
            .expect("replacement");
    let new_uid = replacement.uid().expect("uid");
    assert_ne!(old_uid, new_uid);
    let t = Duration::from_secs(10);
    let outcome = evict_pod(client.clone(), &ns.name, "db-0", &old_uid, t).await;
    assert_eq!(outcome, Some(EvictResult::Gone), "the decided pod is gone");
    let after = pods
        .get("db-0")
        .await
        .expect("the replacement is still there");
    assert_eq!(after.uid().as_deref(), Some(new_uid.as_str()));
    assert!(
        after.metadata.deletion_timestamp.is_none(),
        "the replacement was evicted"
    );
    // The decided pod itself is evicted.
    let outcome = evict_pod(client.clone(), &ns.name, "db-0", &new_uid, t).await;
    assert_eq!(outcome, Some(EvictResult::Evicted));
}

#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn bad_specs_are_refused_by_the_api_server_with_a_readable_message() {
    let (_client, ns) = setup("rw-bad").await;
    let cases = [
        ("topK: 0", "spec.topK", "greater than or equal to 1"),
        ("topK: 1000000", "spec.topK", "less than or equal to 100"),
        ("topK: ten", "spec.topK", "integer"),
        (
            "remediation: {action: Reboot}",
            "spec.remediation.action",
            "Unsupported value",
        ),
        (
            "selector: {matchExpressions: [{key: app, operator: Like, values: [x]}]}",
            "operator",
            "Unsupported value",
        ),
        ("interval: fast", "spec.interval", "should match"),
        (
            "leakDetection: {minConfidence: 101}",
            "spec.leakDetection.minConfidence",
            "less than or equal to 100",
        ),
    ];
    for (spec, field, words) in cases {
        let yaml = format!(
            "apiVersion: resourcewatch.io/v1alpha1\nkind: ResourceWatch\nmetadata: {{name: bad, namespace: {}}}\nspec: {{{spec}}}\n",
            ns.name
        );
        let (ok, _, err) = kubectl(&["apply", "-f", "-"], Some(&yaml));
        assert!(!ok, "{spec:?} was accepted");
        assert!(
            err.contains(field) && err.contains(words),
            "{spec:?}: the message should name {field} and say {words:?}:\n{err}"
        );
    }
    let good = format!(
        "apiVersion: resourcewatch.io/v1alpha1\nkind: ResourceWatch\nmetadata: {{name: good, namespace: {}}}\nspec: {{topK: 5}}\n",
        ns.name
    );
    let (ok, _, err) = kubectl(&["apply", "-f", "-"], Some(&good));
    assert!(ok, "a valid spec was refused: {err}");
    // The sample in config/ is accepted as is.
    let sample =
        std::fs::read_to_string(harness::repo_root().join("config/samples/resourcewatch.yaml"))
            .expect("sample");
    let (ok, _, err) = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(&sample));
    assert!(ok, "the sample was refused: {err}");
}

#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn hostile_specs_are_refused_with_the_field_named() {
    let (client, ns) = setup("rw-hostile").await;
    let rws: Api<ResourceWatch> = Api::namespaced(client.clone(), &ns.name);
    let mb = "a".repeat(1 << 20);
    let terms: Vec<serde_json::Value> = (0..10_000)
        .map(|i| serde_json::json!({"key": format!("k{i}"), "operator": "Exists"}))
        .collect();
    let labels: serde_json::Map<String, serde_json::Value> = (0..100_000)
        .map(|i| (format!("k{i}"), serde_json::Value::String("v".into())))
        .collect();
    let cases = [
        (
            serde_json::json!({"selector": {"matchExpressions": terms}}),
            "spec.selector.matchExpressions",
            "at most 32",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"app": mb}}}),
            "spec.selector.matchLabels",
            "63",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": labels}}),
            "spec.selector.matchLabels",
            "at most 64",
        ),
        (
            serde_json::json!({"selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": [mb]}]}}),
            "values",
            "63",
        ),
        (
            serde_json::json!({"interval": format!("{}s", "1".repeat(1 << 20))}),
            "spec.interval",
            "32",
        ),
    ];
    for (spec, field, words) in cases {
        let rw: ResourceWatch = serde_json::from_value(serde_json::json!({
            "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ResourceWatch",
            "metadata": {"name": "hostile"}, "spec": spec
        }))
        .expect("typed");
        match rws.create(&PostParams::default(), &rw).await {
            Ok(_) => panic!("a hostile spec ({field}) was accepted"),
            Err(kube::Error::Api(e)) => {
                // The message quotes the hostile value: check all of it, print its ends.
                let m = &e.message;
                let ends = format!(
                    "{} ... {}",
                    m.chars().take(200).collect::<String>(),
                    m.chars()
                        .rev()
                        .take(200)
                        .collect::<String>()
                        .chars()
                        .rev()
                        .collect::<String>()
                );
                assert!(
                    e.code == 422 && m.contains(field) && m.contains(words),
                    "{field}: want 422 naming the field and {words:?}, got {}: {ends}",
                    e.code
                );
            }
            Err(e) => panic!("{field}: {e}"),
        }
    }
    assert!(rws.get_opt("hostile").await.expect("get").is_none());
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn status_columns_events_agent_loss_and_operator_restart() {
    let (client, ns) = setup("rw-status").await;
    let n = ns.name.clone();
    let mut op =
        OperatorProcess::start(&n, "op-1", &["--agent-grace", "4s"]).expect("operator starts");
    op.wait_ready().await.expect("operator ready");
    let node = format!("sim-{n}");
    harness::fake_node(&client, &node).await.expect("node");
    let pods = [
        ("api-burn", "api"),
        ("api-leak", "api"),
        ("api-idle", "api"),
        ("db-hog", "db"),
    ];
    fake_pods(&client, &n, &node, &pods).await;
    let rw: ResourceWatch = serde_json::from_value(serde_json::json!({
        "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ResourceWatch",
        "metadata": {"name": "api"},
        "spec": {"selector": {"matchLabels": {"app": "api"}}, "topK": 5, "interval": "5s",
                 "thresholds": {"cpuPercent": 90}}
    }))
    .expect("rw");
    let rws: Api<ResourceWatch> = Api::namespaced(client.clone(), &n);
    rws.create(&PostParams::default(), &rw)
        .await
        .expect("create rw");

    let tls = node_agent_tls(&client, &n, &node).await;
    let endpoint = format!("https://{}", op.grpc);
    let server_name =
        resourcewatch_proto::operator_server_name(resourcewatch_proto::OPERATOR_SERVICE, &n);
    let planner: resourcewatch_e2e::sim::Planner = Arc::new(|p| match p.name.as_str() {
        "api-burn" => PodPlan {
            cpu_percent: 95.0,
            rss_bytes: 20 * MIB,
            ..Default::default()
        },
        "api-leak" => PodPlan {
            cpu_percent: 5.0,
            rss_bytes: 100 * MIB,
            limit_bytes: 128 * MIB,
            leak: Some((2e6, 90, 61.0)),
        },
        "api-idle" => PodPlan {
            cpu_percent: 0.0,
            rss_bytes: 2 * MIB,
            ..Default::default()
        },
        _ => PodPlan {
            cpu_percent: 300.0,
            rss_bytes: 900 * MIB,
            ..Default::default()
        },
    });
    let agent = SimAgent::spawn(
        endpoint.clone(),
        server_name.clone(),
        tls.clone(),
        node.clone(),
        planner.clone(),
    );

    let status = wait_for(
        "status with Top-K and the leak",
        Duration::from_secs(30),
        || {
            let rws = rws.clone();
            async move {
                let s = rws.get("api").await?.status;
                Ok(s.filter(|s| !s.top_cpu.is_empty() && !s.leaks.is_empty()))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\noperator log:\n{}", op.log_text()));
    assert_eq!(status.matched_pods, 3);
    assert_eq!(status.top_cpu[0].pod, "api-burn");
    assert_eq!(status.top_memory[0].pod, "api-leak");
    assert!(
        status.top_cpu.iter().all(|e| e.pod != "db-hog"),
        "an unselected pod appeared"
    );
    assert_eq!(status.leaks[0].pod, "api-leak");
    assert_eq!(status.leaks[0].time_to_oom_seconds, Some(61.0));
    assert_eq!(status.exceeding.len(), 1, "api-burn is above 90% CPU");
    let targets = agent.stats.targets.lock().map(|t| t.len()).unwrap_or(0);
    assert_eq!(
        targets, 3,
        "the node's configuration lists the three selected pods"
    );

    // What `kubectl get` shows.
    let (ok, out, err) = kubectl(&["get", "resourcewatch", "-n", &n], None);
    assert!(ok, "{err}");
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME", "TARGETS", "TOP", "CPU", "TOP", "MEMORY", "LEAKING", "OOM", "ETA", "READY",
            "AGE"
        ],
        "{out}"
    );
    let row = out.lines().nth(1).unwrap_or("");
    for want in [
        "api", "3", "api-burn", "(95%)", "api-leak", "(100Mi)", "1", "1m1s", "True",
    ] {
        assert!(
            row.split_whitespace().any(|w| w == want),
            "{want:?} missing from the row: {out}"
        );
    }
    let (ok, out, _) = kubectl(&["get", "rw", "-n", &n], None);
    assert!(
        ok && out.contains("api-burn"),
        "the short name works: {out}"
    );

    // Events of the transitions.
    let e = wait_for(
        "WatchReady, LeakDetected and ThresholdCrossed Events",
        Duration::from_secs(15),
        || {
            let client = client.clone();
            let n = n.clone();
            async move {
                let r = (
                    events(&client, &n, "WatchReady").await,
                    events(&client, &n, "LeakDetected").await,
                    events(&client, &n, "ThresholdCrossed").await,
                );
                Ok((!r.0.is_empty() && !r.1.is_empty() && !r.2.is_empty()).then_some(r))
            }
        },
    )
    .await
    .expect("events");
    assert!(
        e.1[0]
            .note
            .as_deref()
            .unwrap_or("")
            .contains("predicted OOM kill in 1m1s"),
        "{:?}",
        e.1[0].note
    );
    assert_eq!(
        e.0[0].reporting_controller.as_deref(),
        Some("resourcewatch-operator")
    );

    // The agent goes away: Degraded after the grace, one AgentLost; back: AgentRecovered.
    agent.stop().await;
    wait_for(
        "Degraded=True AgentsMissing",
        Duration::from_secs(30),
        || {
            let rws = rws.clone();
            async move {
                let s = rws.get("api").await?.status.unwrap_or_default();
                Ok(s.conditions
                    .iter()
                    .find(|c| c.type_ == "Degraded")
                    .filter(|c| c.status == ConditionStatus::True && c.reason == "AgentsMissing")
                    .map(|_| ()))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\noperator log:\n{}", op.log_text()));
    // The Event is published after the status it goes with is written: waited for, as
    // AgentRecovered is below (read the moment the condition showed, it was not there yet
    // once in CI, on 30 November).
    wait_for("AgentLost", Duration::from_secs(10), || {
        let client = client.clone();
        let n = n.clone();
        async move { Ok((!events(&client, &n, "AgentLost").await.is_empty()).then_some(())) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\noperator log:\n{}", op.log_text()));
    assert_eq!(events(&client, &n, "AgentLost").await.len(), 1);
    let agent = SimAgent::spawn(
        endpoint,
        server_name.clone(),
        tls.clone(),
        node.clone(),
        planner.clone(),
    );
    wait_for(
        "Degraded=False after the agent is back",
        Duration::from_secs(30),
        || {
            let rws = rws.clone();
            async move {
                let s = rws.get("api").await?.status.unwrap_or_default();
                Ok(s.conditions
                    .iter()
                    .find(|c| c.type_ == "Degraded")
                    .filter(|c| c.status == ConditionStatus::False)
                    .map(|_| ()))
            }
        },
    )
    .await
    .expect("recovered");
    wait_for("AgentRecovered", Duration::from_secs(10), || {
        let client = client.clone();
        let n = n.clone();
        async move { Ok((!events(&client, &n, "AgentRecovered").await.is_empty()).then_some(())) }
    })
    .await
    .expect("AgentRecovered event");

    // The operator restarts: status goes on, and no Event is published twice.
    let before: Vec<usize> = futures::future::join_all(
        [
            "WatchReady",
            "LeakDetected",
            "ThresholdCrossed",
            "AgentLost",
            "AgentRecovered",
        ]
        .map(|r| {
            let client = client.clone();
            let n = n.clone();
            async move { events(&client, &n, r).await.len() }
        }),
    )
    .await;
    let last_update = rws
        .get("api")
        .await
        .expect("rw")
        .status
        .and_then(|s| s.last_update_time);
    assert!(
        op.stop(Duration::from_secs(15))
            .await
            .is_some_and(|s| s.success()),
        "graceful exit on SIGTERM:\n{}",
        op.log_text()
    );
    agent.stop().await;
    let mut op2 =
        OperatorProcess::start(&n, "op-2", &["--agent-grace", "4s"]).expect("operator restarts");
    op2.wait_ready().await.expect("second operator ready");
    let agent = SimAgent::spawn(
        format!("https://{}", op2.grpc),
        server_name,
        tls,
        node,
        planner,
    );
    wait_for(
        "a status update from the new operator",
        Duration::from_secs(40),
        || {
            let rws = rws.clone();
            let last = last_update.clone();
            async move {
                let s = rws.get("api").await?.status.unwrap_or_default();
                Ok((s.last_update_time != last && !s.top_cpu.is_empty()).then_some(()))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\noperator log:\n{}", op2.log_text()));
    tokio::time::sleep(Duration::from_secs(6)).await; // one more interval for stray Events
    let after: Vec<usize> = futures::future::join_all(
        [
            "WatchReady",
            "LeakDetected",
            "ThresholdCrossed",
            "AgentLost",
            "AgentRecovered",
        ]
        .map(|r| {
            let client = client.clone();
            let n = n.clone();
            async move { events(&client, &n, r).await.len() }
        }),
    )
    .await;
    assert_eq!(
        before,
        after,
        "Events repeated after an operator restart\nlog:\n{}",
        op2.log_text()
    );
    agent.stop().await;
    let m = op2
        .metric("resourcewatch_operator_status_writes_total")
        .unwrap_or(0.0);
    assert!(m >= 1.0, "status writes are counted: {m}");
}

#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn what_the_schema_cannot_check_is_a_ready_false_condition() {
    let (client, ns) = setup("rw-floor").await;
    let mut op = OperatorProcess::start(&ns.name, "op-floor", &[]).expect("operator");
    op.wait_ready().await.expect("ready");
    let rws: Api<ResourceWatch> = Api::namespaced(client.clone(), &ns.name);
    for (name, spec) in [
        ("too-fast", serde_json::json!({"interval": "1s"})),
        (
            "no-values",
            serde_json::json!({"selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}),
        ),
    ] {
        let rw: ResourceWatch = serde_json::from_value(serde_json::json!({
            "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ResourceWatch",
            "metadata": {"name": name}, "spec": spec
        }))
        .expect("rw");
        rws.create(&PostParams::default(), &rw)
            .await
            .expect("the schema accepts it");
        let cond = wait_for("Ready=False InvalidSpec", Duration::from_secs(20), || {
            let rws = rws.clone();
            async move {
                let s = rws.get(name).await?.status.unwrap_or_default();
                Ok(s.conditions
                    .into_iter()
                    .find(|c| c.type_ == "Ready" && c.reason == "InvalidSpec"))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", op.log_text()));
        assert_eq!(cond.status, ConditionStatus::False);
        assert!(!cond.message.is_empty());
        let (_, out, _) = kubectl(&["get", "rw", name, "-n", &ns.name], None);
        assert!(out.contains("False"), "{out}");
    }
    let e = events(&client, &ns.name, "InvalidSpec").await;
    assert_eq!(
        e.len(),
        2,
        "one Event per invalid watch: {:?}",
        e.iter().map(|e| e.name_any()).collect::<Vec<_>>()
    );
}

/// kube's Event recorder folds Events of one reason with the same `regarding` and `related`
/// objects into one series that keeps its first note: each leak, threshold and node of a
/// watch must name its own subject, or the second is never shown.
#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn two_leaks_and_two_thresholds_in_one_watch_are_two_events_each() {
    let (client, ns) = setup("rw-fold").await;
    let n = ns.name.clone();
    let mut op = OperatorProcess::start(&n, "op-fold", &[]).expect("operator starts");
    op.wait_ready().await.expect("operator ready");
    let node = format!("sim-{n}");
    harness::fake_node(&client, &node).await.expect("node");
    fake_pods(
        &client,
        &n,
        &node,
        &[("leak-a", "api"), ("leak-b", "api"), ("hot", "api")],
    )
    .await;
    let rw: ResourceWatch = serde_json::from_value(serde_json::json!({
        "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ResourceWatch",
        "metadata": {"name": "w"},
        "spec": {"selector": {"matchLabels": {"app": "api"}}, "interval": "5s",
                 "thresholds": {"cpuPercent": 90, "memoryPercentOfLimit": 80}}
    }))
    .expect("rw");
    Api::<ResourceWatch>::namespaced(client.clone(), &n)
        .create(&PostParams::default(), &rw)
        .await
        .expect("create rw");
    let tls = node_agent_tls(&client, &n, &node).await;
    let planner: resourcewatch_e2e::sim::Planner = Arc::new(|p| match p.name.as_str() {
        "leak-a" => PodPlan {
            cpu_percent: 1.0,
            rss_bytes: 50 * MIB,
            limit_bytes: 128 * MIB,
            leak: Some((2e6, 90, 61.0)),
        },
        "leak-b" => PodPlan {
            cpu_percent: 1.0,
            rss_bytes: 20 * MIB,
            limit_bytes: 256 * MIB,
            leak: Some((1e6, 85, 236.0)),
        },
        _ => PodPlan {
            cpu_percent: 150.0,
            rss_bytes: 120 * MIB,
            limit_bytes: 128 * MIB,
            leak: None,
        },
    });
    let agent = SimAgent::spawn(
        format!("https://{}", op.grpc),
        resourcewatch_proto::operator_server_name(resourcewatch_proto::OPERATOR_SERVICE, &n),
        tls,
        node.clone(),
        planner,
    );
    let notes = |reason: &'static str, want: usize| {
        let client = client.clone();
        let n = n.clone();
        async move {
            wait_for(reason, Duration::from_secs(30), || {
                let client = client.clone();
                let n = n.clone();
                async move {
                    let e = events(&client, &n, reason).await;
                    let mut notes: Vec<String> = e.into_iter().filter_map(|e| e.note).collect();
                    notes.sort();
                    Ok((notes.len() >= want).then_some(notes))
                }
            })
            .await
        }
    };
    let leaks = notes("LeakDetected", 2)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\noperator log:\n{}", op.log_text()));
    assert_eq!(leaks.len(), 2, "{leaks:?}");
    assert!(
        leaks[0].starts_with("leak-a/") && leaks[0].contains("1m1s"),
        "{leaks:?}"
    );
    assert!(
        leaks[1].starts_with("leak-b/") && leaks[1].contains("3m56s"),
        "{leaks:?}"
    );
    let crossed = notes("ThresholdCrossed", 2)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\noperator log:\n{}", op.log_text()));
    assert_eq!(crossed.len(), 2, "CPU and memory of `hot`: {crossed:?}");
    assert!(
        crossed[0].contains("CPU 150% of a core") && crossed[1].contains("memory 93.75%"),
        "{crossed:?}"
    );
    // Each leak's Event is on the watch and names its pod's container as `related`.
    let on_watch: Vec<_> = events(&client, &n, "LeakDetected")
        .await
        .into_iter()
        .filter_map(|e| Some((e.regarding?.kind?, e.related?)))
        .collect();
    assert_eq!(on_watch.len(), 2);
    for (kind, related) in &on_watch {
        assert_eq!(kind, "ResourceWatch");
        assert_eq!(related.kind.as_deref(), Some("Pod"));
        assert!(related.uid.is_some(), "{related:?}");
        assert!(
            related
                .field_path
                .as_deref()
                .is_some_and(|f| f.starts_with("spec.containers{")),
            "{related:?}"
        );
    }
    agent.stop().await;
}
