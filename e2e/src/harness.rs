//! The harness of the tests against a cluster: a client from `KUBECONFIG`, the CRD, namespaces per test, fake nodes
//! and pods for API-only runs, and waits with deadlines (never fixed sleeps).

use std::{
    collections::BTreeMap,
    future::Future,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use k8s_openapi::{
    api::{
        core::v1::{Namespace, Node, Pod},
        events::v1::Event,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use resourcewatch_crds::ResourceWatch;

/// The repository root (this crate lives in `e2e/`).
pub fn repo_root() -> PathBuf {
    // The directory cargo runs the test from first: a test binary built in another clone
    // of the repository (a shared target directory; cargo keys products by the path inside
    // the workspace) carries that clone's path, which may be gone.
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .filter(|d| d.join("Cargo.toml").is_file())
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The harness cluster's admin kubeconfig (`e2e/cluster/env.sh`).
const HARNESS_KUBECONFIG: &str = "/var/lib/resourcewatch-e2e/admin.kubeconfig";

/// A client for the harness cluster, or for the one `RW_E2E_KUBECONFIG` opts in to.
///
/// These tests create namespaces and pods and evict pods, so a `KUBECONFIG` that merely
/// happens to be exported (a workstation's) is refused: it must be the harness's, or
/// equal `RW_E2E_KUBECONFIG` (which the run scripts vet, see `e2e/target-cluster.sh`).
pub async fn client() -> anyhow::Result<Client> {
    let Some(kubeconfig) = std::env::var_os("KUBECONFIG") else {
        bail!(
            "KUBECONFIG is not set: start the test cluster with `e2e/cluster/up.sh` (make e2e does)"
        );
    };
    let harness = std::env::var("RW_STATE")
        .map(|state| PathBuf::from(state).join("admin.kubeconfig"))
        .unwrap_or_else(|_| PathBuf::from(HARNESS_KUBECONFIG));
    let opted_in = std::env::var_os("RW_E2E_KUBECONFIG");
    if Path::new(&kubeconfig) != harness && opted_in.as_deref() != Some(kubeconfig.as_os_str()) {
        bail!(
            "KUBECONFIG={} is neither the harness cluster's ({}) nor opted in: \
             run through make e2e / make e2e-api, or set RW_E2E_KUBECONFIG to the same file \
             to test that cluster",
            Path::new(&kubeconfig).display(),
            harness.display()
        );
    }
    if opted_in.is_some() && std::env::var("RW_E2E_ALLOW_PRODUCTION").as_deref() != Ok("yes-really")
    {
        let config = kube::config::Kubeconfig::read_from(&kubeconfig)
            .context("reading RW_E2E_KUBECONFIG")?;
        let names = context_names(&config);
        if looks_like_production(&names) {
            bail!(
                "refusing to test the cluster of context {names:?}: it looks like production \
                 (RW_E2E_ALLOW_PRODUCTION=yes-really overrides)"
            );
        }
    }
    Client::try_default()
        .await
        .context("building a client from KUBECONFIG")
}

/// The current context's name, cluster, user and server, space-separated (what
/// `e2e/target-cluster.sh` checks with kubectl before anything is installed).
pub fn context_names(config: &kube::config::Kubeconfig) -> String {
    let current = config.current_context.clone().unwrap_or_default();
    let context = config
        .contexts
        .iter()
        .find(|c| c.name == current)
        .and_then(|c| c.context.clone());
    let cluster_name = context
        .as_ref()
        .map(|c| c.cluster.clone())
        .unwrap_or_default();
    let server = config
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.as_ref()?.server.clone())
        .unwrap_or_default();
    let user = context.and_then(|c| c.user).unwrap_or_default();
    format!("{current} {cluster_name} {user} {server}")
}

/// Whether one of the words has `prod`, `production`, `prd` or `live` as a component
/// ("eu-prod-1", "gke_acme_prd_x", "https://api.live.example"), as the shell helper decides.
pub fn looks_like_production(names: &str) -> bool {
    names
        .to_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| matches!(w, "prod" | "production" | "prd" | "live"))
}

/// Polls `f` until it returns `Some`, or fails after `deadline` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let start = Instant::now();
    let mut last_err = None;
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if start.elapsed() > deadline {
            bail!(
                "timed out after {deadline:?} waiting for {what}{}",
                last_err
                    .map(|e| format!(" (last error: {e:#})"))
                    .unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Applies the generated CRDs (server-side) and waits until they are established.
pub async fn install_crd(client: &Client) -> anyhow::Result<()> {
    for (file, name) in [
        (
            "crds/resourcewatch.io_resourcewatches.yaml",
            "resourcewatches.resourcewatch.io",
        ),
        (
            "crds/resourcewatch.io_clusterresourcewatches.yaml",
            "clusterresourcewatches.resourcewatch.io",
        ),
        (
            "crds/resourcewatch.io_remediationpolicies.yaml",
            "remediationpolicies.resourcewatch.io",
        ),
    ] {
        let yaml = std::fs::read_to_string(repo_root().join(file))?;
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&yaml)?;
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        api.patch(
            name,
            &PatchParams::apply("resourcewatch-e2e").force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("applying the CRD {name}"))?;
        wait_for("the CRD to be established", Duration::from_secs(30), || {
            let api = api.clone();
            async move {
                let crd = api.get(name).await?;
                let ok = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok(ok.then_some(()))
            }
        })
        .await?;
    }
    Ok(())
}

/// The workload simulator's image (`make images`; imported, never pulled).
pub const WORKLOADS_IMAGE: &str = "localhost/resourcewatch/workloads:0.1.0";
/// This machine's Node.js with the corpus's `mem.js` (node-agent/corpus/programs) and the
/// stack fixtures `leak.js` and `burn.js` (node-agent/tests/fixtures/stacks): a real language runtime in
/// a pod (`make images`).
pub const NODE_WORKLOADS_IMAGE: &str = "localhost/resourcewatch/node-workloads:0.1.0";
/// The C stack fixture (node-agent/tests/fixtures/stacks/leak.c) with its glibc.
pub const C_WORKLOADS_IMAGE: &str = "localhost/resourcewatch/c-workloads:0.1.0";
/// CPython 3.12+ at /usr/local/bin/python3, Debian's 3.11 at /usr/bin/python3.11, and the
/// stack fixtures /leak.py and /burn.py (e2e/cluster/python-image.sh).
pub const PYTHON_WORKLOADS_IMAGE: &str = "localhost/resourcewatch/python-workloads:0.1.0";
/// This machine's OpenJDK 17 runtime at its own path, with the stack fixtures' classes
/// Burn and Leak at / (e2e/cluster/java-image.sh).
pub const JAVA_WORKLOADS_IMAGE: &str = "localhost/resourcewatch/java-workloads:0.1.0";
/// Where the Java image's `java` is (this machine's JDK path).
pub const JAVA_IN_IMAGE: &str = "/usr/lib/jvm/java-17-openjdk-amd64/bin/java";

/// A bare pod running the workload simulator (`leak-sim ARGS`) with the memory limit
/// `limit`, labelled `app=APP`, created in `ns`. A test helper: it panics (the test
/// fails) when the API server refuses the pod.
pub async fn leak_sim_pod(
    client: &Client,
    ns: &str,
    name: &str,
    app: &str,
    args: &[&str],
    limit: &str,
) -> Pod {
    leak_sim_pod_on(client, ns, name, app, args, limit, Placement::Host).await
}

/// Which node of the e2e cluster a test pod runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// This machine (kernel 6.18 here, cgroup v1): wherever the scheduler puts a pod
    /// without the VM node's toleration.
    Host,
    /// The VM node (e2e/cluster/vm-node.sh: Linux 6.1, cgroup v2 only), by its label
    /// and with its taint tolerated.
    Vm,
}

/// The name of the VM node (e2e/cluster/env.sh's RW_VM_NODE_NAME).
pub const VM_NODE: &str = "rw-vm";

impl Placement {
    /// The pod spec's fields that put a pod there.
    pub fn pod_spec_fields(self) -> serde_json::Value {
        match self {
            Placement::Host => serde_json::json!({}),
            Placement::Vm => serde_json::json!({
                "nodeSelector": {"resourcewatch.io/vm-node": "true"},
                "tolerations": [{"key": "resourcewatch.io/vm-node", "operator": "Exists"}],
            }),
        }
    }
}

/// As [`leak_sim_pod`], on `node`.
pub async fn leak_sim_pod_on(
    client: &Client,
    ns: &str,
    name: &str,
    app: &str,
    args: &[&str],
    limit: &str,
    node: Placement,
) -> Pod {
    leak_sim_pod_with(client, ns, name, app, args, limit, node.pod_spec_fields()).await
}

/// As [`leak_sim_pod`], with `spec`'s fields added to the pod's spec (placement, a
/// pod-level `resources`; an empty `limit` leaves the container without one).
pub async fn leak_sim_pod_with(
    client: &Client,
    ns: &str,
    name: &str,
    app: &str,
    args: &[&str],
    limit: &str,
    spec: serde_json::Value,
) -> Pod {
    let container =
        serde_json::json!({"image": WORKLOADS_IMAGE, "command": ["/leak-sim"], "args": args});
    bare_pod_placed(
        client,
        ns,
        name,
        app,
        container,
        limit,
        serde_json::json!({}),
        spec,
    )
    .await
}

/// A bare pod running `command` of the C workloads image (node-agent/tests/fixtures/stacks,
/// frame pointers, glibc as a shared library) as a user other than the agent's (naming
/// its frames then needs the agent's CAP_SYS_PTRACE), labelled `app=NAME`. A test helper:
/// it panics when the pod is refused.
pub async fn c_workload_pod(
    client: &Client,
    ns: &str,
    name: &str,
    command: &str,
    limit: &str,
) -> Pod {
    c_workload_pod_on(client, ns, name, command, limit, Placement::Host).await
}

/// As [`c_workload_pod`], on `node`.
pub async fn c_workload_pod_on(
    client: &Client,
    ns: &str,
    name: &str,
    command: &str,
    limit: &str,
    node: Placement,
) -> Pod {
    let container = serde_json::json!({"image": C_WORKLOADS_IMAGE, "command": [command]});
    let security = serde_json::json!({"runAsUser": 65532, "runAsGroup": 65532});
    let spec = node.pod_spec_fields();
    bare_pod_placed(client, ns, name, name, container, limit, security, spec).await
}

/// The hostile workload (node-agent/tests/fixtures/hostile/hostile.c, in the c-workloads
/// image) as root in its container (it chroots), its chroot symlink pointing at `secret`,
/// mapping `files` crafted files, on `node`.
pub async fn hostile_pod(
    client: &Client,
    ns: &str,
    name: &str,
    secret: &str,
    files: u32,
    node: Placement,
) -> Pod {
    let container = serde_json::json!({
        "image": C_WORKLOADS_IMAGE,
        "command": ["/hostile", secret, files.to_string()],
    });
    let spec = node.pod_spec_fields();
    bare_pod_placed(
        client,
        ns,
        name,
        name,
        container,
        "1Gi",
        serde_json::json!({}),
        spec,
    )
    .await
}

/// A bare pod running this machine's Node.js (the node-workloads image) with `args`, as a
/// user other than the agent's, with an emptyDir at /tmp (where `--perf-basic-prof` writes
/// the perf map, as in a pod with a read-only root file system).
pub async fn node_workload_pod(
    client: &Client,
    ns: &str,
    name: &str,
    args: &[&str],
    limit: &str,
) -> Pod {
    runtime_workload_pod(
        client,
        ns,
        name,
        NODE_WORKLOADS_IMAGE,
        "/usr/bin/node",
        args,
        limit,
    )
    .await
}

/// A bare pod running `argv` in the python-workloads image (`argv[0]` an interpreter:
/// `/usr/local/bin/python3`, 3.12+, or `/usr/bin/python3.11`), as [`node_workload_pod`]
/// runs Node.js: another user, /tmp an emptyDir (the perf map).
pub async fn python_workload_pod(
    client: &Client,
    ns: &str,
    name: &str,
    argv: &[&str],
    limit: &str,
) -> Pod {
    let (command, args) = argv.split_first().expect("an interpreter to run");
    runtime_workload_pod(
        client,
        ns,
        name,
        PYTHON_WORKLOADS_IMAGE,
        command,
        args,
        limit,
    )
    .await
}

/// A bare pod running OpenJDK 17 (the java-workloads image) with `args`, as
/// [`node_workload_pod`] runs Node.js: another user, /tmp an emptyDir (where the JVM's
/// attach socket and perf map go).
pub async fn java_workload_pod(
    client: &Client,
    ns: &str,
    name: &str,
    args: &[&str],
    limit: &str,
) -> Pod {
    runtime_workload_pod(
        client,
        ns,
        name,
        JAVA_WORKLOADS_IMAGE,
        JAVA_IN_IMAGE,
        args,
        limit,
    )
    .await
}

async fn runtime_workload_pod(
    client: &Client,
    ns: &str,
    name: &str,
    image: &str,
    command: &str,
    args: &[&str],
    limit: &str,
) -> Pod {
    let container = serde_json::json!({
        "image": image, "command": [command], "args": args,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]
    });
    let security = serde_json::json!({"runAsUser": 65532, "runAsGroup": 65532});
    bare_pod(client, ns, name, name, container, limit, security).await
}

/// A pod of one container `main` (`container`: its image and command), never restarted,
/// with the memory limit `limit`; an emptyDir for each of the container's volumeMounts.
async fn bare_pod(
    client: &Client,
    ns: &str,
    name: &str,
    app: &str,
    container: serde_json::Value,
    limit: &str,
    security_context: serde_json::Value,
) -> Pod {
    bare_pod_placed(
        client,
        ns,
        name,
        app,
        container,
        limit,
        security_context,
        serde_json::json!({}),
    )
    .await
}

/// As `bare_pod`, with `placement`'s fields (nodeSelector, tolerations) added to the
/// pod's spec.
#[allow(clippy::too_many_arguments)]
async fn bare_pod_placed(
    client: &Client,
    ns: &str,
    name: &str,
    app: &str,
    mut container: serde_json::Value,
    limit: &str,
    security_context: serde_json::Value,
    placement: serde_json::Value,
) -> Pod {
    container["name"] = "main".into();
    container["imagePullPolicy"] = "Never".into();
    // An empty `limit`: the container has none (a pod-level limit may be in `placement`).
    container["resources"] = if limit.is_empty() {
        serde_json::json!({"requests": {"memory": "8Mi", "cpu": "10m"}})
    } else {
        serde_json::json!({
            "limits": {"memory": limit}, "requests": {"memory": "8Mi", "cpu": "10m"}
        })
    };
    let volumes: Vec<serde_json::Value> = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| serde_json::json!({"name": m["name"], "emptyDir": {}}))
        .collect();
    let mut pod = serde_json::json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "volumes": volumes,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            // No API access needed; and on clusters that still make token Secrets (< 1.24)
            // a pod that mounts one is refused ("No API token found ... retry") until the
            // token controller has caught up with the new namespace.
            "automountServiceAccountToken": false,
            "securityContext": security_context,
            "containers": [container]
        }
    });
    for (k, v) in placement.as_object().into_iter().flatten() {
        pod["spec"][k] = v.clone();
    }
    let pod: Pod = serde_json::from_value(pod).expect("pod json");
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod {ns}/{name}: {e}"))
}

