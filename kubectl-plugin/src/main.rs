//! `kubectl resourcewatch` (kubectl finds `kubectl-resourcewatch` on PATH): see lib.rs.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
    core::SelectorExt,
};
use kubectl_resourcewatch::{Format, Listing};
use resourcewatch_crds::{ClusterResourceWatch, PROFILE_ANNOTATION, ProfileState, ResourceWatch};

#[derive(Parser)]
#[command(
    name = "kubectl-resourcewatch",
    bin_name = "kubectl resourcewatch",
    version,
    about = "What resourcewatch found: Top-K, leaks, a watch's state, CPU profiles"
)]
struct Args {
    /// The namespace (default: the kubeconfig context's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    /// The kubeconfig file to use (default: KUBECONFIG, then ~/.kube/config, then the
    /// pod's service account).
    #[arg(long, global = true, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    context: Option<String>,
    /// Output format of top, leaks and kills: a table (wide: with every column), or the
    /// status entries as a JSON or YAML List.
    #[arg(short = 'o', long = "output", global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Tables without their header line.
    #[arg(long, global = true)]
    no_headers: bool,
    /// Only the watches with these labels (a label selector: `team=shop,tier!=batch`).
    #[arg(short = 'l', long, global = true)]
    selector: Option<String>,
    /// Orders the entries by a field of each (a JSONPath as -o json shows the entries:
    /// `.process.value`, `.warnedSecondsBefore`, `.time`).
    #[arg(long, global = true, value_name = "JSONPATH")]
    sort_by: Option<String>,
    /// After the listing, print it again whenever it changes (until interrupted).
    #[arg(short = 'w', long = "watch", global = true)]
    follow: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    Table,
    Wide,
    Json,
    Yaml,
}

