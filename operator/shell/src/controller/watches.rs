//! The controller's inputs as streams: the ResourceWatches themselves, the pods (into the
//! cache and the label index that says which watches a pod's change concerns), and the
//! RemediationPolicies; and `run`, which joins them with the hub's triggers.

use super::*;

/// The controller over the watch of ResourceWatches (into `store`). A watch is reconciled
/// when its spec (generation), annotations (profile request) or labels (a
/// RemediationPolicy's watchSelector) change, not on its status: each of the operator's
/// own status writes came back as a reconcile that found nothing to do (70 a second at
/// 500 watches).
pub(super) fn controller(
    client: &Client,
    writer: reflector::store::Writer<ResourceWatch>,
    store: Store<ResourceWatch>,
) -> Controller<ResourceWatch> {
    let watches: Api<ResourceWatch> = Api::all(client.clone());
    let changes = watcher(watches, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            predicates::generation
                .combine(predicates::annotations)
                .combine(predicates::labels),
            PredicateConfig::default(),
        );
    // At most RECONCILE_CONCURRENCY at once: each holds a view of every pod and of its
    // nodes' reports, so hundreds of watches triggered together (a burst of pod changes)
    // multiplied the operator's memory; waiting requests for one watch merge meanwhile.
    Controller::for_stream(changes, store).with_config(
        kube::runtime::controller::Config::default().concurrency(RECONCILE_CONCURRENCY),
    )
}

/// How long the watches a pod's change concerns are gathered before they are
/// reconciled, each once. A pod's life is a burst of events (created, scheduled, its
/// containers started, its status written; deleted), each of which reconciled every watch
/// selecting it: with 10 pods a second replaced under 50 watches that was 64 reconciles a
/// second, most of them finding what the one before found (`make scale-ci`, 28 November
/// 2026). The window starts at the first change, so a watch whose pods never stop
/// changing is still reconciled at least once per window.
const POD_TRIGGER_WINDOW: Duration = Duration::from_millis(500);

/// A watch of more pods gathers its pods' changes longer: `POD_TRIGGER_WINDOW` per this
/// many pods, up to half its interval. A reconcile reads every pod of the watch and every
/// report of their nodes, so a watch of 2,000 pods on 1,000 nodes cost 30 times a small
/// one, and with one of its pods replaced each second it was reconciled twice a second
/// (most of the operator's CPU at 1,000 nodes, 29 November 2026). What a pod's change must
/// do at once, its node's configuration, the pod triggers do themselves
/// (`Hub::update_pod`); the status is written once per interval anyway, unless a
/// condition changes.
const POD_TRIGGER_PODS: usize = 250;

/// The gathering window of a watch that targets `pods` pods every `interval`.
fn pod_trigger_window(pods: usize, interval: Duration) -> Duration {
    let windows = pods.div_ceil(POD_TRIGGER_PODS).max(1) as u32;
    (POD_TRIGGER_WINDOW * windows).min((interval / 2).max(POD_TRIGGER_WINDOW))
}

/// A watch to reconcile after its gathering window.
fn due(hub: &Hub, key: &WatchKey) -> (ObjectRef<ResourceWatch>, Duration) {
    let window = hub
        .watch_size(key)
        .map_or(POD_TRIGGER_WINDOW, |(pods, every)| {
            pod_trigger_window(pods, every)
        });
    (ObjectRef::new(&key.name).within(&key.namespace), window)
}

/// The pod watch, into the controller's pod cache: each change moves the pod's target in
/// the hub at once and yields the watches it concerns, each with its gathering window.
pub(super) fn pod_triggers(
    client: &Client,
    writer: reflector::store::Writer<CachedPod>,
    watches: Store<ResourceWatch>,
    index: Arc<std::sync::Mutex<PodTriggers>>,
    hub: Arc<Hub>,
) -> impl futures::Stream<Item = (ObjectRef<ResourceWatch>, Duration)> + Send + use<> {
    reflector::reflector(
        writer,
        watcher(
            Api::<CachedPod>::all(client.clone()),
            watcher::Config::default(),
        )
        .modify(slim_pod),
    )
    .default_backoff()
    .flat_map(move |event| {
        let concerns = match event {
            Ok(event) => index
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .on_event(&event, &watches.state()),
            Err(e) => {
                tracing::warn!(error = %resourcewatch_runtime::error_chain(&e), "pod watch");
                Vec::new()
            }
        };
        let windows: Vec<(ObjectRef<ResourceWatch>, Duration)> = concerns
            .into_iter()
            .map(|c| {
                let key = WatchKey {
                    namespace: c.watch.namespace.clone().unwrap_or_default(),
                    name: c.watch.name.clone(),
                };
                let target = c.pod.and_then(|p| decide::target_pod(&key.namespace, &p));
                hub.update_pod(&key, &c.uid, target);
                due(&hub, &key)
            })
            .collect();
        futures::stream::iter(windows)
    })
}

