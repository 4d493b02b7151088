//! `resourcewatch-agent run` end to end on this machine: the real binary on the real
//! kernel, a real cgroup named the way kubelet names a container's
//! (`…/pod<UID>/<container id>`) with a real memory limit and a leaking process in it, and
//! a stand-in operator speaking the real protocol over mTLS.
//!
//! Needs root and BPF; skipped (saying why) otherwise.

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use resourcewatch_agent::cgroup_resolver::CgroupLayout;
use resourcewatch_proto::{
    self as pb,
    agent_control_server::{AgentControl, AgentControlServer},
    agent_message::Msg,
    operator_message,
};
use resourcewatch_workloads::{MIB, Pattern};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{
    Request, Response, Status, Streaming,
    transport::{Certificate, Identity, Server, ServerTlsConfig},
};

const UID: &str = "5e1b2a6e-5c4d-4e8f-9a0b-1c2d3e4f5a6b";
const CID: &str = "7c2bd5b1a0f3c7e2d4b6a8f0e1c3d5b7a9f1e3c5d7b9a1f3e5c7d9b1a3f5e7c9";
const LIMIT: u64 = 512 * MIB;

type Push = mpsc::Sender<Result<pb::OperatorMessage, Status>>;

/// The operator's side, reduced to what the test drives: it answers a Hello with the
/// configuration, forwards later configurations, and records every agent message.
#[derive(Clone, Default)]
struct FakeOperator {
    received: Arc<Mutex<Vec<pb::AgentMessage>>>,
    push: Arc<Mutex<Option<Push>>>,
}

fn config(version: u64, width: u32) -> pb::OperatorMessage {
    config_with(version, width, Vec::new())
}

fn config_with(version: u64, width: u32, profiles: Vec<pb::ProfileRequest>) -> pb::OperatorMessage {
    pb::OperatorMessage {
        msg: Some(operator_message::Msg::Config(pb::NodeConfig {
            version,
            top_k: 5,
            sketch_depth: 4,
            sketch_width: width,
            report_interval_ms: 1000,
            leak: Some(pb::LeakSettings {
                enabled: true,
                min_confidence: 60,
                horizon_secs: 3600,
            }),
            targets: vec![pb::TargetPod {
                uid: UID.into(),
                namespace: "ns".into(),
                name: "leaky".into(),
                containers: vec![pb::TargetContainer {
                    name: "app".into(),
                    container_id: CID.into(),
                }],
            }],
            profiles,
            protocol_version: pb::PROTOCOL_VERSION,
        })),
    }
}

impl FakeOperator {
    /// The agent's messages so far that `pick` keeps.
    fn received<T>(&self, pick: impl Fn(&Msg) -> Option<T>) -> Vec<T> {
        let all = self.received.lock().expect("lock");
        all.iter()
            .filter_map(|m| m.msg.as_ref().and_then(&pick))
            .collect()
    }
}

#[tonic::async_trait]
impl AgentControl for FakeOperator {
    type SessionStream = ReceiverStream<Result<pb::OperatorMessage, Status>>;