/// A client of the test cluster and a fresh namespace for one test. A test helper: it
/// panics (the test fails) when either can't be had.
pub async fn test_namespace(prefix: &str) -> (Client, TestNamespace) {
    let client = client().await.expect("cluster");
    let ns = TestNamespace::create(&client, prefix)
        .await
        .unwrap_or_else(|e| panic!("namespace {prefix}: {e:#}"));
    (client, ns)
}

/// The usual test watch: `name` in `ns` on the pods labelled `app=APP`, every 5 s.
pub async fn watch_app(client: &Client, ns: &str, name: &str, app: &str) -> Api<ResourceWatch> {
    let spec = serde_json::json!({"selector": {"matchLabels": {"app": app}}, "interval": "5s"});
    create_watch(client, ns, name, spec).await.0
}

/// Creates the ResourceWatch `name` in `ns` with `spec` and returns the namespace's
/// watch API and the object as the API server stored it (with what admission added).
/// A test helper: it panics when the watch is refused.
pub async fn create_watch(
    client: &Client,
    ns: &str,
    name: &str,
    spec: serde_json::Value,
) -> (Api<ResourceWatch>, ResourceWatch) {
    let rw: ResourceWatch = serde_json::from_value(serde_json::json!({
        "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ResourceWatch",
        "metadata": {"name": name}, "spec": spec
    }))
    .expect("watch json");
    let rws: Api<ResourceWatch> = Api::namespaced(client.clone(), ns);
    let created = rws
        .create(&PostParams::default(), &rw)
        .await
        .unwrap_or_else(|e| panic!("creating watch {ns}/{name}: {e}"));
    (rws, created)
}

