//! Metrics and alerts, scraped for real: a real Prometheus (Debian's 2.42, from
//! e2e/prometheus/install.sh) scrapes the installed operator and agent over the pod
//! network, loads config/prometheus/prometheusrule.yaml's rules, and the test asks it, as
//! an SRE's dashboard would: the leaking pod's `resourcewatch_time_to_oom_seconds` with its
//! namespace/pod/container labels, falling; `ResourceWatchPredictedOOMSoon` firing for it
//! and for nothing else; the agent's own series. Run by `make e2e` (needs the cluster).

use std::{
    collections::BTreeSet,
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::ListParams};
use resourcewatch_e2e::cluster::{self, wait_for};
use serde_json::Value;

const SYSTEM: &str = "resourcewatch-system";
const PROMETHEUS_PORT: u16 = 19090;

/// A Prometheus server for the test's lifetime (killed on drop).
struct Prometheus {
    child: Child,
    _dir: TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The rules file Prometheus loads: the PrometheusRule's `spec.groups`, as they stand.
fn rules_file() -> String {
    let path = cluster::repo_root().join("config/prometheus/prometheusrule.yaml");
    let rule: Value =
        cluster::yaml_value(&std::fs::read_to_string(&path).expect("read the PrometheusRule"))
            .expect("PrometheusRule YAML");
    serde_saphyr::to_string(&serde_json::json!({"groups": rule["spec"]["groups"]})).expect("yaml")
}

/// Prometheus scraping as a user's would: the operator over HTTPS verified against the CA
/// it publishes, with a token allowed to get /metrics; the agents over HTTPS with the
/// client certificate the operator issues for scrapers.
fn start_prometheus(
    operator: &str,
    agents: &[String],
    token: &str,
    ca: &str,
    client_cert: &(String, String),
) -> Prometheus {
    let bin = std::env::var("RW_PROMETHEUS").unwrap_or_else(|_| {
        panic!("RW_PROMETHEUS is not set: run through make e2e (e2e/prometheus/install.sh)")
    });
    let dir = std::env::temp_dir().join(format!("rw-e2e-prometheus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let dir = TempDir(dir);
    std::fs::write(dir.0.join("rules.yaml"), rules_file()).expect("rules");
    std::fs::write(dir.0.join("token"), token).expect("token");
    std::fs::write(dir.0.join("ca.crt"), ca).expect("ca");
    std::fs::write(dir.0.join("client.crt"), &client_cert.0).expect("client cert");
    std::fs::write(dir.0.join("client.key"), &client_cert.1).expect("client key");
    let targets: Vec<String> = agents.iter().map(|a| format!("'{a}:9479'")).collect();
    std::fs::write(
        dir.0.join("prometheus.yml"),
        format!(
            "global: {{scrape_interval: 2s, evaluation_interval: 2s}}\n\
             rule_files: [rules.yaml]\n\
             scrape_configs:\n\
             - job_name: resourcewatch-operator\n  scheme: https\n\
             \x20 authorization: {{credentials_file: {dir}/token}}\n\
             \x20 tls_config: {{ca_file: {dir}/ca.crt, server_name: resourcewatch-operator}}\n\
             \x20 static_configs: [{{targets: ['{operator}:8080']}}]\n\
             - job_name: resourcewatch-agent\n  scheme: https\n\
             \x20 tls_config: {{ca_file: {dir}/ca.crt, server_name: resourcewatch-agent, \
             cert_file: {dir}/client.crt, key_file: {dir}/client.key}}\n\
             \x20 static_configs: [{{targets: [{}]}}]\n",
            targets.join(", "),
            dir = dir.0.display()
        ),
    )
    .expect("config");
    let child = Command::new(bin)
        .arg(format!(
            "--config.file={}",
            dir.0.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.0.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus");
    Prometheus { child, _dir: dir }
}

/// GET on Prometheus's HTTP API; the `data` of a `success` answer. (A plain HTTP/1.0
/// request over a TcpStream: one loopback GET per poll in a test does not need an HTTP
/// client crate, and none is among the e2e crate's dependencies.)
fn api(path_and_query: &str) -> anyhow::Result<Value> {
    let mut conn = TcpStream::connect(("127.0.0.1", PROMETHEUS_PORT))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        conn,
        "GET {path_and_query} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    conn.read_to_string(&mut raw)?;
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let v: Value = serde_json::from_str(body)
        .map_err(|e| anyhow::anyhow!("{e}: {}", &body[..body.len().min(300)]))?;
    anyhow::ensure!(v["status"] == "success", "prometheus: {v}");
    Ok(v["data"].clone())
}

fn query(q: &str) -> anyhow::Result<Vec<Value>> {
    let q: String = form_urlencoded::byte_serialize(q.as_bytes()).collect();
    let data = api(&format!("/api/v1/query?query={q}"))?;
    Ok(data["result"].as_array().cloned().unwrap_or_default())
}

fn value(sample: &Value) -> f64 {
    sample["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

async fn pod_ips(client: &Client, app: &str) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM);
    let list = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
        .await
        .expect("list pods");
    list.items
        .into_iter()
        .filter_map(|p| p.status?.pod_ip)
        .collect()
}

async fn workload(client: &Client, ns: &str, name: &str, args: &[&str], limit: &str) {
    cluster::leak_sim_pod(client, ns, name, "scraped", args, limit).await;
}

#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn prometheus_scrapes_the_time_to_oom_and_the_alert_fires_for_the_leak_only() {
    let (client, ns) = cluster::test_namespace("rw-e2e-metrics").await;
    let n = ns.name.clone();
    cluster::watch_app(&client, &n, "scraped", "scraped").await;
    // 1 MiB/s from 20 MiB into 256Mi: an OOM predicted about 4 minutes ahead, under the
    // alert's 10 minutes from the first report. And two pods that do not grow.
    workload(
        &client,
        &n,
        "leaky",
        &cluster::leak_args("1MiB/s", "0"),
        "256Mi",
    )
    .await;
    workload(
        &client,
        &n,
        "flat",
        &["--pattern", "flat", "--size", "40MiB"],
        "256Mi",
    )
    .await;
    workload(&client, &n, "sawtooth", &["--pattern", "sawtooth"], "256Mi").await;

    let operator = pod_ips(&client, "resourcewatch-operator").await;
    let agents = pod_ips(&client, "resourcewatch-agent").await;
    assert_eq!(operator.len(), 1, "one operator pod: {operator:?}");
    assert!(!agents.is_empty(), "agent pods");
    let token = cluster::token_with_role(
        &client,
        &n,
        "prometheus",
        Some("resourcewatch-metrics-reader"),
    )
    .await
    .expect("a token for Prometheus");
    let ca = cluster::ca_bundle(&client).await;
    let scraper = cluster::leaf_secret(&client, "resourcewatch-metrics-client").await;
    let _prometheus = start_prometheus(&operator[0], &agents, &token, &ca, &scraper);

    // An agent's /metrics, asked directly: nothing without the scrapers' certificate,
    // nothing for the agents' own (every node holds it).
    let agent_addr: std::net::SocketAddr = format!("{}:9479", agents[0])
        .parse()
        .expect("agent address");
    let agent_cert = cluster::leaf_secret(&client, "resourcewatch-agent-tls").await;
    for (identity, want) in [(None, 401), (Some(&agent_cert), 403), (Some(&scraper), 200)] {
        let req = resourcewatch_https::Get {
            server_name: "resourcewatch-agent",
            ca_pem: &ca,
            identity: identity.map(|(c, k)| (c.as_str(), k.as_str())),
            token: None,
            path: "/metrics",
        };
        let (code, body) = resourcewatch_https::get(agent_addr, &req)
            .await
            .expect("HTTPS to the agent");
        assert_eq!(code, want, "{body}");
    }

    // Both targets scraped and healthy.
    wait_for(
        "prometheus up with both targets",
        Duration::from_secs(60),
        || async {
            let up = query("up").unwrap_or_default();
            let jobs: BTreeSet<String> = up
                .iter()
                .filter(|s| value(s) == 1.0)
                .filter_map(|s| s["metric"]["job"].as_str().map(String::from))
                .collect();
            Ok((jobs.len() == 2).then_some(()))
        },
    )
    .await
    .unwrap_or_else(|e| {
        // Why a target is down (TLS, 401/403, refused) is in Prometheus' own view.
        panic!("{e:#}\ntargets: {:?}", api("/api/v1/targets"))
    });

    // The leaking container's time to OOM, with the labels an alert routes on.
    let leaky = format!(r#"resourcewatch_time_to_oom_seconds{{namespace="{n}",pod="leaky"}}"#);
    let series = wait_for("the leak's time to OOM", Duration::from_secs(120), || {
        let leaky = leaky.clone();
        async move {
            let r = query(&leaky)?;
            Ok((!r.is_empty()).then_some(r))
        }
    })
    .await
    .expect("time to OOM series");
    assert_eq!(series.len(), 1, "{series:?}");
    let m = &series[0]["metric"];
    assert_eq!(m["container"], "main");
    assert_eq!(m["resourcewatch"], "scraped");
    assert!(m["node"].as_str().is_some_and(|s| !s.is_empty()), "{m}");
    let first = value(&series[0]);
    assert!(first > 0.0 && first < 600.0, "time to OOM {first}");

    // Falling: 20 s later it is lower (the leak eats 1 MiB/s of 236 MiB of room).
    tokio::time::sleep(Duration::from_secs(20)).await;
    let later = value(query(&leaky).expect("query").first().expect("still there"));
    assert!(
        later < first - 5.0,
        "time to OOM {first:.0}s, 20 s later {later:.0}s"
    );

    // The alert: firing for the leak (after its 30 s `for`), for nothing else. (The
    // sawtooth's first 10 s rise, from its process start, can be listed as a leak for a
    // moment: the detector has no blind spot at start. The alert's `for` outlasts it.)
    let alerts = wait_for("ResourceWatchPredictedOOMSoon firing", Duration::from_secs(90), || {
        let n = n.clone();
        async move {
            let r = query(&format!(
                r#"ALERTS{{alertname="ResourceWatchPredictedOOMSoon",alertstate="firing",namespace="{n}"}}"#
            ))?;
            Ok((!r.is_empty()).then_some(r))
        }
    })
    .await
    .expect("alert firing");
    let alerted: Vec<&str> = alerts
        .iter()
        .filter_map(|a| a["metric"]["pod"].as_str())
        .collect();
    assert_eq!(alerted, ["leaky"], "{alerts:?}");
    let any = query(&format!(r#"ALERTS{{namespace="{n}",pod!="leaky"}}"#)).expect("query");
    assert!(any.is_empty(), "alerts for the stable pods: {any:?}");
    // By now (over a minute, six sawtooth periods) only the leak is predicted to OOM.
    let all = query(&format!(
        r#"resourcewatch_time_to_oom_seconds{{namespace="{n}"}}"#
    ))
    .expect("q");
    let pods: BTreeSet<&str> = all
        .iter()
        .filter_map(|s| s["metric"]["pod"].as_str())
        .collect();
    assert_eq!(pods, BTreeSet::from(["leaky"]), "{all:?}");
    let flagged = query(&format!(
        r#"max_over_time(resourcewatch_leak_confidence_ratio{{namespace="{n}",pod!="leaky"}}[10m])"#
    ))
    .expect("q");
    eprintln!("stable pods ever listed as leaking: {flagged:?}");

    // The watch's other series, and the agent's own.
    let top = query(&format!(
        r#"resourcewatch_top_memory_bytes{{namespace="{n}"}}"#
    ))
    .expect("q");
    let ranked: BTreeSet<&str> = top
        .iter()
        .filter_map(|s| s["metric"]["pod"].as_str())
        .collect();
    assert!(
        ranked.contains("flat") && ranked.contains("leaky"),
        "{top:?}"
    );
    let matched = query(&format!(r#"resourcewatch_matched_pods{{namespace="{n}"}}"#)).expect("q");
    assert_eq!(matched.first().map(value), Some(3.0), "{matched:?}");
    for (q, at_least) in [
        ("resourcewatch_agent_pipelines_loaded", 1.0),
        ("resourcewatch_agent_engine_healthy", 1.0),
        ("resourcewatch_agent_operator_connected", 1.0),
        ("resourcewatch_agent_reports_total", 1.0),
        ("resourcewatch_agent_kernel_memory_samples_total", 1.0),
        // The binaries' own cost under the standard names, and what they run.
        (
            r#"process_resident_memory_bytes{job="resourcewatch-agent"}"#,
            1e6,
        ),
        (
            r#"process_resident_memory_bytes{job="resourcewatch-operator"}"#,
            1e6,
        ),
        (
            r#"process_cpu_seconds_total{job="resourcewatch-agent"}"#,
            0.01,
        ),
        (
            r#"resourcewatch_agent_build_info{job="resourcewatch-agent"}"#,
            1.0,
        ),
        (
            r#"resourcewatch_operator_build_info{job="resourcewatch-operator"}"#,
            1.0,
        ),
        ("resourcewatch_operator_agents_connected", 1.0),
        // The API server's answers, by code: what ResourceWatchAPIServerErrors watches.
        (
            r#"resourcewatch_operator_api_responses_total{code="200"}"#,
            1.0,
        ),
    ] {
        let r = query(q).expect("query");
        assert!(
            !r.is_empty() && r.iter().all(|s| value(s) >= at_least),
            "{q}: {r:?}"
        );
    }
    // Every query of the Grafana dashboard is valid PromQL against the real series, and
    // the panels about this watch show data.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            cluster::repo_root().join("config/prometheus/grafana-dashboard.json"),
        )
        .expect("read the dashboard"),
    )
    .expect("dashboard JSON");
    let mut empty = Vec::new();
    let panels = dashboard["panels"].as_array().expect("panels");
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            let q = expr
                .replace("$namespace", &n)
                .replace("$resourcewatch", ".*")
                .replace("$__rate_interval", "1m");
            let r = query(&q).unwrap_or_else(|e| panic!("panel {}: {q}: {e}", panel["title"]));
            if r.is_empty() {
                empty.push(panel["title"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    // Rates need two scrapes a minute apart, and no remediation ran: those may be empty.
    let may_be_empty = [
        "Remediations",
        "Kernel time per event",
        "Memory samples lost",
        // No kill in this test (the OOM e2e tests grade kills in status).
        "OOM kills",
    ];
    let unexpected: Vec<&String> = empty
        .iter()
        .filter(|t| !may_be_empty.iter().any(|m| t.starts_with(m)))
        .collect();
    assert!(
        unexpected.is_empty(),
        "dashboard panels without data: {unexpected:?}"
    );
    eprintln!(
        "dashboard: {} panels, every query valid; empty: {empty:?}",
        panels.len()
    );

    let lost = query("resourcewatch_agent_kernel_memory_samples_lost_total").expect("q");
    assert!(!lost.is_empty(), "the lost-samples counter is exported");
    eprintln!(
        "time to OOM {first:.0}s then {later:.0}s; alert firing for {alerted:?}; agents {}",
        agents.len()
    );
    ns.delete().await;
}
