//! `resourcewatch-trials`: pre-OOM remediation measured on the real cluster. For each leak
//! rate, `--trials` leaking Deployments (128Mi limit) watched with `action: Restart`
//! run beside as many identical unwatched ones (the control, OOM-killed by the kernel);
//! stable pods near their limit (flat, GC sawtooth) run under the same watch the whole
//! time. Prints, per rate: evicted before any OOM kill, the advance warning (the
//! control's median time to its OOM kill minus the time to eviction), and, overall, the
//! false restarts. Needs resourcewatch installed with `--enable-remediation`.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};
use resourcewatch_crds::{RemediationOutcome, ResourceWatch};
use resourcewatch_e2e::harness::{self, TestNamespace};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 10)]
    trials: usize,
    /// Leak rates in MiB/s.
    #[arg(long, value_delimiter = ',', default_value = "8,2,0.5")]
    rates: Vec<f64>,
    /// Stable pods of each kind (flat, sawtooth) watched meanwhile.
    #[arg(long, default_value_t = 3)]
    stable: usize,
}

const DELAY_S: u64 = 40;

fn deployment(name: &str, watched: bool, args: Vec<String>) -> Deployment {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "watched": if watched { "yes" } else { "no" }}},
                "spec": {"terminationGracePeriodSeconds": 2, "automountServiceAccountToken": false, "containers": [{
                    "name": "main", "image": harness::WORKLOADS_IMAGE, "imagePullPolicy": "Never",
                    "command": ["/leak-sim"], "args": args,
                    "resources": {"limits": {"memory": "128Mi"}, "requests": {"memory": "8Mi", "cpu": "5m"}}
                }]}
            }
        }
    }))
    .expect("deployment json")
}

/// Killed by the kernel: an OOMKilled state, or any restart (a leaking container restarts
/// only when OOM-killed in place).
fn oom_killed(p: &Pod) -> bool {
    harness::oom_killed(p) || harness::restarts(p) > 0
}

fn started(p: &Pod) -> Option<i64> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .as_ref()
        .map(|t| t.0.as_second())
}