/// Each watch of `due` once its window, from its first arrival, has passed; arrivals
/// meanwhile merge into it.
fn gathered<S>(due: S) -> impl futures::Stream<Item = ObjectRef<ResourceWatch>> + use<S>
where
    S: futures::Stream<Item = (ObjectRef<ResourceWatch>, Duration)> + Send + 'static,
{
    struct State {
        input: futures::stream::BoxStream<'static, (ObjectRef<ResourceWatch>, Duration)>,
        ended: bool,
        /// By deadline, then arrival.
        queue: BTreeMap<(tokio::time::Instant, u64), ObjectRef<ResourceWatch>>,
        waiting: std::collections::HashSet<ObjectRef<ResourceWatch>>,
        arrivals: u64,
    }
    let state = State {
        input: due.boxed(),
        ended: false,
        queue: BTreeMap::new(),
        waiting: Default::default(),
        arrivals: 0,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            let next = st.queue.first_key_value().map(|(&(at, _), _)| at);
            if let Some(at) = next
                && at <= tokio::time::Instant::now()
            {
                let (_, r) = st.queue.pop_first()?;
                st.waiting.remove(&r);
                return Some((r, st));
            }
            if st.ended && next.is_none() {
                return None;
            }
            tokio::select! {
                item = st.input.next(), if !st.ended => match item {
                    Some((r, window)) => {
                        if st.waiting.insert(r.clone()) {
                            st.arrivals += 1;
                            let at = tokio::time::Instant::now() + window;
                            st.queue.insert((at, st.arrivals), r);
                        }
                    }
                    None => st.ended = true,
                },
                () = tokio::time::sleep_until(next.unwrap_or_else(tokio::time::Instant::now)), if next.is_some() => {}
            }
        }
    })
}

