//! Publishing Events, and trying again those the API server did not take.
//!
//! An Event is published once, from the change of status it announces (a leak found, its
//! growth site named, an OOM kill): one lost to a moment's trouble (a timeout, a 429, a
//! 5xx from a loaded API server) would never be published again. kube's `Recorder` does
//! not retry, so failed Events are tried again here in the background, as client-go's
//! event broadcaster does (12 tries, 10 s apart), without holding up the reconcile that
//! made them. The queue is bounded: with the API server gone for minutes, the oldest
//! pending Events are kept and newer ones are counted as dropped.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use tokio::{sync::mpsc, time::Instant};

use crate::metrics::Metrics;

/// Tries per Event, the first included (client-go's `maxTriesPerEvent`).
pub const TRIES: u32 = 12;
/// Between two tries of one Event (client-go's `defaultSleepDuration`).
pub const RETRY_EVERY: Duration = Duration::from_secs(10);
/// Events waiting for another try, at most.
pub const MAX_PENDING: usize = 1000;

/// One Event as published: kube's `Event` is not `Clone`, so each try builds it again.
#[derive(Clone, Debug)]
pub struct Publication {
    pub warning: bool,
    pub reason: String,
    pub note: String,
    pub action: String,
    pub regarding: ObjectReference,
    pub related: Option<ObjectReference>,
}

impl Publication {
    fn event(&self) -> KubeEvent {
        KubeEvent {
            type_: if self.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: self.reason.clone(),
            note: Some(self.note.clone()),
            action: self.action.clone(),
            secondary: self.related.clone(),
        }
    }
}

/// Why a try failed.
#[derive(Debug, PartialEq)]
pub enum Failure {
    /// Worth another try: a timeout, a connection error, 429, 5xx.
    Transient(String),
    /// Another try would fail the same way (403 in a namespace being deleted, 422).
    Permanent(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Transient(e) | Failure::Permanent(e) => f.write_str(e),
        }
    }
}

/// Whether a failed publish is worth another try.
pub fn classify(err: &kube::Error) -> Failure {
    match err {
        kube::Error::Api(s) if s.code == 429 || s.code >= 500 => {
            Failure::Transient(err.to_string())
        }
        kube::Error::Api(_) => Failure::Permanent(err.to_string()),
        _ => Failure::Transient(err.to_string()),
    }
}

