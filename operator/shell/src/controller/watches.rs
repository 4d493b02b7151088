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
/// changing is still reconciled at least every half second.
const POD_TRIGGER_WINDOW: Duration = Duration::from_millis(500);

/// The pod watch, into the controller's pod cache: each change yields the watches it
/// concerns, gathered over `POD_TRIGGER_WINDOW`.
pub(super) fn pod_triggers(
    client: &Client,
    writer: reflector::store::Writer<Pod>,
    watches: Store<ResourceWatch>,
    index: Arc<std::sync::Mutex<PodTriggers>>,
) -> impl futures::Stream<Item = ObjectRef<ResourceWatch>> + use<> {
    let concerned = reflector::reflector(
        writer,
        watcher(Api::<Pod>::all(client.clone()), watcher::Config::default()).modify(slim_pod),
    )
    .default_backoff()
    .flat_map(move |event| {
        let refs = match event {
            Ok(event) => index
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .on_event(&event, &watches.state()),
            Err(e) => {
                tracing::warn!(error = %resourcewatch_runtime::error_chain(&e), "pod watch");
                Vec::new()
            }
        };
        futures::stream::iter(refs)
    });
    tokio_stream::StreamExt::chunks_timeout(concerned, 4096, POD_TRIGGER_WINDOW).flat_map(
        |mut refs| {
            refs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
            refs.dedup();
            futures::stream::iter(refs)
        },
    )
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
    (pods, pods_writer): (Store<Pod>, reflector::store::Writer<Pod>),
) {
    let (rw_store, rw_writer) = reflector::store();
    let controller = controller(&client, rw_writer, rw_store.clone());
    // A pod's change reaches only the watches that select it now or did before it
    // (crate::triggers), not every watch of its namespace.
    let pod_index = Arc::new(std::sync::Mutex::new(PodTriggers::default()));
    let pod_triggers = pod_triggers(&client, pods_writer, rw_store.clone(), pod_index.clone());
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