impl From<Output> for Format {
    fn from(o: Output) -> Self {
        match o {
            Output::Table => Format::Table,
            Output::Wide => Format::Wide,
            Output::Json => Format::Json,
            Output::Yaml => Format::Yaml,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// The heaviest processes of a watch (every watch of the namespace without one), or
    /// of a ClusterResourceWatch's nodes with --nodes.
    Top {
        watch: Option<String>,
        /// Resident memory instead of CPU.
        #[arg(long)]
        memory: bool,
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// The node view: a ClusterResourceWatch of this name.
        #[arg(long, value_name = "CLUSTERRESOURCEWATCH")]
        nodes: Option<String>,
    },
    /// Leaking containers with their predicted time to OOM and where they grow.
    Leaks {
        watch: Option<String>,
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Also write each leak's growth sites as a memory profile (pprof: bytes added by
        /// stack) into this directory, NAMESPACE_POD_CONTAINER.growth.pb.gz.
        #[arg(long, value_name = "DIR")]
        output_dir: Option<PathBuf>,
    },
    /// Containers the kernel OOM-killed and whether (how early, how accurately) each was
    /// predicted; with --nodes, every OOM kill on a ClusterResourceWatch's nodes.
    Kills {
        watch: Option<String>,
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// The node view: a ClusterResourceWatch of this name.
        #[arg(long, value_name = "CLUSTERRESOURCEWATCH")]
        nodes: Option<String>,
    },
    /// A shell completion script: `source <(kubectl-resourcewatch completion bash)`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// A watch's state in words: conditions, nodes, leaks, remediation, the last profile.
    Explain { watch: String },
    /// Profile a pod's CPU: asks for it on the watch that selects the pod, waits, and
    /// writes profile.folded, profile.svg and profile.pb.gz (pprof) into --output-dir.
    Profile {
        pod: String,
        /// The ResourceWatch to ask (default: the one watch of the namespace that selects
        /// the pod). (-w/--watch is kubectl's "keep printing".)
        #[arg(long = "resourcewatch", value_name = "WATCH")]
        watch: Option<String>,
        #[arg(short, long)]
        container: Option<String>,
        /// How long to sample (1-60 s).
        #[arg(short, long, default_value = "10s")]
        duration: String,
        /// The directory to write into (made if missing).
        #[arg(long, default_value = ".")]
        output_dir: PathBuf,
        /// How long to wait for the result beyond the duration.
        #[arg(long, default_value = "90s")]
        timeout: String,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kubectl-resourcewatch: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A client for `--kubeconfig` and `--context` (as kubectl reads them), and the
/// namespace to use.
async fn client(args: &Args) -> anyhow::Result<(Client, String)> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None if args.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .context("--context")?,
        None => kube::Config::infer()
            .await
            .context("no Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster)")?,
    };
    let ns = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    Ok((
        Client::try_from(config).context("the Kubernetes client")?,
        ns,
    ))
}

async fn run(args: Args) -> anyhow::Result<()> {
    if let Command::Completion { shell } = &args.command {
        return completion(*shell);
    }
    let (client, ns) = client(&args).await?;
    let sel = args.selector.as_deref();
    match &args.command {
        Command::Top {
            watch,
            memory,
            all_namespaces,
            nodes: Some(name),
        } => {
            node_listing(&args, &client, name, watch, *all_namespaces, |v| {
                kubectl_resourcewatch::node_top_listing(v, *memory)
            })
            .await?;
        }
        Command::Top {
            watch,
            memory,
            all_namespaces,
            nodes: None,
        } => {
            Watches::of(&client, &ns, sel, watch, *all_namespaces)
                .list(&args, |ws| kubectl_resourcewatch::top_listing(ws, *memory))
                .await?;
        }
        Command::Leaks {
            watch,
            all_namespaces,
            output_dir: Some(dir),
        } => {
            let ws = Watches::of(&client, &ns, sel, watch, *all_namespaces)
                .get()
                .await?;
            write_growth_profiles(&ws, dir)?;
        }
        Command::Leaks {
            watch,
            all_namespaces,
            output_dir: None,
        } => {
            Watches::of(&client, &ns, sel, watch, *all_namespaces)
                .list(&args, kubectl_resourcewatch::leaks_listing)
                .await?;
        }
        Command::Kills {
            watch,
            all_namespaces,
            nodes: Some(name),
        } => {
            node_listing(&args, &client, name, watch, *all_namespaces, |v| {
                kubectl_resourcewatch::node_kills_listing(v)
            })
            .await?;
        }
        Command::Kills {
            watch,
            all_namespaces,
            nodes: None,
        } => {
            Watches::of(&client, &ns, sel, watch, *all_namespaces)
                .list(&args, kubectl_resourcewatch::kills_listing)
                .await?;
        }
        Command::Explain { watch } => {
            for w in &watches(&client, &ns, Some(watch), false, None).await? {
                print!("{}", kubectl_resourcewatch::explain(w));
            }
        }
        Command::Profile { .. } => profile_command(&client, &ns, &args.command).await?,
        Command::Completion { .. } => {}
    }
    Ok(())
}

/// `completion SHELL`: the script, on stdout.
fn completion(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut out = std::io::stdout();
    clap_complete::generate(
        shell,
        &mut Args::command(),
        "kubectl-resourcewatch",
        &mut out,
    );
    Ok(())
}

/// `profile`: its durations read, then [`profile`].
async fn profile_command(client: &Client, ns: &str, command: &Command) -> anyhow::Result<()> {
    let Command::Profile {
        pod,
        watch,
        container,
        duration,
        output_dir,
        timeout,
    } = command
    else {
        return Ok(());
    };
    let duration = resourcewatch_units::parse_duration(duration).context("--duration")?;
    let timeout = resourcewatch_units::parse_duration(timeout).context("--timeout")?;
    profile(
        client,
        ns,
        pod,
        watch.clone(),
        container.as_deref(),
        duration,
        output_dir,
        timeout,
    )
    .await
}

/// Which watches a command lists: one by name, every one of a namespace or of all, those
/// matching `-l`.
struct Watches<'a> {
    client: &'a Client,
    ns: &'a str,
    watch: Option<&'a str>,
    all_namespaces: bool,
    selector: Option<&'a str>,
}

impl<'a> Watches<'a> {
    fn of(
        client: &'a Client,
        ns: &'a str,
        selector: Option<&'a str>,
        watch: &'a Option<String>,
        all_namespaces: bool,
    ) -> Self {
        Self {
            client,
            ns,
            watch: watch.as_deref(),
            all_namespaces,
            selector,
        }
    }

    async fn get(&self) -> anyhow::Result<Vec<ResourceWatch>> {
        watches(
            self.client,
            self.ns,
            self.watch,
            self.all_namespaces,
            self.selector,
        )
        .await
    }