/// `leak-sim` arguments of the stable pods remediation must never restart: 100 MiB held
/// flat, and a GC-like sawtooth from 60 MiB up 4 MiB/s every 8 s. The e2e test and the
/// trial report use the same ones.
pub const FLAT_ARGS: &[&str] = &["--pattern", "flat", "--size", "100MiB"];
pub const SAWTOOTH_ARGS: &[&str] = &[
    "--pattern",
    "sawtooth",
    "--baseline",
    "60MiB",
    "--rate",
    "4MiB",
    "--period",
    "8",
];

/// `leak-sim` arguments of a leak: 20 MiB held, then `rate` (e.g. "2MiB/s") after
/// `delay` seconds.
pub fn leak_args<'a>(rate: &'a str, delay: &'a str) -> Vec<&'a str> {
    let mut args = vec!["--pattern", "leak", "--baseline", "20MiB", "--rate", rate];
    args.extend(["--delay", delay]);
    args
}

/// A namespace for one test, deleted (without waiting) when dropped.
pub struct TestNamespace {
    pub name: String,
    client: Client,
}

impl TestNamespace {
    pub async fn create(client: &Client, prefix: &str) -> anyhow::Result<Self> {
        let name = format!("{prefix}-{}", std::process::id() % 100_000);
        let api: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"resourcewatch.io/e2e": "true"}}
        }))?;
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        // Pods need the namespace's default ServiceAccount (made by the controller-manager).
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &name);
        wait_for(
            "the default ServiceAccount",
            Duration::from_secs(60),
            || {
                let sas = sas.clone();
                async move { Ok(sas.get_opt("default").await?.map(|_| ())) }
            },
        )
        .await?;
        Ok(Self {
            name,
            client: client.clone(),
        })
    }
}

