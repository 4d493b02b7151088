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

use crate::harness::wait_for;

pub struct OperatorProcess {
    child: Child,
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
    pub log: PathBuf,
    /// The kubeconfig it runs with when not the harness's (a ServiceAccount's token).
    kubeconfig: Option<PathBuf>,
    /// Serving /metrics as in a cluster (HTTPS, bearer tokens reviewed) rather than
    /// plain on loopback.
    secure_metrics: bool,
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
        Self::spawn_at(
            namespace,
            identity,
            extra,
            free_addr()?,
            free_addr()?,
            None,
            false,
        )
    }

    /// Starts the operator serving agents on `grpc` (known to them before it starts).
    pub fn start_on(
        namespace: &str,
        identity: &str,
        extra: &[&str],
        grpc: SocketAddr,
    ) -> anyhow::Result<Self> {
        Self::spawn_at(namespace, identity, extra, grpc, free_addr()?, None, false)
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
            self.kubeconfig.clone(),
            self.secure_metrics,
        )
    }

    fn spawn_at(
        namespace: &str,
        identity: &str,
        extra: &[&str],
        grpc: SocketAddr,
        metrics: SocketAddr,
        kubeconfig: Option<PathBuf>,
        secure_metrics: bool,
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
        let mut cmd = Command::new(&bin);
        if let Some(k) = &kubeconfig {
            cmd.env("KUBECONFIG", k);
        }
        let child = cmd
            .args(["--namespace", namespace, "--pod-name", identity])
            .args([
                "--grpc-addr",
                &grpc.to_string(),
                "--metrics-addr",
                &metrics.to_string(),
            ])
            .args((!secure_metrics).then_some("--insecure-metrics"))
            .args(extra)
            .env(
                "RESOURCEWATCH_LOG",
                std::env::var("RESOURCEWATCH_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self {
            child,
            grpc,
            metrics,
            log,
            kubeconfig,
            secure_metrics,
        })
    }

    /// Starts the operator as it runs in a cluster: as the ServiceAccount
    /// `resourcewatch-operator` of `namespace`, authenticated by a token the API server
    /// issued for it, with exactly the RBAC of config/rbac/operator.yaml (its ClusterRole
    /// bound to this account, its Role in `namespace`). The API server, not the harness's
    /// admin credentials, decides what it may do.
    pub async fn start_as_service_account(
        client: &kube::Client,
        namespace: &str,
        identity: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_as_service_account_with(client, namespace, identity, extra, false).await
    }

    /// As [`Self::start_as_service_account`]; with `secure_metrics`, /metrics is served as
    /// in a cluster (HTTPS on loopback, for reviewed bearer tokens only), so
    /// [`Self::metric`] cannot read it.
    pub async fn start_as_service_account_with(
        client: &kube::Client,
        namespace: &str,
        identity: &str,
        extra: &[&str],
        secure_metrics: bool,
    ) -> anyhow::Result<Self> {
        crate::harness::operator_rbac(namespace).await?;
        let token =
            crate::harness::service_account_token(client, namespace, "resourcewatch-operator")
                .await?;
        let path = std::env::temp_dir().join(format!("resourcewatch-e2e-{namespace}.kubeconfig"));
        crate::harness::write_token_kubeconfig(&path, &token)?;
        Self::spawn_at(
            namespace,
            identity,
            extra,
            free_addr()?,
            free_addr()?,
            Some(path),
            secure_metrics,
        )
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

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(k) = &self.kubeconfig {
            let _ = std::fs::remove_file(k);
        }
    }
}