    async fn session(
        &self,
        req: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        // The agent proves its node with its token, before any message is read.
        let meta = |k: &str| {
            req.metadata()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        if meta(pb::NODE_METADATA).as_deref() != Some("test-node")
            || meta(pb::AUTHORIZATION_METADATA).as_deref() != Some("Bearer test-token")
        {
            return Err(Status::unauthenticated("no node metadata or token"));
        }
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(8);
        tx.send(Ok(config(1, 1024)))
            .await
            .map_err(|_| Status::internal("send"))?;
        *self.push.lock().expect("lock") = Some(tx);
        let received = self.received.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                received.lock().expect("lock").push(m);
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

struct Cgroup(PathBuf);

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Leaf first, then its parents made by the test.
        let mut p = self.0.clone();
        for _ in 0..3 {
            let _ = std::fs::remove_dir(&p);
            p.pop();
        }
    }
}

/// A forked workload; killed and reaped on drop.
struct Forked(i32);

impl Drop for Forked {
    fn drop(&mut self) {
        // SAFETY: signalling and reaping our own child.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

/// Forks a leaking workload that first moves itself into `cgroup`. Done before any
/// runtime thread exists, so the child starts from a single-threaded parent.
fn fork_leak_into(cgroup: &Path) -> Forked {
    let procs = cgroup.join("cgroup.procs");
    // SAFETY: the child writes one file, runs the workload (mmap, page touches, sleeps)
    // and _exits; it never returns into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: prctl with constant arguments.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        let me = std::process::id().to_string();
        if std::fs::write(&procs, me).is_ok() {
            let start = Instant::now();
            resourcewatch_workloads::run(
                &Pattern::Leak {
                    baseline: 20 * MIB,
                    rate: 6 * MIB,
                    delay: Duration::from_secs(1),
                },
                &|| start.elapsed() > Duration::from_secs(90),
            );
        }
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    Forked(pid)
}

struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tls_files(dir: &Path) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.distinguished_name.push(DnType::CommonName, "test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |san: &str, usages: &[ExtendedKeyUsagePurpose]| {
        let key = KeyPair::generate().expect("key");
        let mut p = CertificateParams::new(vec![san.to_string()]).expect("params");
        p.extended_key_usages = usages.to_vec();
        let cert = p.signed_by(&key, &issuer).expect("sign");
        (cert.pem(), key.serialize_pem())
    };
    let (scert, skey) = leaf(
        "resourcewatch-operator.test.svc",
        &[ExtendedKeyUsagePurpose::ServerAuth],
    );
    // As the operator issues them (operator/shell/src/tls.rs): the agent's serves its /metrics.
    let (ccert, ckey) = leaf(
        pb::AGENT_CERT_NAME,
        &[
            ExtendedKeyUsagePurpose::ClientAuth,
            ExtendedKeyUsagePurpose::ServerAuth,
        ],
    );
    let (mcert, mkey) = leaf(
        pb::METRICS_CLIENT_CERT_NAME,
        &[ExtendedKeyUsagePurpose::ClientAuth],
    );
    std::fs::create_dir_all(dir).expect("dir");
    for (name, text) in [
        ("ca.crt", ca_cert.pem()),
        ("tls.crt", ccert),
        ("tls.key", ckey),
        ("server.crt", scert),
        ("server.key", skey),
        ("metrics-client.crt", mcert),
        ("metrics-client.key", mkey),
    ] {
        std::fs::write(dir.join(name), text).expect("write");
    }
}

fn reports(op: &FakeOperator) -> Vec<pb::Report> {
    op.received(|m| match m {
        Msg::Report(x) => Some(x.clone()),
        _ => None,
    })
}

fn acks(op: &FakeOperator) -> Vec<pb::ConfigAck> {
    op.received(|m| match m {
        Msg::Ack(x) => Some(x.clone()),
        _ => None,
    })
}

async fn wait_until<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "timed out after {secs}s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn run_mode_tracks_a_targeted_container_and_predicts_its_oom() {
    if let Some(why) = common::kernel_missing() {
        common::skip(
            "run_mode_tracks_a_targeted_container_and_predicts_its_oom",
            &why,
        );
        return;
    }
    let layout = CgroupLayout::detect().expect("cgroup layout");
    // A container cgroup as kubelet's cgroupfs driver names it, with a memory limit.
    let leaf = layout
        .root()
        .join(format!("rwtest-{}/pod{UID}/{CID}", std::process::id()));
    std::fs::create_dir_all(&leaf).expect("creating the test cgroup (root needed)");
    let _cg = Cgroup(leaf.clone());
    let limit_file = if leaf.join("memory.max").exists() {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    std::fs::write(leaf.join(limit_file), LIMIT.to_string()).expect("setting the memory limit");

    // The leaking workload, in the cgroup before it allocates.
    let child = fork_leak_into(&leaf);
    let pid = child.0 as u32;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(drive(leaf, pid));
    drop(child);
}

async fn drive(leaf: PathBuf, pid: u32) {
    let tmp = std::env::temp_dir().join(format!("rw-run-test-{}", std::process::id()));
    tls_files(&tmp);
    let (op, addr) = serve_fake_operator(&tmp).await;
    let metrics = free_port();
    let mut agent = start_agent(addr, &tmp, metrics);

    // Hello first, with the node name and what the kernel allows.
    let hello = wait_until("the agent's Hello", 30, || {
        op.received(|m| match m {
            Msg::Hello(h) => Some(h.clone()),
            _ => None,
        })
        .pop()
    })
    .await;
    assert_eq!(hello.node_name, "test-node");
    assert_eq!(hello.protocol_version, pb::PROTOCOL_VERSION);
    assert_eq!(hello.min_protocol_version, pb::MIN_PROTOCOL_VERSION);
    assert!(
        hello.capabilities.as_ref().is_some_and(|c| c.btf
            && c.sched_switch
            && c.rss_stat
            && c.ring_buffer
            && c.missing.iter().all(|m| !m.starts_with("BTF"))),
        "{:?}",
        hello.capabilities
    );

    // The configuration is applied and the container found.
    let ack = wait_until("the ACK of version 1", 30, || {
        acks(&op).into_iter().find(|a| a.version == 1)
    })
    .await;
    assert!(ack.accepted, "refused: {}", ack.reason);
    assert!(
        ack.reason.is_empty(),
        "the container should be found: {}",
        ack.reason
    );

    // Exact figures of the container's process, and the cgroup's limit.
    let r = wait_until("a report with the workload above its baseline", 30, || {
        reports(&op).into_iter().rev().find(|r| {
            r.containers.iter().any(|c| {
                c.processes
                    .iter()
                    .any(|p| p.pid == pid && p.rss_bytes > 30 * MIB)
            })
        })
    })
    .await;
    let c = &r.containers[0];
    assert_eq!((c.pod_uid.as_str(), c.container_id.as_str()), (UID, CID));
    assert_eq!(c.memory_limit_bytes, LIMIT);
    assert!(
        c.memory_bytes >= 20 * MIB,
        "the cgroup charge: {}",
        c.memory_bytes
    );
    assert!(
        r.health
            .as_ref()
            .is_some_and(|h| h.unresolved_containers.is_empty())
    );

    check_leak(&op).await;
    check_metrics_listener(metrics, &tmp).await;

    // A configuration the agent cannot apply is refused with a reason; it keeps running.
    let push = op.push.lock().expect("lock").clone().expect("stream open");
    push.send(Ok(config(2, 1000))).await.expect("push");
    let nack = wait_until("the NACK of version 2", 15, || {
        acks(&op).into_iter().find(|a| a.version == 2)
    })
    .await;
    assert!(!nack.accepted && nack.reason.contains("sketch"), "{nack:?}");
    // So is one of a protocol version this agent does not speak (an operator two
    // releases ahead), whatever else it says.
    let mut ahead = config(3, 1024);
    if let Some(operator_message::Msg::Config(c)) = &mut ahead.msg {
        c.protocol_version = pb::PROTOCOL_VERSION + 1;
    }
    push.send(Ok(ahead)).await.expect("push");
    let nack = wait_until("the NACK of version 3", 15, || {
        acks(&op).into_iter().find(|a| a.version == 3)
    })
    .await;
    assert!(
        !nack.accepted && nack.reason.contains("protocol version"),
        "{nack:?}"
    );
    let n = reports(&op).len();
    wait_until("reports to continue after the NACK", 10, || {
        (reports(&op).len() > n + 1).then_some(())
    })
    .await;

    check_profile(&op, &leaf).await;

    stop_agent(&mut agent).await;
    let _ = std::fs::remove_dir_all(&tmp);
    let _ = leaf;
}

fn profile_results(op: &FakeOperator) -> Vec<pb::ProfileResult> {
    op.received(|m| match m {
        Msg::Profile(x) => Some(x.clone()),
        _ => None,
    })
}

/// A profile request of the container, with a CPU burner (`yes`) in it: one result, with
/// the three formats; a later snapshot still asking gets the same result, not a new run.
async fn check_profile(op: &FakeOperator, leaf: &Path) {
    let burner = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {} && exec yes",
            leaf.join("cgroup.procs").display()
        ))
        .stdout(Stdio::null())
        .spawn()
        .expect("yes starts");
    let pid = burner.id();
    let _burner = Proc(burner);
    // The burner's CPU time (utime + stime, in clock ticks of 10 ms), to judge the sample
    // count by the CPU it got: on a machine busy with other work it gets less than a core.
    let cpu_ticks = || -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("burner stat");
        let after_comm = &stat[stat.rfind(')').expect("comm") + 2..];
        let f: Vec<&str> = after_comm.split(' ').collect();
        f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
    };
    let (wall0, cpu0) = (std::time::Instant::now(), cpu_ticks());
    let request = pb::ProfileRequest {
        id: "p1".into(),
        pod_uid: UID.into(),
        container_ids: vec![CID.into()],
        duration_ms: 3000,
        frequency_hz: 99,
        namespace: "team-a".into(),
        pod: "api-7f9c".into(),
        container_names: [(CID.to_owned(), "app".to_owned())].into(),
    };
    let push = op.push.lock().expect("lock").clone().expect("stream open");
    push.send(Ok(config_with(3, 1024, vec![request.clone()])))
        .await
        .expect("push");
    let r = wait_until("the profile's result", 30, || {
        profile_results(op).into_iter().find(|r| r.id == "p1")
    })
    .await;
    let share = (cpu_ticks() - cpu0) as f64 / 100.0 / wall0.elapsed().as_secs_f64();
    assert!(r.error.is_empty(), "{}", r.error);
    // 3 s at 99 Hz of a process on a CPU all the time: about 300; as many fewer as the
    // share of a CPU it got around the profile (measured over a longer span than the
    // profile's 3 s, so loosely), and never more than its 3 s allow.
    let expected = 99.0 * 3.0 * share;
    assert!(
        share > 0.2 && r.samples as f64 >= 0.5 * expected && r.samples <= 400,
        "{} samples of `yes` in {:.1} s; it got {:.0} % of a CPU around the profile \
         ({expected:.0} samples expected)",
        r.samples,
        r.duration_seconds,
        share * 100.0
    );
    assert!(
        r.folded.lines().any(|l| l.starts_with("yes;")),
        "{}",
        r.folded
    );
    assert!(r.svg.starts_with(b"<?xml"), "an SVG flame graph");
    assert_eq!(r.pprof[..2], [0x1f, 0x8b], "gzipped pprof");
    // Its samples' labels (their encoding is tests/pprof.rs's, read by go tool pprof):
    // the strings are in its string table.
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&r.pprof[..]), &mut raw)
        .expect("gunzip");
    let has = |s: &str| raw.windows(s.len()).any(|w| w == s.as_bytes());
    for s in [
        "namespace",
        "team-a",
        "pod",
        "api-7f9c",
        "container",
        "app",
        "process",
        "yes",
        "pid",
    ] {
        assert!(has(s), "no {s:?} in the pprof's strings");
    }
    // Its mappings: the file the burner's frames are in, with its GNU build ID (Debian's
    // binaries have one: 40 hex digits).
    assert!(has("/usr/bin/yes"), "no mapping of /usr/bin/yes");
    let hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    assert!(
        raw.windows(41)
            .any(|w| w[0] == 40 && w[1..].iter().all(hex)),
        "no build ID in the pprof's strings"
    );
    assert!(!r.hottest.is_empty());
    push.send(Ok(config_with(4, 1024, vec![request])))
        .await
        .expect("push");
    let again = wait_until("the result sent again", 15, || {
        let all: Vec<_> = profile_results(op)
            .into_iter()
            .filter(|r| r.id == "p1")
            .collect();
        (all.len() >= 2).then(|| all[1].clone())
    })
    .await;
    assert_eq!(
        again.samples, r.samples,
        "the same result, not a second run"
    );
}

