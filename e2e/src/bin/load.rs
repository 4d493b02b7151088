//! `resourcewatch-load`: the operator under a fleet. Creates fake nodes and pods in the
//! cluster `KUBECONFIG` names, `--watches` ResourceWatches over them, starts the operator
//! binary, connects `--agents` simulated agents (real protocol, real mTLS) that report at
//! the cadence the operator asks, and measures the operator's CPU, memory and API writes
//! per second over `--duration`.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use resourcewatch_crds::{ConditionStatus, ResourceWatch};
use resourcewatch_e2e::{
    cluster::{self, wait_for},
    operator::OperatorProcess,
    sim::{AgentTls, Planner, PodPlan, SimAgent},
};

#[derive(Parser)]
#[command(about = "Load-test the operator with simulated agents")]
struct Args {
    #[arg(long, default_value_t = 200)]
    agents: usize,
    #[arg(long, default_value_t = 50)]
    watches: usize,
    #[arg(long, default_value_t = 4)]
    pods_per_watch: usize,
    /// Every watch's status interval (agents report at half of it).
    #[arg(long, default_value = "10s")]
    interval: String,
    /// Measurement window, after every watch is Ready.
    #[arg(long, default_value_t = 120)]
    duration_secs: u64,
    #[arg(long, default_value = "rw-load")]
    namespace: String,
    /// Leave everything in the cluster afterwards.
    #[arg(long)]
    keep: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let client = cluster::client().await?;
    cluster::install_crd(&client).await?;
    let ns = cluster::TestNamespace::create(&client, &a.namespace).await?;
    let n = ns.name.clone();
    eprintln!(
        "namespace {n}: {} nodes, {} watches x {} pods",
        a.agents, a.watches, a.pods_per_watch
    );
    let nodes: Vec<String> = (0..a.agents).map(|i| format!("load-{i:03}")).collect();
    for node in &nodes {
        cluster::fake_node(&client, node).await?;
    }
    let mut k = 0;
    for w in 0..a.watches {
        for p in 0..a.pods_per_watch {
            let name = format!("w{w:02}-p{p}");
            let labels: BTreeMap<String, String> = [("app".to_string(), format!("w{w:02}"))].into();
            cluster::fake_running_pod(
                &client,
                &n,
                &name,
                &labels,
                &nodes[k % nodes.len()],
                &cluster::container_id(&format!("{n}/{name}")),
            )
            .await
            .with_context(|| format!("pod {name}"))?;
            k += 1;
        }
    }
    let mut op = OperatorProcess::start(&n, "load-operator", &["--agent-grace", "20s"])?;
    op.wait_ready().await?;
    let rws: Api<ResourceWatch> = Api::namespaced(client.clone(), &n);
    for w in 0..a.watches {
        let rw: ResourceWatch = serde_json::from_value(serde_json::json!({
            "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ResourceWatch",
            "metadata": {"name": format!("w{w:02}")},
            "spec": {"selector": {"matchLabels": {"app": format!("w{w:02}")}}, "topK": 10, "interval": a.interval,
                     "thresholds": {"cpuPercent": 1000}}
        }))?;
        match rws.create(&PostParams::default(), &rw).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let tls = AgentTls::from_secret(&client, &n, "resourcewatch-agent-tls").await?;
    let endpoint = format!("https://{}", op.grpc);
    let server_name = resourcewatch_proto::operator_server_name(&n);
    // Values move a little every report, as real ones do, so status really changes.
    let planner: Planner = Arc::new(|p| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let seed = p.name.bytes().map(u64::from).sum::<u64>();
        PodPlan {
            cpu_percent: ((seed * 7 + t) % 100) as f64,
            rss_bytes: ((seed % 50) + 10) << 20,
            limit_bytes: 256 << 20,
            leak: (seed % 5 == 0).then_some((1e6, 80, 600.0)),
        }
    });
    let mut agents: Vec<SimAgent> = Vec::new();
    for node in &nodes {
        let token = cluster::agent_token(&client, &n, node).await?;
        agents.push(SimAgent::spawn(
            endpoint.clone(),
            server_name.clone(),
            tls.for_node(token),
            node.clone(),
            planner.clone(),
        ));
    }
    let ready = wait_for(
        "every watch Ready with all its nodes reporting",
        Duration::from_secs(180),
        || {
            let rws = rws.clone();
            let want = a.watches;
            async move {
                let list = rws.list(&ListParams::default()).await?;
                let ok = list
                    .items
                    .iter()
                    .filter(|r| {
                        r.status.as_ref().is_some_and(|s| {
                            s.reporting_nodes == s.expected_nodes
                                && s.expected_nodes > 0
                                && s.conditions.iter().any(|c| {
                                    c.type_ == "Ready" && c.status == ConditionStatus::True
                                })
                        })
                    })
                    .count();
                Ok((ok == want).then_some(()))
            }
        },
    )
    .await;
    if let Err(e) = ready {
        eprintln!(
            "{e:#}\n--- operator log (tail) ---\n{}",
            tail(&op.log_text(), 40)
        );
        return Err(e);
    }
    eprintln!(
        "all {} watches Ready; measuring for {} s",
        a.watches, a.duration_secs
    );
    let m0 = snapshot(&op)?;
    tokio::time::sleep(Duration::from_secs(a.duration_secs)).await;
    let m1 = snapshot(&op)?;
    let secs = a.duration_secs as f64;
    let writes = m1.status_writes - m0.status_writes;
    let events = m1.events - m0.events;
    let sessions: u64 = agents
        .iter()
        .map(|g| g.stats.sessions.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    let errors: u64 = agents
        .iter()
        .map(|g| g.stats.errors.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    println!(
        "| agents | watches | pods | interval | window | operator CPU | RSS (peak) | status writes/s | Events/s | reports/s | skipped/s | agent reconnects |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {} s | {:.2} % of a core | {:.1} MiB ({:.1} MiB) | {:.2} | {:.2} | {:.1} | {:.1} | {} |",
        a.agents,
        a.watches,
        a.watches * a.pods_per_watch,
        a.interval,
        a.duration_secs,
        (m1.cpu - m0.cpu) * 100.0 / secs,
        m1.rss as f64 / 1048576.0,
        m1.peak as f64 / 1048576.0,
        writes / secs,
        events / secs,
        (m1.reports - m0.reports) / secs,
        (m1.skipped - m0.skipped) / secs,
        sessions.saturating_sub(a.agents as u64) + errors,
    );
    for g in agents {
        g.stop().await;
    }
    drop(op);
    if !a.keep {
        let nodes_api: Api<Node> = Api::all(client.clone());
        for node in &nodes {
            let _ = nodes_api.delete(node, &DeleteParams::default()).await;
        }
        let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .delete(&n, &DeleteParams::background())
            .await;
    }
    std::mem::forget(ns);
    Ok(())
}

struct Snapshot {
    cpu: f64,
    rss: u64,
    peak: u64,
    status_writes: f64,
    events: f64,
    reports: f64,
    skipped: f64,
}

fn snapshot(op: &OperatorProcess) -> anyhow::Result<Snapshot> {
    let (cpu, rss, peak) = op.usage().context("reading the operator's /proc")?;
    Ok(Snapshot {
        cpu,
        rss,
        peak,
        status_writes: op.metric("resourcewatch_operator_status_writes_total")?,
        events: op.metric("resourcewatch_operator_events_total")?,
        reports: op.metric("resourcewatch_operator_agent_reports_total")?,
        skipped: op.metric("resourcewatch_operator_status_writes_skipped_total")?,
    })
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
