//! /metrics served only to a token the API server reviewed and allowed.

use super::*;

/// `/metrics` lists every namespace's findings: over HTTPS (the operator's CA, published
/// in the ConfigMap resourcewatch-ca-bundle), and only for a token the API server says
/// may `get` it. No token: 401; a valid token without the role: 403; a forged one: 401;
/// a token bound to resourcewatch-metrics-reader: the findings. The probes stay open.
#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn metrics_are_served_only_to_a_reviewed_token() {
    let client = harness::client().await.expect("a cluster (KUBECONFIG)");
    harness::install_crd(&client).await.expect("CRD");
    let ns = TestNamespace::create(&client, "rw-trust-metrics")
        .await
        .expect("namespace");
    let n = ns.name.clone();
    let op = OperatorProcess::start_as_service_account_with(&client, &n, "op", &[], true)
        .await
        .expect("operator starts");
    let ca = wait_for("the CA bundle", Duration::from_secs(30), || async {
        Ok(Api::<ConfigMap>::namespaced(client.clone(), &n)
            .get_opt("resourcewatch-ca-bundle")
            .await?
            .and_then(|c| c.data?.get("ca.crt").cloned()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", op.log_text()));
    let get = |token: Option<String>, path: &'static str| {
        let ca = ca.clone();
        let addr = op.metrics;
        async move {
            harness::https_get(addr, "resourcewatch-operator", &ca, token.as_deref(), path)
                .await
                .expect("HTTPS")
        }
    };
    // Until it answers: the CA bundle is published before the listener takes connections
    // (a handshake cut short until then).
    let ready = wait_for("/readyz over HTTPS", Duration::from_secs(30), || async {
        let answer =
            harness::https_get(op.metrics, "resourcewatch-operator", &ca, None, "/readyz").await;
        Ok(answer
            .ok()
            .and_then(|(code, body)| (code == 200).then_some(body)))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", op.log_text()));
    assert!(ready.contains("ready"), "{ready}");
    assert_eq!(get(None, "/metrics").await.0, 401, "no token");
    assert_eq!(
        get(Some("not-a-token".into()), "/metrics").await.0,
        401,
        "a forged token"
    );
    let nobody = harness::token_with_role(&client, &n, "nobody", None)
        .await
        .expect("token");
    assert_eq!(get(Some(nobody), "/metrics").await.0, 403, "no role");
    let reader = harness::token_with_role(
        &client,
        &n,
        "prometheus",
        Some("resourcewatch-metrics-reader"),
    )
    .await
    .expect("token");
    let (code, body) = get(Some(reader.clone()), "/metrics").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("resourcewatch_operator_leader"), "{body}");

    // Anyone on the pod network sprays junk tokens (each a new one, so each asks for a
    // review) for 15 s, while Prometheus scrapes every 500 ms with its reviewed token:
    // every scrape answers 200, none waits long, and the spray gets only refusals. Six
    // sprayers, more than the review budget (4): here everyone connects from 127.0.0.1,
    // and the listener lets one address hold 8 connections (https/, MAX_CONNECTIONS_PER_IP),
    // a cap a sprayer on its own address meets before it reaches Prometheus'.
    let spraying = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut sprayers = Vec::new();
    for w in 0..6u32 {
        let (ca, addr, on) = (ca.clone(), op.metrics, spraying.clone());
        sprayers.push(tokio::spawn(async move {
            let mut codes = std::collections::BTreeMap::<u16, u32>::new();
            let mut i = 0u32;
            while on.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let junk = format!("junk-{w}-{i}-{}", "x".repeat(64));
                if let Ok((code, _)) =
                    harness::https_get(addr, "resourcewatch-operator", &ca, Some(&junk), "/metrics")
                        .await
                {
                    *codes.entry(code).or_default() += 1;
                }
            }
            codes
        }));
    }
    let mut scrapes = Vec::new();
    let spray_started = std::time::Instant::now();
    while spray_started.elapsed() < Duration::from_secs(15) {
        let t = std::time::Instant::now();
        let (code, _) = get(Some(reader.clone()), "/metrics").await;
        scrapes.push((code, t.elapsed()));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    spraying.store(false, std::sync::atomic::Ordering::Relaxed);
    let mut sprayed = std::collections::BTreeMap::<u16, u32>::new();
    for h in sprayers {
        for (code, n) in h.await.expect("sprayer") {
            *sprayed.entry(code).or_default() += n;
        }
    }
    let slowest = scrapes.iter().map(|s| s.1).max().unwrap_or_default();
    eprintln!(
        "junk-token spray: {sprayed:?} over 15 s; {} scrapes, slowest {slowest:?}",
        scrapes.len()
    );
    assert!(
        sprayed.values().sum::<u32>() >= 100,
        "the spray hardly ran: {sprayed:?}"
    );
    assert!(
        sprayed.keys().all(|c| [401, 429, 503].contains(c)),
        "the spray got something other than refusals: {sprayed:?}"
    );
    assert!(
        scrapes.iter().all(|s| s.0 == 200),
        "a reviewed scraper was refused during the spray: {scrapes:?}"
    );
    assert!(
        slowest < Duration::from_secs(2),
        "a scrape waited {slowest:?} during the spray"
    );
    // Plain HTTP on the same port is not served.
    let plain = std::net::TcpStream::connect(op.metrics).and_then(|mut s| {
        use std::io::{Read, Write};
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
        let mut b = String::new();
        let _ = s.read_to_string(&mut b);
        Ok(b)
    });
    assert!(
        !plain
            .as_deref()
            .unwrap_or_default()
            .contains("resourcewatch_"),
        "served over plain HTTP"
    );
    let _ = std::process::Command::new(harness::kubectl())
        .args([
            "delete",
            "clusterrolebinding",
            &format!("{n}-prometheus"),
            "--ignore-not-found",
        ])
        .status();
    drop(op);
    ns.delete().await;
}