/// A fake operator serving the agent protocol over mutual TLS on a free local port.
async fn serve_fake_operator(tmp: &std::path::Path) -> (FakeOperator, std::net::SocketAddr) {
    let op = FakeOperator::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(
            std::fs::read_to_string(tmp.join("server.crt")).expect("cert"),
            std::fs::read_to_string(tmp.join("server.key")).expect("key"),
        ))
        .client_ca_root(Certificate::from_pem(
            std::fs::read_to_string(tmp.join("ca.crt")).expect("ca"),
        ));
    tokio::spawn(
        Server::builder()
            .tls_config(tls)
            .expect("tls")
            .add_service(AgentControlServer::new(op.clone()))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );

    (op, addr)
}

fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// The agent's listener: HTTPS only, with its own certificate; the probes for anyone,
/// /metrics for the scrapers' certificate and no other (the agents' own included).
async fn check_metrics_listener(addr: std::net::SocketAddr, tmp: &Path) {
    let read = |f: &str| std::fs::read_to_string(tmp.join(f)).expect("test TLS file");
    let (ca, agent, agent_key) = (read("ca.crt"), read("tls.crt"), read("tls.key"));
    let (scraper, scraper_key) = (read("metrics-client.crt"), read("metrics-client.key"));
    let get = |identity: Option<(&str, &str)>, path: &'static str| {
        let ca = ca.clone();
        let identity = identity.map(|(c, k)| (c.to_owned(), k.to_owned()));
        async move {
            let req = resourcewatch_runtime::https::Get {
                server_name: pb::AGENT_CERT_NAME,
                ca_pem: &ca,
                identity: identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
                token: None,
                path,
            };
            resourcewatch_runtime::https::get(addr, &req)
                .await
                .expect("HTTPS to the agent")
        }
    };
    assert_eq!(get(None, "/healthz").await.0, 200, "the liveness probe");
    assert_eq!(get(None, "/readyz").await.0, 200, "the readiness probe");
    let (code, body) = get(None, "/metrics").await;
    assert_eq!(code, 401, "no certificate: {body}");
    let (code, body) = get(Some((&agent, &agent_key)), "/metrics").await;
    assert_eq!(code, 403, "the agents' own certificate: {body}");
    let (code, body) = get(Some((&scraper, &scraper_key)), "/metrics").await;
    assert_eq!(code, 200, "the scrapers' certificate: {body}");
    assert!(
        body.contains("resourcewatch_agent_pipelines_loaded"),
        "{body}"
    );
    // Plain HTTP gets no answer.
    use std::io::{Read, Write};
    let mut plain = std::net::TcpStream::connect(addr).expect("connect");
    plain
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let _ = plain.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
    let mut out = Vec::new();
    let _ = plain.read_to_end(&mut out);
    assert!(
        !String::from_utf8_lossy(&out).contains("resourcewatch_agent"),
        "plain HTTP read the metrics"
    );
}