impl TestNamespace {
    /// Labels the namespace as a cluster admin does to allow evictions in it
    /// (`resourcewatch.io/remediation=enabled`).
    /// Everything a Restart watch here needs, as a user sets it up: the cluster admin's
    /// opt-in label, a RemediationPolicy `restarts` granting every watch, and the
    /// evictor role bound to the operator of `operator_namespace`.
    pub async fn opt_in(&self) -> anyhow::Result<()> {
        self.opt_in_for("resourcewatch-system").await
    }

    pub async fn opt_in_for(&self, operator_namespace: &str) -> anyhow::Result<()> {
        Api::<Namespace>::all(self.client.clone())
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": {
                    resourcewatch_crds::NAMESPACE_OPT_IN_LABEL: resourcewatch_crds::NAMESPACE_OPT_IN_VALUE}}})),
            )
            .await?;
        grant_restarts(&self.client, &self.name, "restarts", serde_json::json!({})).await?;
        bind_to_operator(&self.name, "resourcewatch-evictor", operator_namespace)
    }
}

/// A RemediationPolicy `name` in `ns` with this spec.
pub async fn grant_restarts(
    client: &Client,
    ns: &str,
    name: &str,
    spec: serde_json::Value,
) -> anyhow::Result<()> {
    let p: resourcewatch_crds::RemediationPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "resourcewatch.io/v1alpha1", "kind": "RemediationPolicy",
        "metadata": {"name": name}, "spec": spec
    }))?;
    Api::<resourcewatch_crds::RemediationPolicy>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("resourcewatch-e2e").force(),
            &Patch::Apply(&p),
        )
        .await
        .with_context(|| format!("RemediationPolicy {ns}/{name}"))?;
    Ok(())
}

