//! `resourcewatch-operator check-ready`, what the chart's `helm test` pod runs, against
//! the operator's own `/readyz` served as `main.rs` serves it: HTTPS with a leaf of the
//! operator's CA. It passes for a ready leader only, and only when the certificate chains
//! to the CA it was given.

use std::{net::SocketAddr, process::Command, sync::Arc, sync::atomic::Ordering};

use resourcewatch_operator::{
    metrics::{self, Metrics},
    tls::Pki,
};

async fn serve(m: Arc<Metrics>, pki: &Pki) -> SocketAddr {
    let leaf = pki
        .server(&["resourcewatch-operator".into()])
        .expect("leaf");
    let tls =
        resourcewatch_runtime::https::server_config(&leaf.cert, &leaf.key, None).expect("tls");
    // A free port: the listener does not say which one it got.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let listener = resourcewatch_runtime::https::TlsListener::bind(
        addr,
        Arc::new(resourcewatch_runtime::https::Fixed(Arc::new(tls))),
    )
    .await
    .expect("bind");
    tokio::spawn(async move {
        axum::serve(listener, metrics::router(m, None).into_make_service()).await
    });
    addr
}

async fn check_ready(addr: SocketAddr, ca_pem: &str) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!(
        "rw-check-ready-{}-{}",
        std::process::id(),
        addr.port()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let ca = dir.join("ca.crt");
    std::fs::write(&ca, ca_pem).expect("ca");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_resourcewatch-operator"))
            .args(["check-ready", "--host", &addr.ip().to_string()])
            .args(["--port", &addr.port().to_string()])
            .arg("--ca")
            .arg(&ca)
            .output()
            .expect("run check-ready")
    })
    .await
    .expect("join");
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn passes_for_a_ready_leader_behind_the_published_ca_only() {
    let pki = Pki::generate().expect("CA");
    let m = Arc::new(Metrics::default());
    let addr = serve(m.clone(), &pki).await;

    let (ok, out) = check_ready(addr, &pki.ca_cert).await;
    assert!(!ok, "the controller has not started: {out}");
    assert!(out.contains("503"), "{out}");

    m.ready.store(true, Ordering::SeqCst);
    let (ok, out) = check_ready(addr, &pki.ca_cert).await;
    assert!(!ok, "a standby is not what the Service routes to: {out}");
    assert!(out.contains("standby"), "{out}");

    m.leader.set(1);
    let (ok, out) = check_ready(addr, &pki.ca_cert).await;
    assert!(ok, "a ready leader: {out}");
    assert!(out.contains("ready (leader)"), "{out}");

    let other = Pki::generate().expect("another CA");
    let (ok, out) = check_ready(addr, &other.ca_cert).await;
    assert!(!ok, "a certificate of another CA: {out}");
}