/// `resourcewatch-agent run` against the fake operator at `addr`, serving its metrics
/// on `metrics`.
fn start_agent(
    addr: std::net::SocketAddr,
    tmp: &std::path::Path,
    metrics: std::net::SocketAddr,
) -> Proc {
    let agent = Command::new(env!("CARGO_BIN_EXE_resourcewatch-agent"))
        .args([
            "run",
            "--node-name",
            "test-node",
            "--operator",
            &format!("https://{addr}"),
        ])
        .args(["--operator-namespace", "test"])
        .arg("--metrics-addr")
        .arg(metrics.to_string())
        .arg("--tls-dir")
        .arg(tmp)
        .arg("--token-path")
        .arg({
            let t = tmp.join("token");
            std::fs::write(&t, "test-token\n").expect("token file");
            t
        })
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent starts");
    Proc(agent)
}

/// The leak of the targeted container, with a time to OOM against its own limit.
async fn check_leak(op: &FakeOperator) {
    let (leak, charge) = wait_until("a leak of the targeted container", 75, || {
        reports(op).into_iter().rev().find_map(|r| {
            let charge = r.containers.first().map_or(0, |c| c.memory_bytes);
            r.leaks
                .into_iter()
                .find(|l| {
                    l.container_id == CID && l.confidence >= 60 && l.time_to_oom_seconds.is_some()
                })
                .map(|l| (l, charge))
        })
    })
    .await;
    let rate = leak.growth_bytes_per_second / MIB as f64;
    assert!(
        (4.5..7.5).contains(&rate),
        "growth {rate:.2} MiB/s, expected about 6"
    );
    assert_eq!(leak.limit_bytes, LIMIT);
    assert_eq!(leak.pod_uid, UID);
    // Bounded from both sides: the charge in the same report over the leak's 6 MiB/s (the
    // point may add the container's few MiB of reclaimable page cache), and the lower
    // bound below the point.
    let tto = leak.time_to_oom_seconds.unwrap_or(0.0);
    let left = (LIMIT - charge.min(LIMIT)) as f64 / (6.0 * MIB as f64);
    assert!(
        (left * 0.6..left * 1.5).contains(&tto),
        "time to OOM {tto:.0}s, about {left:.0}s left"
    );
    let low = leak.time_to_oom_low_seconds.expect("a lower bound");
    assert!(low > 0.0 && low <= tto, "lower bound {low} against {tto}");
    assert!(
        leak.growing_seconds > 0.0,
        "growing for {}",
        leak.growing_seconds
    );
}

/// SIGTERM ends the agent promptly and cleanly.
async fn stop_agent(agent: &mut Proc) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    let status = loop {
        if let Some(s) = agent.0.try_wait().expect("wait") {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the agent ignored SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "exit status {status}");
}