    /// Prints `render` of the watches (again on each change with `--watch`).
    async fn list(
        &self,
        args: &Args,
        render: impl Fn(&[ResourceWatch]) -> kubectl_resourcewatch::Listing,
    ) -> anyhow::Result<()> {
        list(args, || async { Ok(render(&self.get().await?)) }).await
    }
}

/// `--nodes NAME`: `render` of a ClusterResourceWatch, which no watch name or `-A` goes with.
async fn node_listing(
    args: &Args,
    client: &Client,
    name: &str,
    watch: &Option<String>,
    all_namespaces: bool,
    render: impl Fn(&ClusterResourceWatch) -> kubectl_resourcewatch::Listing,
) -> anyhow::Result<()> {
    if watch.is_some() || all_namespaces {
        bail!("--nodes shows a ClusterResourceWatch: no watch or -A with it");
    }
    list(args, || async {
        Ok(render(&node_view(client, name).await?))
    })
    .await
}

/// `leaks --output-dir DIR`: each leak's growth sites as a pprof file in `dir`.
fn write_growth_profiles(ws: &[ResourceWatch], dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (file, bytes) in kubectl_resourcewatch::growth_profiles(ws)? {
        let path = dir.join(&file);
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}

async fn node_view(client: &Client, name: &str) -> anyhow::Result<ClusterResourceWatch> {
    Api::<ClusterResourceWatch>::all(client.clone())
        .get(name)
        .await
        .with_context(|| format!("ClusterResourceWatch {name}"))
}

/// Prints what `fetch` lists as `-o`, `--no-headers` and `--sort-by` ask; with `--watch`,
/// again each time it changes (read every 2 s).
async fn list<F, Fut>(args: &Args, fetch: F) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Listing>>,
{
    let mut last = String::new();
    loop {
        let mut l = fetch().await?;
        if let Some(path) = &args.sort_by {
            l.sort_by(path).map_err(anyhow::Error::msg)?;
        }
        let text = l
            .render(args.output.into(), !args.no_headers)
            .map_err(anyhow::Error::msg)?;
        if text != last {
            print!("{text}");
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
            last = text;
        }
        if !args.follow {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn watches(
    client: &Client,
    ns: &str,
    one: Option<&str>,
    all: bool,
    selector: Option<&str>,
) -> anyhow::Result<Vec<ResourceWatch>> {
    if let Some(name) = one {
        if selector.is_some() {
            bail!("a watch's name and -l together: name it, or select by labels");
        }
        let api: Api<ResourceWatch> = Api::namespaced(client.clone(), ns);
        return Ok(vec![
            api.get(name)
                .await
                .with_context(|| format!("ResourceWatch {ns}/{name}"))?,
        ]);
    }
    let api: Api<ResourceWatch> = if all {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), ns)
    };
    let mut params = ListParams::default();
    if let Some(s) = selector {
        params = params.labels(s);
    }
    let list = api.list(&params).await.context("listing ResourceWatches")?;
    if list.items.is_empty() {
        bail!(
            "no ResourceWatch{} in {}",
            selector.map_or_else(String::new, |s| format!(" matching {s}")),
            if all { "any namespace" } else { ns }
        );
    }
    Ok(list.items)
}

/// Asks for a profile with the annotation (a fresh `request=` makes it a new request),
/// waits until the status answers that value, and writes the ConfigMap's files.
#[allow(clippy::too_many_arguments)]
async fn profile(
    client: &Client,
    ns: &str,
    pod: &str,
    watch: Option<String>,
    container: Option<&str>,
    duration: Duration,
    output: &std::path::Path,
    timeout: Duration,
) -> anyhow::Result<()> {
    let watches: Api<ResourceWatch> = Api::namespaced(client.clone(), ns);
    let watch = match watch {
        Some(w) => w,
        None => selecting_watch(client, &watches, ns, pod).await?,
    };
    let value = profile_request(pod, container, duration)?;
    let patch = serde_json::json!({"metadata": {"annotations": {PROFILE_ANNOTATION: value}}});
    watches
        .patch(&watch, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating ResourceWatch {ns}/{watch} (you need patch on it)"))?;
    eprintln!("asked ResourceWatch {ns}/{watch} for {value}; waiting");
    let st = answer(&watches, ns, &watch, &value, duration + timeout).await?;
    if st.state != ProfileState::Succeeded {
        bail!("profile {:?}: {}", st.state, st.message);
    }
    let written = write_profile(client, ns, &st, output).await?;
    println!(
        "{} samples of {}{}; hottest: {}",
        st.samples,
        st.pod,
        if st.container.is_empty() {
            String::new()
        } else {
            format!("/{}", st.container)
        },
        st.hottest
            .iter()
            .map(|h| format!("{} {:.1}%", h.function, h.percent))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for p in written {
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// The one watch of `ns` whose selector matches the pod's labels.
async fn selecting_watch(
    client: &Client,
    watches: &Api<ResourceWatch>,
    ns: &str,
    pod: &str,
) -> anyhow::Result<String> {
    let p = Api::<Pod>::namespaced(client.clone(), ns)
        .get(pod)
        .await
        .with_context(|| format!("pod {ns}/{pod}"))?;
    let labels: BTreeMap<String, String> = p.metadata.labels.unwrap_or_default();
    let list = watches.list(&ListParams::default()).await?;
    let selecting: Vec<String> = list
        .items
        .iter()
        .filter(|w| w.spec.selector.to_selector().matches(&labels))
        .filter_map(|w| w.metadata.name.clone())
        .collect();
    match selecting.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!(
            "no ResourceWatch in {ns} selects pod {pod}: create one, or name it with --resourcewatch"
        ),
        many => bail!(
            "several ResourceWatches select pod {pod} ({}): pick one with --resourcewatch",
            many.join(", ")
        ),
    }
}

/// The annotation's value: this request, told apart from every other by `request=`.
fn profile_request(
    pod: &str,
    container: Option<&str>,
    duration: Duration,
) -> anyhow::Result<String> {
    let request = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default()
    );
    let mut value = format!("pod={pod},duration={}s", duration.as_secs().max(1));
    if let Some(c) = container {
        value.push_str(&format!(",container={c}"));
    }
    value.push_str(&format!(",request={request}"));
    // The operator keeps the first 256 characters of a request (operator/core/src/profile.rs
    // MAX_REQUEST): a longer value could never be recognised as answered.
    if value.chars().count() > 256 {
        bail!("the request {value:?} is over 256 characters: the operator would cut it");
    }
    Ok(value)
}

/// The watch's answer to the request `value`, waited for up to `within`.
async fn answer(
    watches: &Api<ResourceWatch>,
    ns: &str,
    watch: &str,
    value: &str,
    within: Duration,
) -> anyhow::Result<resourcewatch_crds::ProfileStatus> {
    let deadline = Instant::now() + within;
    loop {
        // A failed read is retried until the deadline: the profile runs on regardless.
        match watches.get(watch).await {
            Ok(w) => {
                let ours = w
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(PROFILE_ANNOTATION))
                    .is_some_and(|v| v == value);
                if let Some(p) = w.status.and_then(|s| s.profile)
                    && p.request == value
                    && p.state != ProfileState::Pending
                {
                    return Ok(p);
                }
                if !ours {
                    bail!(
                        "the watch's {PROFILE_ANNOTATION} annotation was changed by someone else before an answer came: their request replaces this one"
                    );
                }
            }
            Err(e) => eprintln!("reading ResourceWatch {ns}/{watch}: {e} (retrying)"),
        }
        if Instant::now() > deadline {
            bail!(
                "no answer within {within:?}: is the operator running, and may it write ConfigMaps in {ns} (docs/api.md, CPU profiles on request)?"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The profile's files, from its ConfigMap (which must still be this profile's), written
/// into `output`.
async fn write_profile(
    client: &Client,
    ns: &str,
    st: &resourcewatch_crds::ProfileStatus,
    output: &std::path::Path,
) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let cm_name = st
        .config_map
        .clone()
        .context("the status names no ConfigMap")?;
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(&cm_name)
        .await
        .with_context(|| format!("ConfigMap {ns}/{cm_name}"))?;
    // The ConfigMap is replaced by the next profile: it must be this one's.
    let id = cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("resourcewatch.io/profile-id"));
    if id != Some(&st.id) {
        bail!(
            "ConfigMap {ns}/{cm_name} holds profile {id:?}, not {:?} (a newer profile replaced it)",
            st.id
        );
    }
    std::fs::create_dir_all(output).with_context(|| format!("{}", output.display()))?;
    let binary = cm
        .binary_data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    let (files, ignored) =
        kubectl_resourcewatch::profile_files(&cm.data.unwrap_or_default(), &binary);
    for k in ignored {
        eprintln!(
            "warning: ConfigMap {ns}/{cm_name} has a key {k:?} that is not a profile file: not written"
        );
    }
    let mut written = Vec::new();
    for (k, v) in files {
        let path = output.join(k);
        std::fs::write(&path, v).with_context(|| format!("{}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// clap's own consistency checks (unique flags across the global ones and each
    /// command's: a clash panics only when that command is parsed).
    #[test]
    fn the_command_line_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn kubectls_flags_parse_where_kubectl_puts_them() {
        let a = Args::try_parse_from([
            "kubectl-resourcewatch",
            "kills",
            "-A",
            "-o",
            "json",
            "--no-headers",
            "-l",
            "team=shop",
            "--sort-by",
            ".time",
            "--context",
            "prod",
            "--kubeconfig",
            "/tmp/kc",
            "-w",
        ])
        .expect("parses");
        assert!(matches!(a.output, Output::Json));
        assert!(a.no_headers && a.follow);
        assert_eq!(a.selector.as_deref(), Some("team=shop"));
        assert_eq!(a.context.as_deref(), Some("prod"));
        assert!(matches!(
            a.command,
            Command::Kills {
                all_namespaces: true,
                ..
            }
        ));
        let p = Args::try_parse_from([
            "kubectl-resourcewatch",
            "profile",
            "api-1",
            "--resourcewatch",
            "w",
            "--output-dir",
            "out",
        ])
        .expect("parses");
        assert!(
            matches!(p.command, Command::Profile { ref output_dir, .. } if output_dir == std::path::Path::new("out"))
        );
    }
}