/// A RoleBinding in `ns` of the ClusterRole `role` (resourcewatch-evictor or
/// resourcewatch-profiler) to the operator's ServiceAccount of `operator_namespace`.
pub fn bind_to_operator(ns: &str, role: &str, operator_namespace: &str) -> anyhow::Result<()> {
    let (ok, _, err) = kubectl_apply(&format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {role}, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role}}}
subjects: [{{kind: ServiceAccount, name: resourcewatch-operator, namespace: {operator_namespace}}}]
"#
    ));
    anyhow::ensure!(ok, "binding {role} in {ns}: {err}");
    Ok(())
}

/// A YAML document as an untyped value, as Kubernetes reads it (one definition, in
/// resourcewatch-crds).
pub use resourcewatch_crds::yaml_value;

/// The RBAC of config/rbac/ for an operator whose ServiceAccount lives in `ns`: the
/// ClusterRoles as shipped, its ClusterRole bound to `ns`'s account (a binding of its
/// own, `resourcewatch-operator-<ns>`), and its Role in `ns`.
pub async fn operator_rbac(ns: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(repo_root().join("config/rbac/operator.yaml"))?;
    let mut docs = Vec::new();
    for doc in text.split("\n---") {
        // A document that does not parse fails the test: skipping it would drop an object
        // of the RBAC under test. A comment-only chunk is null.
        let mut v = yaml_value(doc)?;
        if v.is_null() {
            continue;
        }
        match v["kind"].as_str() {
            Some("ClusterRole") => {}
            Some("ClusterRoleBinding") => {
                v["metadata"]["name"] = format!("resourcewatch-operator-{ns}").into();
                for s in v["subjects"].as_array_mut().into_iter().flatten() {
                    s["namespace"] = ns.into();
                }
            }
            _ => {
                v["metadata"]["namespace"] = ns.into();
                for s in v["subjects"].as_array_mut().into_iter().flatten() {
                    s["namespace"] = ns.into();
                }
            }
        }
        docs.push(serde_json::to_string(&v)?);
    }
    let users = std::fs::read_to_string(repo_root().join("config/rbac/users.yaml"))?;
    let (ok, _, err) = kubectl_apply(&format!("{}\n---\n{users}", docs.join("\n---\n")));
    anyhow::ensure!(ok, "applying the operator's RBAC: {err}");
    Ok(())
}

/// A token the API server issues for ServiceAccount `sa` of `ns` (an hour), as kubelet
/// would project one: the operator authenticates with it as itself.
pub async fn service_account_token(client: &Client, ns: &str, sa: &str) -> anyhow::Result<String> {
    use k8s_openapi::api::{authentication::v1::TokenRequest, core::v1::ServiceAccount};
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let req: TokenRequest =
        serde_json::from_value(serde_json::json!({"spec": {"expirationSeconds": 3600}}))?;
    issue_token(&sas, sa, &req).await
}

