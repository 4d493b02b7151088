//! The operator binary as a child process against the test cluster, with its log kept
//! for the failure dump, its metrics readable, and SIGTERM/SIGKILL on demand.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::Context;

use crate::cluster::wait_for;

pub struct OperatorProcess {
    child: Child,
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
    /// The admission webhook (HTTPS).
    pub webhook: SocketAddr,
    pub log: PathBuf,
}

/// The operator built next to the running test or tool (`target/<profile>/`), or
/// `RW_OPERATOR_BIN`.
pub fn operator_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RW_OPERATOR_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join("resourcewatch-operator")
}

/// A loopback address with a port free now, for a process started later.
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(format!("127.0.0.1:{}", free_port()?).parse()?)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl OperatorProcess {
    /// Starts the operator with its Secrets and Lease in `namespace`.
    pub fn start(namespace: &str, identity: &str, extra: &[&str]) -> anyhow::Result<Self> {
        let webhook: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        Self::spawn(namespace, identity, extra, webhook)
    }

    /// Starts the operator serving agents on `grpc` (known to them before it starts).
    pub fn start_on(
        namespace: &str,
        identity: &str,
        extra: &[&str],
        grpc: SocketAddr,
    ) -> anyhow::Result<Self> {
        Self::spawn_at(namespace, identity, extra, grpc, free_addr()?, free_addr()?)
    }

    /// A new operator process on this one's addresses (agents reconnect to the same
    /// endpoint, as through a Service), once this one has exited.
    pub fn respawn(&self, namespace: &str, identity: &str, extra: &[&str]) -> anyhow::Result<Self> {
        Self::spawn_at(
            namespace,
            identity,
            extra,
            self.grpc,
            self.metrics,
            self.webhook,
        )
    }

    fn spawn(
        namespace: &str,
        identity: &str,
        extra: &[&str],
        webhook: SocketAddr,
    ) -> anyhow::Result<Self> {
        let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        Self::spawn_at(namespace, identity, extra, grpc, metrics, webhook)
    }

    fn spawn_at(
        namespace: &str,
        identity: &str,
        extra: &[&str],
        grpc: SocketAddr,
        metrics: SocketAddr,
        webhook: SocketAddr,
    ) -> anyhow::Result<Self> {
        let bin = operator_bin();
        anyhow::ensure!(
            bin.exists(),
            "{} is missing: build it first (cargo build -p resourcewatch-operator)",
            bin.display()
        );
        // One log per process: a respawned operator must not truncate its predecessor's.
        static STARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log =
            std::env::temp_dir().join(format!("resourcewatch-operator-{}-{n}.log", grpc.port()));
        let out = std::fs::File::create(&log)?;
        let child = Command::new(&bin)
            .args(["--namespace", namespace, "--pod-name", identity])
            .args([
                "--grpc-addr",
                &grpc.to_string(),
                "--metrics-addr",
                &metrics.to_string(),
                "--webhook-addr",
                &webhook.to_string(),
                "--webhook-configuration",
                &webhook_configuration(webhook),
            ])
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self {
            child,
            grpc,
            metrics,
            webhook,
            log,
        })
    }

    /// Starts the operator behind its admission webhook, for the watches of namespaces
    /// labelled `resourcewatch.io/e2e-webhook=<namespace>`: the API server calls it at
    /// `https://localhost:<port>/mutate` (no Service without a kubelet). The configuration
    /// is made first, since the operator fills its caBundle at start, and deleted when
    /// the operator is dropped.
    pub async fn start_with_webhook(
        client: &kube::Client,
        namespace: &str,
        identity: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
        use kube::api::{Api, PostParams};
        let webhook: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let name = webhook_configuration(webhook);
        let cfg: MutatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"resourcewatch.io/e2e": "true"}},
            "webhooks": [{
                "name": "authorization.resourcewatch.io",
                "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Ignore", "timeoutSeconds": 5,
                "clientConfig": {"url": format!("https://localhost:{}/mutate", webhook.port())},
                "namespaceSelector": {"matchLabels": {"resourcewatch.io/e2e-webhook": namespace}},
                "rules": [{"apiGroups": ["resourcewatch.io"], "apiVersions": ["v1alpha1"],
                           "operations": ["CREATE", "UPDATE"], "resources": ["resourcewatches"],
                           "scope": "Namespaced"}]
            }]
        }))?;
        let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        api.create(&PostParams::default(), &cfg).await?;
        let op = Self::spawn(namespace, identity, extra, webhook)?;
        wait_for("the webhook's CA bundle", Duration::from_secs(30), || {
            let api = api.clone();
            let name = name.clone();
            async move {
                let c = api.get(&name).await?;
                Ok(c.webhooks
                    .unwrap_or_default()
                    .first()
                    .and_then(|w| w.client_config.ca_bundle.clone())
                    .map(|_| ()))
            }
        })
        .await?;
        Ok(op)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn http_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let mut s = TcpStream::connect_timeout(&self.metrics, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )?;
        let mut buf = String::new();
        s.read_to_string(&mut buf)?;
        let code = buf
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = buf
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((code, body))
    }

    /// One metric's value (summed over its label sets).
    pub fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let (_, body) = self.http_get("/metrics")?;
        Ok(body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.split(['{', ' ']).next() == Some(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    /// Ready (`/readyz`: its controller runs, as leader or standby).
    pub async fn wait_standby(&self) -> anyhow::Result<()> {
        wait_for(
            "the operator's /readyz",
            Duration::from_secs(60),
            || async move { Ok(matches!(self.http_get("/readyz"), Ok((200, _))).then_some(())) },
        )
        .await
        .with_context(|| format!("operator log:\n{}", self.log_text()))
    }

    /// Ready and holding the Lease.
    pub async fn wait_ready(&mut self) -> anyhow::Result<()> {
        self.wait_standby().await?;
        let this = &*self;
        wait_for(
            "the operator to lead",
            Duration::from_secs(60),
            || async move {
                Ok(
                    (this.metric("resourcewatch_operator_leader").unwrap_or(0.0) >= 1.0)
                        .then_some(()),
                )
            },
        )
        .await
        .with_context(|| format!("operator log:\n{}", self.log_text()))
    }

    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// SIGTERM, then wait up to `timeout` for the exit.
    pub async fn stop(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.signal(libc::SIGTERM);
        let start = std::time::Instant::now();
        while start.elapsed() < timeout {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    /// CPU seconds (user + system) and (RSS, peak RSS) in bytes, from /proc.
    pub fn usage(&self) -> Option<(f64, u64, u64)> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
        let after = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let kb = |key: &str| {
            status
                .lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .map(|v| v * 1024)
        };
        Some((ticks / hz, kb("VmRSS:")?, kb("VmHWM:")?))
    }
}

/// The webhook configuration an operator process keeps (its port makes it unique).
fn webhook_configuration(webhook: SocketAddr) -> String {
    format!("resourcewatch-e2e-{}", webhook.port())
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new(crate::cluster::kubectl())
            .args([
                "delete",
                "mutatingwebhookconfiguration",
                &webhook_configuration(self.webhook),
                "--ignore-not-found",
                "--wait=false",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