/// Seconds from a control container's start to its OOM kill.
fn time_to_kill(p: &Pod) -> Option<f64> {
    let c = p.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let t = [c.last_state.as_ref(), c.state.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(|s| s.terminated.as_ref())
        .find(|t| t.reason.as_deref() == Some("OOMKilled"))?;
    Some((t.finished_at.as_ref()?.0.as_second() - t.started_at.as_ref()?.0.as_second()) as f64)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let client = harness::client().await?;
    let began = jiff::Timestamp::now();
    print_conditions(&client).await?;
    let ns = TestNamespace::create(&client, "rw-trials").await?;
    ns.opt_in().await?;
    let n = ns.name.clone();
    let rws: Api<ResourceWatch> = Api::namespaced(client.clone(), &n);
    let rw: ResourceWatch = serde_json::from_value(serde_json::json!({
        "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ResourceWatch",
        "metadata": {"name": "trials"},
        "spec": {"selector": {"matchLabels": {"watched": "yes"}}, "interval": "5s", "topK": 50,
                 "remediation": {"action": "Restart", "minTimeToOOM": "60s", "cooldown": "5m", "maxRestarts": 5}}
    }))?;
    rws.create(&PostParams::default(), &rw)
        .await
        .context("watch")?;
    let deps: Api<Deployment> = Api::namespaced(client.clone(), &n);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &n);
    for i in 0..a.stable {
        for (kind, args) in [("flat", harness::FLAT_ARGS), ("gc", harness::SAWTOOTH_ARGS)] {
            let args = args.iter().map(|a| a.to_string()).collect();
            deps.create(
                &PostParams::default(),
                &deployment(&format!("stable-{kind}-{i}"), true, args),
            )
            .await?;
        }
    }
    println!(
        "| leak rate | trials | evicted before OOM | OOM-killed first | control: median time to OOM kill | median time to eviction | median advance warning | min advance |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    // Every trial's own figures, printed after the table: the medians' inputs.
    let mut each = Vec::new();
    for rate in &a.rates {
        let tag = format!("{}", rate).replace('.', "p");
        let args = |_: ()| -> Vec<String> {
            [
                "--pattern",
                "leak",
                "--baseline",
                "20MiB",
                "--rate",
                &format!("{rate}MiB/s"),
                "--delay",
                &DELAY_S.to_string(),
            ]
            .into_iter()
            .map(String::from)
            .collect()
        };
        for i in 0..a.trials {
            deps.create(
                &PostParams::default(),
                &deployment(&format!("leak-{tag}-{i}"), true, args(())),
            )
            .await?;
            deps.create(
                &PostParams::default(),
                &deployment(&format!("ctl-{tag}-{i}"), false, args(())),
            )
            .await?;
        }
        let deadline = Instant::now() + Duration::from_secs(DELAY_S + (110.0 / rate) as u64 + 120);
        // Original watched pods: uid -> (name, start time, OOM-killed seen)
        let mut watched: BTreeMap<String, (String, Option<i64>, bool)> = BTreeMap::new();
        let mut control_ttk: BTreeMap<String, f64> = BTreeMap::new();
        loop {
            let list = pods.list(&ListParams::default()).await?.items;
            for p in &list {
                let name = p.name_any();
                let uid = p.uid().unwrap_or_default();
                if name.starts_with(&format!("leak-{tag}-")) {
                    let first_of_deploy = !watched
                        .values()
                        .any(|(n, _, _)| n.rsplitn(3, '-').nth(2) == name.rsplitn(3, '-').nth(2));
                    let e = watched.entry(uid.clone());
                    if let std::collections::btree_map::Entry::Vacant(v) = e {
                        if first_of_deploy {
                            v.insert((name.clone(), started(p), oom_killed(p)));
                        }
                    } else if let std::collections::btree_map::Entry::Occupied(mut o) = e {
                        let v = o.get_mut();
                        v.1 = v.1.or(started(p));
                        v.2 |= oom_killed(p);
                    }
                }
                if name.starts_with(&format!("ctl-{tag}-"))
                    && let Some(t) = time_to_kill(p)
                {
                    control_ttk
                        .entry(name.rsplitn(3, '-').nth(2).unwrap_or("").to_owned() + &uid)
                        .or_insert(t);
                }
            }
            let status = rws.get("trials").await?.status.unwrap_or_default();
            let done: BTreeSet<&str> = status
                .remediations
                .iter()
                .filter(|r| r.action == RemediationOutcome::Restarted)
                .map(|r| r.pod_uid.as_str())
                .collect();
            let all_decided = watched.len() == a.trials
                && watched
                    .iter()
                    .all(|(uid, v)| done.contains(uid.as_str()) || v.2);
            if (all_decided && control_ttk.len() >= a.trials) || Instant::now() > deadline {
                // Results for this rate.
                let evictions: BTreeMap<&str, i64> = status
                    .remediations
                    .iter()
                    .filter(|r| r.action == RemediationOutcome::Restarted)
                    .filter_map(|r| {
                        Some((
                            r.pod_uid.as_str(),
                            r.time.parse::<jiff::Timestamp>().ok()?.as_second(),
                        ))
                    })
                    .collect();
                let mut before = 0;
                let mut oom_first = 0;
                let mut to_evict = Vec::new();
                for (uid, (name, start, oom)) in &watched {
                    match (evictions.get(uid.as_str()), oom) {
                        (Some(at), false) => {
                            before += 1;
                            if let Some(s) = start {
                                to_evict.push((*at - *s) as f64);
                                each.push(format!(
                                    "{rate} MiB/s watched {name}: evicted {} s after its start",
                                    at - s
                                ));
                            }
                        }
                        _ => {
                            oom_first += 1;
                            each.push(format!(
                                "{rate} MiB/s watched {name}: OOM-killed before any eviction"
                            ));
                        }
                    }
                }
                for (name, t) in &control_ttk {
                    each.push(format!(
                        "{rate} MiB/s control {name}: OOM-killed {t:.0} s after its start"
                    ));
                }
                let ctl = median(control_ttk.values().copied().collect());
                let ev = median(to_evict.clone());
                let advances: Vec<f64> = ctl
                    .map(|c| to_evict.iter().map(|e| c - e).collect())
                    .unwrap_or_default();
                let fmt =
                    |v: Option<f64>| v.map(|v| format!("{v:.0} s")).unwrap_or_else(|| "-".into());
                println!(
                    "| {rate} MiB/s | {} | {before}/{} ({:.0} %) | {oom_first} | {} ({} killed) | {} | {} | {} |",
                    watched.len(),
                    watched.len(),
                    before as f64 * 100.0 / watched.len().max(1) as f64,
                    fmt(ctl),
                    control_ttk.len(),
                    fmt(ev),
                    fmt(median(advances.clone())),
                    fmt(advances.iter().copied().min_by(f64::total_cmp)),
                );
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        for i in 0..a.trials {
            let _ = deps
                .delete(&format!("leak-{tag}-{i}"), &Default::default())
                .await;
            let _ = deps
                .delete(&format!("ctl-{tag}-{i}"), &Default::default())
                .await;
        }
    }
    println!("\nEvery trial (the table's medians are of these):\n");
    for line in &each {
        println!("    {line}");
    }
    let status = rws.get("trials").await?.status.unwrap_or_default();
    let false_restarts = status
        .remediations
        .iter()
        .filter(|r| r.pod.starts_with("stable-"))
        .count();
    let stable_pods = pods
        .list(&ListParams::default().labels("watched=yes"))
        .await?
        .items;
    let stable_ooms = stable_pods
        .iter()
        .filter(|p| p.name_any().starts_with("stable-") && oom_killed(p))
        .count();
    println!(
        "\nstable pods ({} flat at 100Mi/128Mi, {} sawtooth 60-92Mi/128Mi) watched throughout: {false_restarts} restarts or restart decisions, {stable_ooms} OOM kills",
        a.stable, a.stable
    );
    ns.delete().await;
    println!(
        "\nran {} to {} UTC",
        began.strftime("%Y-%m-%d %H:%M:%S"),
        jiff::Timestamp::now().strftime("%H:%M:%S")
    );
    Ok(())
}

/// What the run ran on, read from the cluster and the checkout rather than written by
/// hand: the command, the API server's version, each node's kubelet, container runtime,
/// kernel and OS as it reports them, the operator's image and arguments, and the commit.
async fn print_conditions(client: &kube::Client) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Node;
    let args: Vec<String> = std::env::args().skip(1).collect();
    println!(
        "# resourcewatch-trials, {} UTC\n",
        jiff::Timestamp::now().strftime("%d %B %Y %H:%M")
    );
    println!("Command: `resourcewatch-trials {}`\n", args.join(" "));
    let v = client
        .apiserver_version()
        .await
        .context("the API server's version")?;
    println!("- API server: Kubernetes {}", v.git_version);
    let nodes: Api<Node> = Api::all(client.clone());
    for n in nodes
        .list(&ListParams::default())
        .await
        .context("nodes")?
        .items
    {
        let Some(i) = n.status.as_ref().and_then(|s| s.node_info.as_ref()) else {
            continue;
        };
        println!(
            "- node {}: kubelet {}, {}, kernel {}, {}",
            n.name_any(),
            i.kubelet_version,
            i.container_runtime_version,
            i.kernel_version,
            i.os_image
        );
    }
    let deps: Api<Deployment> = Api::all(client.clone());
    for d in deps
        .list(&ListParams::default().labels("app.kubernetes.io/name=resourcewatch-operator"))
        .await
        .context("the operator's Deployment")?
        .items
    {
        let c = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.containers.first());
        println!(
            "- operator {}/{}: image {}, args {:?}",
            d.namespace().unwrap_or_default(),
            d.name_any(),
            c.and_then(|c| c.image.clone()).unwrap_or_default(),
            c.and_then(|c| c.args.clone()).unwrap_or_default()
        );
    }
    let commit = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .current_dir(harness::repo_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    println!("- resourcewatch: commit {commit}\n");
    Ok(())
}