/// The harness's kubeconfig with its user replaced by `token`.
pub fn write_token_kubeconfig(path: &Path, token: &str) -> anyhow::Result<()> {
    let from = std::env::var_os("KUBECONFIG").context("KUBECONFIG")?;
    let mut k = yaml_value(&std::fs::read_to_string(&from)?)?;
    k["users"] = serde_json::json!([{"name": "operator", "user": {"token": token}}]);
    for c in k["contexts"].as_array_mut().into_iter().flatten() {
        c["context"]["user"] = "operator".into();
    }
    std::fs::write(path, serde_saphyr::to_string(&k)?)?;
    Ok(())
}

impl TestNamespace {
    /// Deletes the namespace and waits until it is gone, so no workload of this test
    /// outlives it (a `Drop` alone can't wait: the test's runtime is ending).
    pub async fn delete(self) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        if std::env::var_os("RW_E2E_KEEP").is_none() {
            let _ = api.delete(&self.name, &DeleteParams::background()).await;
            let name = self.name.clone();
            let _ = wait_for(
                "the test namespace to be gone",
                Duration::from_secs(90),
                || {
                    let api = api.clone();
                    let name = name.clone();
                    async move { Ok(api.get_opt(&name).await?.is_none().then_some(())) }
                },
            )
            .await;
        }
        std::mem::forget(self);
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("RW_E2E_KEEP").is_some() {
            return;
        }
        // A test that panics drops its namespace while its runtime shuts down, and a task
        // spawned then never runs: the failed test's pods went on burning CPU and leaking
        // beside every later test (one Node.js test failing on a fresh machine took four
        // more profile tests and a ranking test with it, their burners at a fifth to a half
        // of a core). So then the deletion is asked for here, with kubectl, not awaited.
        if std::thread::panicking() {
            let _ = std::process::Command::new(kubectl())
                .args(["delete", "namespace", &self.name, "--wait=false"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
            return;
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        let name = self.name.clone();
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                let _ = api.delete(&name, &DeleteParams::background()).await;
            });
        }
    }
}

/// Deletes every pod of `ns` at once (grace 0): where no kubelet runs, nothing would
/// finish a graceful deletion, and the namespace would never go.
pub async fn delete_pods_now(client: &Client, ns: &str) {
    let _ = Api::<Pod>::namespaced(client.clone(), ns)
        .delete_collection(
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
            &kube::api::ListParams::default(),
        )
        .await;
}

/// A Node object with no kubelet behind it: API-only tests schedule pods to it by name.
/// A token that proves `node` to the operator, as kubelet gives the real agent: the agent
/// ServiceAccount (made in `ns`, the operator's namespace, when missing), a pod of it
/// bound to `node` (no kubelet runs it in the API-only tests), and a TokenRequest bound to
/// that pod for the operator's audience. The operator reviews it like any agent's.
pub async fn agent_token(client: &Client, ns: &str, node: &str) -> anyhow::Result<String> {
    use k8s_openapi::api::{authentication::v1::TokenRequest, core::v1::ServiceAccount};
    const SA: &str = "resourcewatch-agent";
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
        "metadata": {"name": SA}, "automountServiceAccountToken": false
    }))?;
    match sas.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // Pod names are DNS labels; simulated node names can be long.
    let name: String = format!("resourcewatch-agent-{node}")
        .chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches('-')
        .to_owned();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "resourcewatch-agent"}},
        "spec": {
            "nodeName": node,
            "serviceAccountName": SA,
            "automountServiceAccountToken": false,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "agent", "image": "localhost/resourcewatch/none:0"}]
        }
    }))?;
    let pod = match pods.create(&PostParams::default(), &pod).await {
        Ok(p) => p,
        Err(kube::Error::Api(e)) if e.code == 409 => pods.get(&name).await?,
        Err(e) => return Err(e.into()),
    };
    let req: TokenRequest = serde_json::from_value(serde_json::json!({
        "spec": {
            "audiences": ["resourcewatch-operator"],
            "expirationSeconds": 3600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": name, "uid": pod.metadata.uid}
        }
    }))?;
    issue_token(&sas, SA, &req).await
}

async fn issue_token(
    sas: &Api<k8s_openapi::api::core::v1::ServiceAccount>,
    sa: &str,
    req: &k8s_openapi::api::authentication::v1::TokenRequest,
) -> anyhow::Result<String> {
    let token = sas
        .create_token_request(sa, &PostParams::default(), req)
        .await?
        .status
        .map(|s| s.token)
        .unwrap_or_default();
    anyhow::ensure!(!token.is_empty(), "the TokenRequest returned no token");
    Ok(token)
}