/// Where Events go: the recorder, each try bounded by `timeout`.
#[derive(Clone)]
struct Sink {
    recorder: Recorder,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Sink {
    async fn try_once(&self, p: &Publication) -> Result<(), Failure> {
        let event = p.event();
        let publish = self.recorder.publish(&event, &p.regarding);
        match tokio::time::timeout(self.timeout, publish).await {
            Ok(Ok(())) => {
                self.metrics.event(&p.reason);
                Ok(())
            }
            Ok(Err(e)) => Err(classify(&e)),
            Err(_) => Err(Failure::Transient(format!(
                "timed out after {:?}",
                self.timeout
            ))),
        }
    }

    fn give_up(&self, p: &Publication, why: &str) {
        tracing::warn!(reason = %p.reason, note = %p.note, error = %why, "an Event was not published");
        Metrics::labelled(&self.metrics.events_dropped, "reason", &p.reason, 1);
    }
}

/// Publishes Events and queues the failed ones for the background retrier
/// ([`Publisher::new`]'s second half).
#[derive(Clone)]
pub struct Publisher {
    sink: Sink,
    retries: mpsc::Sender<(Publication, u32)>,
}

impl Publisher {
    /// The publisher, and the retrier to run beside the controller (it ends when every
    /// publisher is dropped, leaving what is still pending).
    pub fn new(
        recorder: Recorder,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> (Self, impl std::future::Future<Output = ()> + Send + 'static) {
        let (tx, rx) = mpsc::channel(MAX_PENDING);
        let sink = Sink {
            recorder,
            timeout,
            metrics,
        };
        (
            Self {
                sink: sink.clone(),
                retries: tx,
            },
            retry(sink, rx),
        )
    }

    /// Publishes `p` now, or queues it for another try.
    pub async fn publish(&self, p: Publication) {
        match self.sink.try_once(&p).await {
            Ok(()) => {}
            Err(Failure::Transient(e)) => {
                tracing::warn!(reason = %p.reason, error = %e, "could not publish an Event; trying again in {RETRY_EVERY:?}");
                if let Err(e) = self.retries.try_send((p, 1)) {
                    let (mpsc::error::TrySendError::Full((p, _))
                    | mpsc::error::TrySendError::Closed((p, _))) = e;
                    self.sink
                        .give_up(&p, "the queue of Events to try again is full");
                }
            }
            Err(Failure::Permanent(e)) => self.sink.give_up(&p, &e),
        }
    }
}

/// Tries queued Events again, each `RETRY_EVERY` after its last try, in order; ends when
/// the channel closes (the controller stopped).
async fn retry(sink: Sink, mut rx: mpsc::Receiver<(Publication, u32)>) {
    // Every entry waits the same time, so arrival order is due order.
    let mut due: VecDeque<(Instant, Publication, u32)> = VecDeque::new();
    loop {
        let next = due.front().map(|(at, _, _)| *at);
        tokio::select! {
            got = rx.recv() => match got {
                Some((p, _)) if due.len() >= MAX_PENDING => {
                    sink.give_up(&p, "the queue of Events to try again is full");
                }
                Some((p, tries)) => due.push_back((Instant::now() + RETRY_EVERY, p, tries)),
                None => return,
            },
            _ = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                let Some((_, p, tries)) = due.pop_front() else { continue };
                match sink.try_once(&p).await {
                    Ok(()) => tracing::info!(reason = %p.reason, tries = tries + 1, "published an Event on a later try"),
                    Err(Failure::Transient(e)) if tries + 1 < TRIES => {
                        tracing::debug!(reason = %p.reason, error = %e, "an Event's try failed");
                        due.push_back((Instant::now() + RETRY_EVERY, p, tries + 1));
                    }
                    Err(e) => sink.give_up(&p, &format!("after {} tries: {e}", tries + 1)),
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use http::{Method, Request, Response};
    use kube::{
        Client,
        client::Body,
        runtime::events::{Recorder, Reporter},
    };

    use prometheus_client::metrics::{counter::Counter, family::Family};

    use super::*;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    fn publisher() -> (Publisher, impl Future<Output = ()>, Handle, Arc<Metrics>) {
        let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(svc, "default");
        let metrics = Arc::new(Metrics::default());
        let reporter = Reporter {
            controller: "resourcewatch-operator".into(),
            instance: None,
        };
        let (p, retrier) = Publisher::new(
            Recorder::new(client, reporter),
            Duration::from_secs(5),
            metrics.clone(),
        );
        (p, retrier, handle, metrics)
    }

    fn leak() -> Publication {
        Publication {
            warning: true,
            reason: "LeakSiteFound".into(),
            note: "leaker/main grows at leak_here < keep < grow (97% of its growth)".into(),
            action: "Predict".into(),
            regarding: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some("ns".into()),
                name: Some("leaker".into()),
                ..Default::default()
            },
            related: None,
        }
    }

    /// Answers the next request, an Event's create, with `code` (the Event echoed on
    /// 201); returns its note.
    async fn answer(handle: &mut Handle, code: u16) -> String {
        let (req, send) = handle.next_request().await.expect("an Event");
        assert_eq!(req.method(), Method::POST);
        assert_eq!(
            req.uri().path(),
            "/apis/events.k8s.io/v1/namespaces/ns/events"
        );
        let body = req.into_body().collect_bytes().await.unwrap();
        let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let answer = if code == 201 {
            body.to_vec()
        } else {
            serde_json::to_vec(&serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "try later", "code": code,
            }))
            .unwrap()
        };
        send.send_response(
            Response::builder()
                .status(code)
                .body(Body::from(answer))
                .unwrap(),
        );
        event["note"].as_str().unwrap_or_default().to_owned()
    }

    /// The mock server's task, failing (not hanging) when a request it waits for never
    /// comes: time is paused, so this is 10 virtual minutes, at once.
    async fn within<T>(server: tokio::task::JoinHandle<T>) -> T {
        tokio::time::timeout(Duration::from_secs(600), server)
            .await
            .expect("the requests the server waited for")
            .unwrap()
    }

    fn count(f: &Family<Vec<(&'static str, String)>, Counter>) -> u64 {
        f.get_or_create(&vec![("reason", "LeakSiteFound".to_string())])
            .get()
    }

    /// An Event the API server refused for a moment (503, then 429) is published on a
    /// later try, 10 s after each, not lost; the reconcile that made it did not wait.
    #[tokio::test(start_paused = true)]
    async fn an_event_refused_for_a_moment_is_published_on_a_later_try() {
        let (p, retrier, mut handle, metrics) = publisher();
        let retrier = tokio::spawn(retrier);
        let server = tokio::spawn(async move {
            let mut notes = Vec::new();
            let started = Instant::now();
            for code in [503, 429, 201] {
                notes.push(answer(&mut handle, code).await);
            }
            (notes, started.elapsed())
        });
        let before = Instant::now();
        p.publish(leak()).await;
        assert!(
            before.elapsed() < RETRY_EVERY,
            "publish waited for the retry"
        );
        let (notes, took) = within(server).await;
        assert!(notes.iter().all(|n| n.contains("leak_here")), "{notes:?}");
        assert!(
            took >= RETRY_EVERY * 2 && took < RETRY_EVERY * 3,
            "{took:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(count(&metrics.events), 1);
        assert_eq!(count(&metrics.events_dropped), 0);
        drop(p);
        retrier.await.unwrap();
    }

    /// An Event the API server refuses for good (422) is not tried again, and counted.
    #[tokio::test(start_paused = true)]
    async fn an_event_refused_for_good_is_counted_not_retried() {
        let (p, retrier, mut handle, metrics) = publisher();
        let retrier = tokio::spawn(retrier);
        let server = tokio::spawn(async move { answer(&mut handle, 422).await });
        p.publish(leak()).await;
        within(server).await;
        assert_eq!(count(&metrics.events), 0);
        assert_eq!(count(&metrics.events_dropped), 1);
        drop(p);
        retrier.await.unwrap();
    }

    /// One that fails every try is given up after `TRIES`, and counted.
    #[tokio::test(start_paused = true)]
    async fn an_event_failing_every_try_is_given_up_after_its_tries() {
        let (p, retrier, mut handle, metrics) = publisher();
        let retrier = tokio::spawn(retrier);
        let server = tokio::spawn(async move {
            for _ in 0..TRIES {
                answer(&mut handle, 500).await;
            }
            handle
        });
        p.publish(leak()).await;
        let mut handle = within(server).await;
        tokio::time::sleep(RETRY_EVERY * 2).await;
        assert_eq!(count(&metrics.events_dropped), 1);
        assert_eq!(count(&metrics.events), 0);
        drop(p);
        retrier.await.unwrap();
        // No try after the last.
        assert!(handle.next_request().await.is_none());
    }
}