/// The RemediationPolicy watch, into its store: a policy's change (or removal) reaches
/// every watch of its namespace at once (a revoked grant must stop evictions without
/// waiting for the next report). `failing` holds why the watch fails, until it delivers.
pub(super) fn policy_triggers(
    client: &Client,
    writer: reflector::store::Writer<RemediationPolicy>,
    watches: Store<ResourceWatch>,
    failing: Arc<std::sync::Mutex<Option<String>>>,
) -> impl futures::Stream<Item = ObjectRef<ResourceWatch>> + use<> {
    reflector::reflector(
        writer,
        watcher(
            Api::<RemediationPolicy>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .flat_map(move |event| {
        // While the watch fails (an object it cannot read, the API server gone), the store
        // may hold a policy deleted meanwhile: no grant is trusted until it recovers.
        let mut failing = failing.lock().unwrap_or_else(|e| e.into_inner());
        let ns: Vec<String> = match &event {
            Ok(watcher::Event::Apply(p) | watcher::Event::Delete(p)) => {
                *failing = None;
                p.metadata.namespace.iter().cloned().collect()
            }
            Ok(watcher::Event::InitDone) => {
                *failing = None;
                Vec::new()
            }
            Ok(_) => Vec::new(),
            Err(e) => {
                tracing::warn!(error = %resourcewatch_runtime::error_chain(&e), "RemediationPolicy watch");
                *failing = Some(resourcewatch_runtime::error_chain(&e));
                Vec::new()
            }
        };
        let refs: Vec<ObjectRef<ResourceWatch>> = watches
            .state()
            .iter()
            .filter(|w| {
                w.metadata
                    .namespace
                    .as_ref()
                    .is_some_and(|n| ns.contains(n))
            })
            .map(|w| ObjectRef::from_obj(w.as_ref()))
            .collect();
        futures::stream::iter(refs)
    })
}

/// Builds the controller and runs it until `shutdown`.
/// The ResourceWatch controller until `shutdown`. It keeps the cache of pods `pods`
/// (through `pods_writer`), which the node view reads too.
pub async fn run(
    client: Client,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    leader: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
    settings: Settings,
    (pods, pods_writer): (Store<CachedPod>, reflector::store::Writer<CachedPod>),
) {
    let (rw_store, rw_writer) = reflector::store();
    let controller = controller(&client, rw_writer, rw_store.clone());
    // A pod's change reaches only the watches that select it now or did before it
    // (crate::triggers), not every watch of its namespace.
    let pod_index = Arc::new(std::sync::Mutex::new(PodTriggers::default()));
    let pod_changes = pod_triggers(
        &client,
        pods_writer,
        rw_store.clone(),
        pod_index.clone(),
        hub.clone(),
    );
    // A pod's first figures, gathered like its changes: the reconcile writes its first row
    // (decide: a young pod's first row is written at once).
    let first_reports = match hub.take_first_report_triggers() {
        Some(rx) => {
            let hub = hub.clone();
            ReceiverStream::new(rx).map(move |k| due(&hub, &k)).boxed()
        }
        None => futures::stream::empty().boxed(),
    };
    let pod_triggers = gathered(futures::stream::select(pod_changes, first_reports));
    let (policies, policies_writer) = reflector::store();
    let policies_failing: Arc<std::sync::Mutex<Option<String>>> = Default::default();
    let policy_triggers = policy_triggers(
        &client,
        policies_writer,
        rw_store.clone(),
        policies_failing.clone(),
    );
    let hub_changes = WatchStream::new(hub.subscribe_changes()).map(|_| ());
    let reconcile_triggers = match hub.take_reconcile_triggers() {
        Some(rx) => ReceiverStream::new(rx)
            .map(|k| ObjectRef::new(&k.name).within(&k.namespace))
            .boxed(),
        None => futures::stream::empty().boxed(),
    };
    let leader_changes = WatchStream::new(leader.clone()).map(|_| ());
    let write_timeout = Duration::from_secs(10);
    let (events, event_retries) = events::Publisher::new(
        Recorder::new(client.clone(), settings.reporter),
        write_timeout,
        metrics.clone(),
    );
    let ctx = Arc::new(Context {
        events,
        client,
        hub,
        metrics: metrics.clone(),
        pods,
        watches: rw_store,
        policies,
        policies_failing,
        profile_requests: Default::default(),
        leader,
        write_timeout,
        forgotten_at: Default::default(),
        pod_index,
        eviction_client: settings.eviction_client,
        remediation: settings.remediation,
        otlp: settings.otlp,
    });
    let mut shutdown_signal = shutdown.clone();
    metrics
        .ready
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let watches = controller
        .reconcile_all_on(futures::stream::select(hub_changes, leader_changes))
        .reconcile_on(futures::stream::select(
            reconcile_triggers,
            futures::stream::select(pod_triggers, policy_triggers),
        ))
        .graceful_shutdown_on(async move {
            let _ = shutdown_signal.wait_for(|s| *s).await;
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %resourcewatch_runtime::error_chain(&e), "controller");
            }
        });
    tokio::join!(watches, event_retries);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn a_watch_of_more_pods_gathers_longer_up_to_half_its_interval() {
        let ms = |pods, interval_s| {
            pod_trigger_window(pods, Duration::from_secs(interval_s)).as_millis()
        };
        assert_eq!(ms(0, 10), 500);
        assert_eq!(ms(250, 10), 500);
        assert_eq!(ms(251, 10), 1_000);
        assert_eq!(ms(2_000, 10), 4_000);
        assert_eq!(ms(20_000, 10), 5_000);
        assert_eq!(ms(2_000, 2), 1_000);
        assert_eq!(ms(2_000, 1), 500, "never under the small watches' window");
    }

    #[tokio::test(start_paused = true)]
    async fn each_watch_is_reconciled_once_after_its_own_window() {
        let r = |n: &str| ObjectRef::<ResourceWatch>::new(n).within("ns");
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut out = Box::pin(gathered(rx));
        let t0 = tokio::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        tx.unbounded_send((r("big"), Duration::from_secs(4)))
            .unwrap();
        tx.unbounded_send((r("small"), Duration::from_millis(500)))
            .unwrap();
        tx.unbounded_send((r("small"), Duration::from_millis(500)))
            .unwrap();
        assert_eq!(out.next().await.unwrap(), r("small"));
        assert_eq!(tokio::time::Instant::now(), at(500));
        // Arrivals within a window merge into it; the window runs from the first.
        tx.unbounded_send((r("big"), Duration::from_secs(4)))
            .unwrap();
        assert_eq!(out.next().await.unwrap(), r("big"));
        assert_eq!(tokio::time::Instant::now(), at(4_000));
        // After its reconcile, an arrival opens a new window.
        tx.unbounded_send((r("small"), Duration::from_millis(500)))
            .unwrap();
        drop(tx);
        assert_eq!(out.next().await.unwrap(), r("small"));
        assert_eq!(tokio::time::Instant::now(), at(4_500));
        assert!(out.next().await.is_none(), "ends with its input");
    }
}