pub async fn fake_node(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"resourcewatch.io/simulated": "true"}},
        "spec": {"unschedulable": true}
    }))?;
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A pod bound to `node` whose status says its one container `app` runs with `container_id`
/// (as kubelet would write it), for API-only tests where no kubelet runs.
pub async fn fake_running_pod(
    client: &Client,
    ns: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
    node: &str,
    container_id: &str,
) -> anyhow::Result<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "app", "image": "localhost/resourcewatch/none:0"}]
        }
    }))?;
    let created = match api.create(&PostParams::default(), &pod).await {
        Ok(p) => p,
        Err(kube::Error::Api(e)) if e.code == 409 => api.get(name).await?,
        Err(e) => return Err(e.into()),
    };
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&running_status(container_id)),
    )
    .await
    .context("writing the pod's status")?;
    Ok(created)
}

/// A Deployment whose pods (made by the real ReplicaSet controller) are bound to `node`
/// and marked running there, for API-only tests: a workload the operator may evict.
/// Returns the pods, each with its container id.
pub async fn fake_deployment(
    client: &Client,
    ns: &str,
    name: &str,
    replicas: i32,
    labels: &BTreeMap<String, String>,
    node: &str,
) -> anyhow::Result<Vec<(Pod, String)>> {
    use k8s_openapi::api::apps::v1::Deployment;
    let d: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"deployment": name}},
            "template": {
                "metadata": {"labels": labels.iter().map(|(k, v)| (k.clone(), v.clone()))
                    .chain([("deployment".to_string(), name.to_string())]).collect::<BTreeMap<_, _>>()},
                "spec": {
                    "automountServiceAccountToken": false,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "app", "image": "localhost/resourcewatch/none:0"}]
                }
            }
        }
    }))?;
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &d)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = kube::api::ListParams::default().labels(&format!("deployment={name}"));
    let made = wait_for("the Deployment's pods", Duration::from_secs(60), || {
        let pods = pods.clone();
        let lp = lp.clone();
        async move {
            let l = pods.list(&lp).await?.items;
            Ok((l.len() >= replicas as usize).then_some(l))
        }
    })
    .await?;
    let mut out = Vec::new();
    for p in made {
        let pname = p.metadata.name.clone().unwrap_or_default();
        let binding = serde_json::json!({
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": pname},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}
        });
        pods.create_subresource::<serde_json::Value, serde_json::Value>(
            "binding",
            &pname,
            &PostParams::default(),
            &binding,
        )
        .await
        .context("binding the pod to its node")?;
        let cid = container_id(&format!("{ns}/{pname}"));
        let p = pods
            .patch_status(
                &pname,
                &PatchParams::default(),
                &Patch::Merge(&running_status(&cid)),
            )
            .await
            .context("writing the pod's status")?;
        out.push((p, cid));
    }
    Ok(out)
}

/// The status kubelet would write for a pod whose one container `app` runs.
fn running_status(container_id: &str) -> serde_json::Value {
    serde_json::json!({
        "status": {
            "phase": "Running",
            "containerStatuses": [{
                "name": "app", "ready": true, "restartCount": 0,
                "image": "localhost/resourcewatch/none:0", "imageID": "",
                "containerID": format!("containerd://{container_id}"),
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
            }]
        }
    })
}

/// A 64-hex container id derived from a name, as a runtime would make one.
pub fn container_id(seed: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut out = String::new();
    for round in 0..4u64 {
        for b in seed.bytes().chain(round.to_le_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out
}

/// Container restarts of a pod (an OOM kill in place restarts its container, keeping the
/// pod's UID).
pub fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum())
}

/// Whether a container of the pod was OOM-killed: its current or last state says so.
pub fn oom_killed(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                [c.last_state.as_ref(), c.state.as_ref()]
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.terminated.as_ref())
                    .any(|t| t.reason.as_deref() == Some("OOMKilled"))
            })
        })
}

/// `kubectl apply -f -` of `manifest` (YAML or JSON): whether it succeeded, its stdout
/// and its stderr.
pub fn kubectl_apply(manifest: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut c = std::process::Command::new(kubectl())
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    if let Some(mut i) = c.stdin.take() {
        i.write_all(manifest.as_bytes()).expect("stdin");
    }
    let o = c.wait_with_output().expect("kubectl output");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The events.k8s.io/v1 Events of namespace `ns` with `reason` (none if listing fails:
/// callers poll).
pub async fn events(client: &Client, ns: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Waits up to `secs` for an Event of `reason` in `ns` whose note satisfies `want`, and
/// returns the Events of that reason. The operator publishes an Event after the status
/// write it announces (and tries a failed one again 10 s later), so a test that has just
/// seen the status must wait for its Event, not list once. Panics naming what it saw.
pub async fn event_where(
    client: &Client,
    ns: &str,
    reason: &str,
    secs: u64,
    want: impl Fn(&str) -> bool,
) -> Vec<Event> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let got = events(client, ns, reason).await;
        if got.iter().any(|e| e.note.as_deref().is_some_and(&want)) {
            return got;
        }
        if Instant::now() > deadline {
            let notes: Vec<_> = got.iter().filter_map(|e| e.note.as_deref()).collect();
            panic!(
                "no {reason} Event as wanted in {ns} within {secs} s; the {reason} notes: {notes:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `$KUBECTL` (the run scripts export the harness's, the cluster's own version), else
/// `kubectl` on PATH.
pub fn kubectl() -> PathBuf {
    std::env::var_os("KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("kubectl"))
}

/// `GET path` over HTTPS from `addr`, verifying the server as `server_name` against
/// `ca_pem`, with `token` as a bearer token when given: what Prometheus does. Returns the
/// status code and body.
pub async fn https_get(
    addr: std::net::SocketAddr,
    server_name: &str,
    ca_pem: &str,
    token: Option<&str>,
    path: &str,
) -> anyhow::Result<(u16, String)> {
    let req = resourcewatch_runtime::https::Get {
        server_name,
        ca_pem,
        identity: None,
        token,
        path,
    };
    Ok(resourcewatch_runtime::https::get(addr, &req).await?)
}

/// A token of a ServiceAccount `name` in `ns` bound to the ClusterRole `role` (e.g.
/// resourcewatch-metrics-reader), or to nothing when `role` is None.
pub async fn token_with_role(
    client: &Client,
    ns: &str,
    name: &str,
    role: Option<&str>,
) -> anyhow::Result<String> {
    let mut manifest = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {name}, namespace: {ns}}}\n"
    );
    if let Some(role) = role {
        manifest.push_str(&format!(
            r#"---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {ns}-{name}, labels: {{resourcewatch.io/e2e: "true"}}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role}}}
subjects: [{{kind: ServiceAccount, name: {name}, namespace: {ns}}}]
"#
        ));
    }
    let (ok, _, err) = kubectl_apply(&manifest);
    anyhow::ensure!(ok, "{err}");
    service_account_token(client, ns, name).await
}

/// The CA certificate the installed operator publishes (ConfigMap resourcewatch-ca-bundle
/// in resourcewatch-system): what verifies its serving certificate.
/// `tls.crt` and `tls.key` of a leaf Secret the operator issues in resourcewatch-system
/// (resourcewatch-metrics-client, resourcewatch-agent-tls).
pub async fn leaf_secret(client: &Client, name: &str) -> (String, String) {
    let s = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
        client.clone(),
        "resourcewatch-system",
    )
    .get(name)
    .await
    .unwrap_or_else(|e| panic!("Secret resourcewatch-system/{name}: {e}"));
    let field = |k: &str| {
        s.data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .unwrap_or_else(|| panic!("Secret {name} has no {k}"))
    };
    (field("tls.crt"), field("tls.key"))
}

pub async fn ca_bundle(client: &Client) -> String {
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "resourcewatch-system")
        .get("resourcewatch-ca-bundle")
        .await
        .ok()
        .and_then(|c| c.data?.get("ca.crt").cloned())
        .expect("the operator's CA bundle")
}

#[cfg(test)]
mod tests {
    /// Every document operator_rbac reads parses (a failure there now fails its tests).
    #[test]
    fn every_document_of_the_operators_rbac_parses() {
        let text = std::fs::read_to_string(super::repo_root().join("config/rbac/operator.yaml"))
            .expect("read");
        let kinds: Vec<String> = text
            .split("\n---")
            .map(|doc| super::yaml_value(doc).expect("a document parses"))
            .filter(|v| !v.is_null())
            .map(|v| v["kind"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert!(kinds.iter().any(|k| k == "ClusterRole"), "{kinds:?}");
        assert!(kinds.iter().all(|k| !k.is_empty()), "{kinds:?}");
    }

    /// YAML 1.1's booleans and numbers with leading zeros or underscores stay strings, as
    /// Kubernetes reads them; real booleans and numbers do not.
    #[test]
    fn yaml_values_are_read_as_kubernetes_reads_them() {
        let v = super::yaml_value("a: on\nb: no\nc: y\nd: 010\ne: 1_000\nf: true\ng: 3\n")
            .expect("yaml");
        assert_eq!(
            v,
            serde_json::json!({"a": "on", "b": "no", "c": "y", "d": "010", "e": "1_000", "f": true, "g": 3})
        );
    }
}
