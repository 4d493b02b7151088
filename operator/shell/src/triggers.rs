//! Which watches a pod's change concerns: only the watches whose selector matches the pod
//! now, or matched it before this event (a label edit that moves it out, a deletion), can
//! change. Mapping every pod event to every watch of its namespace would make one pod's
//! churn reconcile all 500 watches of a busy namespace.
//!
//! Kube-free: [`PodTriggers::on_event`] takes the watcher's event and the watches the
//! controller knows, and keeps the last labels of every pod it has seen, so a pod leaving a
//! selector still reaches the watch that held it. A relist (`Init` … `InitDone`) forgets the
//! pods it did not see again, and each forgotten pod's watches are reconciled as for a
//! deletion.
//!
//! The same memory indexes pods by namespace and label, so a reconcile looks up the pods
//! of its selector's `matchLabels` instead of testing every pod of the cluster (at 20,000
//! pods in one namespace that scan was most of a reconcile), holds what a reconcile reads
//! of each pod ([`SelectedPod`], made once per change of the pod, not once per reconcile
//! of every watch selecting it), and keeps the pods deleted in the last ten minutes
//! ([`Departed`]) for the OOM kills reported after them.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use kube::{
    ResourceExt,
    runtime::{reflector::ObjectRef, watcher::Event},
};
use resourcewatch_crds::{LabelSelector, PodSelector, ResourceWatch};

use crate::{
    pods::{CachedPod, is_terminal, selected_pod},
    spec::{pod_selector, selects},
    status::SelectedPod,
};

type Labels = BTreeMap<String, String>;
/// Selectors as written and compiled, by namespace, then watch name (nested, so a lookup
/// borrows the watch's names instead of copying them).
type Compiled = HashMap<String, HashMap<String, CompiledSelector>>;

#[derive(Debug)]
struct CompiledSelector {
    /// The watch's UID and generation when compiled: the same pair is the same spec (a
    /// watch made again under its name has another UID), which spares comparing the
    /// selectors themselves on every pod event.
    uid: Option<String>,
    generation: Option<i64>,
    written: LabelSelector,
    compiled: PodSelector,
}

/// What the mapping remembers of a pod: where it is, what it was labelled, and what a
/// reconcile reads of it.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    namespace: String,
    labels: Labels,
    pod: Arc<SelectedPod>,
    /// Succeeded or Failed.
    terminal: bool,
}

/// A watch a pod's change concerns, and the pod as that watch should target it now.
#[derive(Clone, Debug, PartialEq)]
pub struct Concern {
    pub watch: ObjectRef<ResourceWatch>,
    pub uid: String,
    /// The pod, when the watch selects it now and it has not finished; `None`: the watch
    /// no longer targets it (deleted, finished, its labels moved out).
    pub pod: Option<Arc<SelectedPod>>,
}

/// The pods a selector matches, from the index: running (or pending) and finished.
#[derive(Debug, Default)]
pub struct Selection {
    pub running: Vec<Arc<SelectedPod>>,
    pub finished: Vec<Arc<SelectedPod>>,
}

#[derive(Debug, Default)]
pub struct PodTriggers {
    /// By pod UID (a pod deleted and made again under its name is another pod).
    seen: HashMap<String, Seen>,
    /// UIDs listed since the relist began; `None` outside one.
    relisting: Option<HashSet<String>>,
    /// The first list is done. Until then nothing is mapped: a watch reconciled before the
    /// pod cache is ready waits for it, and then sees every pod (20,000 pods times 500
    /// watches of selector matching at start would buy nothing).
    listed: bool,
    /// Pod UIDs by (namespace, label key, label value).
    by_label: HashMap<(String, String, String), BTreeSet<String>>,
    /// Pods deleted lately.
    pub departed: Departed,
    /// Each watch's selector, compiled, by namespace and name: a pod's event tests every
    /// watch of its namespace, and compiling each selector per event (kube's `Selector`
    /// from the spec, strings copied) was a tenth of the operator's CPU at 1,000 nodes.
    /// Kept while the watch's selector equals the one compiled; pruned at each relist.
    compiled: Compiled,
}

impl PodTriggers {
    /// The watches to reconcile for this event, given every watch the controller knows,
    /// each with the pod as it should now target it.
    pub fn on_event(
        &mut self,
        event: &Event<CachedPod>,
        watches: &[Arc<ResourceWatch>],
    ) -> Vec<Concern> {
        match event {
            Event::Init => {
                self.relisting = Some(HashSet::new());
                Vec::new()
            }
            Event::InitApply(pod) | Event::Apply(pod) => {
                let Some((uid, now)) = seen(pod) else {
                    return Vec::new();
                };
                if let (Event::InitApply(_), Some(listed)) = (event, self.relisting.as_mut()) {
                    listed.insert(uid.clone());
                }
                let before = self.seen.insert(uid.clone(), now.clone());
                if let Some(b) = &before {
                    self.unindex(&uid, b);
                }
                self.index(&uid, &now);
                if !self.listed {
                    return Vec::new();
                }
                concerned(
                    &mut self.compiled,
                    watches,
                    &uid,
                    &now,
                    false,
                    before.as_ref(),
                )
            }
            Event::Delete(pod) => {
                self.departed.record(pod, Instant::now());
                let Some((uid, now)) = seen(pod) else {
                    return Vec::new();
                };
                let before = self.seen.remove(&uid);
                if let Some(b) = &before {
                    self.unindex(&uid, b);
                }
                concerned(
                    &mut self.compiled,
                    watches,
                    &uid,
                    &now,
                    true,
                    before.as_ref(),
                )
            }
            Event::InitDone => {
                let first = !std::mem::replace(&mut self.listed, true);
                let Some(listed) = self.relisting.take() else {
                    return Vec::new();
                };
                if first {
                    return Vec::new();
                }
                let gone: Vec<(String, Seen)> = self
                    .seen
                    .iter()
                    .filter(|(uid, _)| !listed.contains(*uid))
                    .map(|(uid, s)| (uid.clone(), s.clone()))
                    .collect();
                self.seen.retain(|uid, _| listed.contains(uid));
                for (uid, s) in &gone {
                    self.unindex(uid, s);
                }
                // Forget the selectors of watches gone since.
                let known: HashSet<(&str, &str)> = watches
                    .iter()
                    .filter_map(|w| {
                        Some((
                            w.metadata.namespace.as_deref()?,
                            w.metadata.name.as_deref()?,
                        ))
                    })
                    .collect();
                for (ns, by_name) in self.compiled.iter_mut() {
                    by_name.retain(|name, _| known.contains(&(ns.as_str(), name.as_str())));
                }
                self.compiled.retain(|_, by_name| !by_name.is_empty());
                let compiled = &mut self.compiled;
                gone.iter()
                    .flat_map(|(uid, s)| concerned(compiled, watches, uid, s, true, None))
                    .collect()
            }
        }
    }

    /// The pods of `namespace` that `selector` (compiled: `compiled`) matches, in UID
    /// order. Through the label index when the selector has `matchLabels` (the pods
    /// carrying the rarest of them are tested), else every pod of the namespace is.
    /// `None` before the first list: the index cannot say yet.
    pub fn select(
        &self,
        namespace: &str,
        selector: &LabelSelector,
        compiled: &PodSelector,
    ) -> Option<Selection> {
        if !self.listed {
            return None;
        }
        let mut out = Selection::default();
        let take = |s: &Seen| {
            if selects(compiled, &s.labels) {
                let to = if s.terminal {
                    &mut out.finished
                } else {
                    &mut out.running
                };
                to.push(s.pod.clone());
            }
        };
        if selector.match_labels.is_empty() {
            let mut all: Vec<&Seen> = self
                .seen
                .values()
                .filter(|s| s.namespace == namespace)
                .collect();
            all.sort_unstable_by(|a, b| a.pod.uid.cmp(&b.pod.uid));
            all.into_iter().for_each(take);
            return Some(out);
        }
        let empty = BTreeSet::new();
        let smallest = selector
            .match_labels
            .iter()
            .map(|(k, v)| {
                self.by_label
                    .get(&(namespace.to_owned(), k.clone(), v.clone()))
                    .unwrap_or(&empty)
            })
            .min_by_key(|uids| uids.len())
            .unwrap_or(&empty);
        smallest
            .iter()
            .filter_map(|uid| self.seen.get(uid))
            .for_each(take);
        Some(out)
    }

    fn index(&mut self, uid: &str, s: &Seen) {
        for (k, v) in &s.labels {
            self.by_label
                .entry((s.namespace.clone(), k.clone(), v.clone()))
                .or_default()
                .insert(uid.to_owned());
        }
    }

    fn unindex(&mut self, uid: &str, s: &Seen) {
        for (k, v) in &s.labels {
            let key = (s.namespace.clone(), k.clone(), v.clone());
            if let Some(uids) = self.by_label.get_mut(&key) {
                uids.remove(uid);
                if uids.is_empty() {
                    self.by_label.remove(&key);
                }
            }
        }
    }

    /// Pods remembered (for the tests and a sanity bound).
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

fn seen(pod: &CachedPod) -> Option<(String, Seen)> {
    Some((
        pod.uid()?,
        Seen {
            namespace: pod.namespace()?,
            labels: pod.labels().clone(),
            pod: Arc::new(selected_pod(pod)),
            terminal: is_terminal(pod),
        },
    ))
}

/// How long a deleted pod is remembered: as long as an agent repeats an OOM kill in its
/// reports (the agent's `OOM_KILL_RESEND_SECS`).
pub const DEPARTED_FOR: Duration = Duration::from_secs(600);
/// Deleted pods remembered per namespace, and in all, at most (the newest kept).
pub const MAX_DEPARTED_PER_NAMESPACE: usize = 256;
pub const MAX_DEPARTED: usize = 4096;

/// Pods deleted in the last [`DEPARTED_FOR`], by namespace, oldest first. A container
/// OOM-killed just before its pod is deleted (a Job cleaned up, a Deployment scaled down,
/// a user who deletes what crashed) is reported by its node's agent after the pod has left
/// the cache: without its pod the kill could not be named or graded, and would be lost.
/// Only pods that ran on a node are kept (what an agent can report a kill of).
#[derive(Debug, Default)]
pub struct Departed {
    by_namespace: HashMap<String, VecDeque<(Instant, Arc<CachedPod>)>>,
    len: usize,
}

impl Departed {
    pub fn record(&mut self, pod: &CachedPod, now: Instant) {
        let (Some(ns), true) = (
            pod.metadata.namespace.as_deref(),
            pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()),
        ) else {
            return;
        };
        if self.len >= MAX_DEPARTED {
            self.prune(now);
            if self.len >= MAX_DEPARTED {
                return;
            }
        }
        let q = self.by_namespace.entry(ns.to_owned()).or_default();
        while q
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= DEPARTED_FOR)
        {
            q.pop_front();
            self.len -= 1;
        }
        if q.len() >= MAX_DEPARTED_PER_NAMESPACE {
            q.pop_front();
            self.len -= 1;
        }
        q.push_back((now, Arc::new(pod.clone())));
        self.len += 1;
    }

    /// The pods of `namespace` deleted within [`DEPARTED_FOR`] of `now`.
    pub fn in_namespace(&self, namespace: &str, now: Instant) -> Vec<Arc<CachedPod>> {
        self.by_namespace
            .get(namespace)
            .into_iter()
            .flatten()
            .filter(|(at, _)| now.saturating_duration_since(*at) < DEPARTED_FOR)
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// Forgets what is older than [`DEPARTED_FOR`].
    pub fn prune(&mut self, now: Instant) {
        let mut len = 0;
        self.by_namespace.retain(|_, q| {
            while q
                .front()
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= DEPARTED_FOR)
            {
                q.pop_front();
            }
            len += q.len();
            !q.is_empty()
        });
        self.len = len;
    }
}

/// Watches of the pod's namespace whose selector matches its labels now or before; the
/// pod is targeted by none of them when it is `gone` (deleted, or not seen by a relist).
fn concerned(
    compiled: &mut Compiled,
    watches: &[Arc<ResourceWatch>],
    uid: &str,
    now: &Seen,
    gone: bool,
    before: Option<&Seen>,
) -> Vec<Concern> {
    let ns = now.namespace.as_str();
    // Borrowed, not `ResourceExt::namespace` (a String per watch per event).
    let of_ns = || {
        watches
            .iter()
            .filter(move |w| w.metadata.namespace.as_deref() == Some(ns))
    };
    let mut in_ns = 0;
    let concerns: Vec<Concern> = of_ns()
        .inspect(|_| in_ns += 1)
        .filter_map(|w| {
            let selector = compiled_selector(compiled, w);
            let selected_now = selects(selector, &now.labels);
            let selected_before = before.is_some_and(|b| selects(selector, &b.labels));
            (selected_now || selected_before).then(|| Concern {
                watch: ObjectRef::from_obj(&**w),
                uid: uid.to_owned(),
                pod: (selected_now && !gone && !now.terminal).then(|| now.pod.clone()),
            })
        })
        .collect();
    // A watch deleted since leaves its selector behind: forgotten once the namespace
    // holds more selectors than watches (a relist is rare).
    if let Some(held) = compiled.get_mut(ns)
        && held.len() > in_ns
    {
        let live: HashSet<&str> = of_ns().filter_map(|w| w.metadata.name.as_deref()).collect();
        held.retain(|name, _| live.contains(name.as_str()));
    }
    concerns
}

/// `w`'s selector, compiled once per change of its spec's selector.
fn compiled_selector<'a>(compiled: &'a mut Compiled, w: &ResourceWatch) -> &'a PodSelector {
    let ns = w.metadata.namespace.as_deref().unwrap_or_default();
    let name = w.metadata.name.as_deref().unwrap_or_default();
    let held = compiled.get_mut(ns).and_then(|m| m.get_mut(name));
    let fresh = match held {
        Some(c)
            if c.uid.is_some()
                && c.generation.is_some()
                && c.uid == w.metadata.uid
                && c.generation == w.metadata.generation =>
        {
            true
        }
        // Another field of the spec changed, or no UID and generation to go by.
        Some(c) if c.written == w.spec.selector => {
            c.uid.clone_from(&w.metadata.uid);
            c.generation = w.metadata.generation;
            true
        }
        _ => false,
    };
    if !fresh {
        let c = CompiledSelector {
            uid: w.metadata.uid.clone(),
            generation: w.metadata.generation,
            written: w.spec.selector.clone(),
            compiled: pod_selector(&w.spec.selector),
        };
        compiled
            .entry(ns.to_owned())
            .or_default()
            .insert(name.to_owned(), c);
    }
    &compiled[ns][name].compiled
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    fn watch(ns: &str, name: &str, selector: serde_json::Value) -> Arc<ResourceWatch> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ResourceWatch",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"selector": selector}
            }))
            .unwrap(),
        )
    }

    fn pod(ns: &str, uid: &str, labels: serde_json::Value) -> CachedPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("p-{uid}"), "namespace": ns, "uid": uid, "labels": labels}
        }))
        .unwrap()
    }

    fn on_node(mut p: CachedPod) -> CachedPod {
        p.spec = Some(crate::pods::CachedPodSpec {
            node_name: Some("n1".into()),
        });
        p
    }

    #[test]
    fn deleted_pods_are_remembered_ten_minutes_by_namespace_and_bounded() {
        let t0 = Instant::now();
        let mut d = Departed::default();
        d.record(
            &on_node(pod("a", "u1", serde_json::json!({"app": "x"}))),
            t0,
        );
        // Never scheduled: nothing ran, nothing can be killed.
        d.record(&pod("a", "u2", serde_json::json!({})), t0);
        d.record(&on_node(pod("b", "u3", serde_json::json!({}))), t0);
        let uids =
            |v: Vec<Arc<CachedPod>>| -> Vec<String> { v.iter().filter_map(|p| p.uid()).collect() };
        assert_eq!(
            uids(d.in_namespace("a", t0 + Duration::from_secs(599))),
            ["u1"]
        );
        assert_eq!(uids(d.in_namespace("b", t0)), ["u3"]);
        assert!(d.in_namespace("a", t0 + DEPARTED_FOR).is_empty());
        d.prune(t0 + DEPARTED_FOR);
        assert_eq!(d.len, 0);
        assert!(d.by_namespace.is_empty());
        // A namespace keeps its newest; the whole keeps at most MAX_DEPARTED.
        for i in 0..MAX_DEPARTED_PER_NAMESPACE + 5 {
            d.record(
                &on_node(pod("c", &format!("c{i}"), serde_json::json!({}))),
                t0,
            );
        }
        let c = uids(d.in_namespace("c", t0));
        assert_eq!(c.len(), MAX_DEPARTED_PER_NAMESPACE);
        assert_eq!(c[0], "c5");
        for i in 0..MAX_DEPARTED {
            d.record(
                &on_node(pod(&format!("n{i}"), "u", serde_json::json!({}))),
                t0,
            );
        }
        assert_eq!(d.len, MAX_DEPARTED);
        // Once they expire, there is room again.
        let later = t0 + DEPARTED_FOR;
        d.record(&on_node(pod("z", "z1", serde_json::json!({}))), later);
        assert_eq!(uids(d.in_namespace("z", later)), ["z1"]);
        assert_eq!(d.len, 1);
    }

    #[test]
    fn a_deleted_pod_is_kept_by_the_pod_triggers() {
        let mut t = PodTriggers::default();
        let p = on_node(pod("a", "u1", serde_json::json!({"app": "x"})));
        t.on_event(&Event::InitApply(p.clone()), &[]);
        t.on_event(&Event::InitDone, &[]);
        assert!(t.departed.in_namespace("a", Instant::now()).is_empty());
        t.on_event(&Event::Delete(p), &[]);
        assert_eq!(t.departed.in_namespace("a", Instant::now()).len(), 1);
    }

    fn names(concerns: Vec<Concern>) -> Vec<String> {
        let mut v: Vec<String> = concerns
            .into_iter()
            .map(|c| format!("{}/{}", c.watch.namespace.unwrap_or_default(), c.watch.name))
            .collect();
        v.sort();
        v
    }

    /// Past the first list, as the controller is once its pod cache is ready.
    fn listed() -> PodTriggers {
        let mut t = PodTriggers::default();
        assert!(t.on_event(&Event::Init, &[]).is_empty());
        assert!(t.on_event(&Event::InitDone, &[]).is_empty());
        t
    }

    fn watches() -> Vec<Arc<ResourceWatch>> {
        vec![
            watch(
                "a",
                "api",
                serde_json::json!({"matchLabels": {"app": "api"}}),
            ),
            watch(
                "a",
                "web",
                serde_json::json!({"matchLabels": {"app": "web"}}),
            ),
            watch(
                "a",
                "tier",
                serde_json::json!({"matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["front"]}]}),
            ),
            watch("a", "all", serde_json::json!({})),
            watch(
                "b",
                "api",
                serde_json::json!({"matchLabels": {"app": "api"}}),
            ),
        ]
    }

    #[test]
    fn a_pod_reaches_only_the_watches_of_its_namespace_that_select_it() {
        let (mut t, w) = (listed(), watches());
        let p = pod("a", "u1", serde_json::json!({"app": "api"}));
        assert_eq!(names(t.on_event(&Event::Apply(p), &w)), ["a/all", "a/api"]);
        let p = pod(
            "a",
            "u2",
            serde_json::json!({"app": "web", "tier": "front"}),
        );
        assert_eq!(
            names(t.on_event(&Event::Apply(p), &w)),
            ["a/all", "a/tier", "a/web"]
        );
        let p = pod("c", "u3", serde_json::json!({"app": "api"}));
        assert!(t.on_event(&Event::Apply(p), &w).is_empty());
    }

    #[test]
    fn a_watch_whose_selector_is_edited_is_matched_by_its_new_selector() {
        // The compiled selector is kept between events: an edited spec must not be
        // matched by the selector compiled before the edit.
        let (mut t, w) = (listed(), watches());
        let p = pod("a", "u1", serde_json::json!({"app": "api"}));
        assert_eq!(names(t.on_event(&Event::Apply(p), &w)), ["a/all", "a/api"]);
        let mut edited = w.clone();
        edited[0] = watch(
            "a",
            "api",
            serde_json::json!({"matchLabels": {"app": "db"}}),
        );
        let p = pod("a", "u2", serde_json::json!({"app": "api"}));
        assert_eq!(names(t.on_event(&Event::Apply(p), &edited)), ["a/all"]);
        let p = pod("a", "u3", serde_json::json!({"app": "db"}));
        assert_eq!(
            names(t.on_event(&Event::Apply(p), &edited)),
            ["a/all", "a/api"]
        );
        // As the API server writes them, with a UID and a generation: an edit bumps the
        // generation, a watch made again under its name has another UID (here with the
        // same generation as the one before it, so only the UID tells them apart).
        let with_meta = |uid: &str, generation: i64, labels: serde_json::Value| {
            let mut w = (*watch("a", "api", serde_json::json!({"matchLabels": labels}))).clone();
            (w.metadata.uid, w.metadata.generation) = (Some(uid.into()), Some(generation));
            let mut all = edited.clone();
            all[0] = Arc::new(w);
            all
        };
        let api = |t: &mut PodTriggers, w: &[Arc<ResourceWatch>], uid: &str, app: &str| {
            let p = pod("a", uid, serde_json::json!({ "app": app }));
            names(t.on_event(&Event::Apply(p), w)).contains(&"a/api".to_string())
        };
        let w1 = with_meta("w-1", 1, serde_json::json!({"app": "api"}));
        assert!(api(&mut t, &w1, "u4", "api"));
        let w2 = with_meta("w-1", 2, serde_json::json!({"app": "web"}));
        assert!(!api(&mut t, &w2, "u5", "api") && api(&mut t, &w2, "u6", "web"));
        let again = with_meta("w-2", 2, serde_json::json!({"app": "db"}));
        assert!(!api(&mut t, &again, "u7", "web") && api(&mut t, &again, "u8", "db"));
        // A watch deleted since: its selector is forgotten at the namespace's next event.
        let p = pod("a", "u9", serde_json::json!({"app": "db"}));
        t.on_event(&Event::Apply(p), &again[1..4]);
        assert!(!t.compiled["a"].contains_key("api") && t.compiled["a"].len() == 3);
        // A relist forgets the selectors of watches gone since.
        t.on_event(&Event::Init, &edited[1..]);
        t.on_event(&Event::InitDone, &edited[1..]);
        assert!(!t.compiled["a"].contains_key("api"));
        assert!(t.compiled["a"].contains_key("all"));
    }

    #[test]
    fn a_pod_leaving_a_selector_or_deleted_still_reaches_the_watch_that_held_it() {
        let (mut t, w) = (listed(), watches());
        t.on_event(
            &Event::Apply(pod("a", "u1", serde_json::json!({"app": "api"}))),
            &w,
        );
        let moved = pod("a", "u1", serde_json::json!({"app": "web"}));
        assert_eq!(
            names(t.on_event(&Event::Apply(moved.clone()), &w)),
            ["a/all", "a/api", "a/web"]
        );
        // Settled: only the watches that select it now.
        assert_eq!(
            names(t.on_event(&Event::Apply(moved.clone()), &w)),
            ["a/all", "a/web"]
        );
        assert_eq!(
            names(t.on_event(&Event::Delete(moved), &w)),
            ["a/all", "a/web"]
        );
        assert!(t.is_empty(), "a deleted pod is forgotten");
    }

    #[test]
    fn each_concerned_watch_learns_whether_it_still_targets_the_pod() {
        let (mut t, w) = (listed(), watches());
        // The pod as each concerned watch should target it: its name, or "-" for none.
        let targets = |concerns: Vec<Concern>| -> Vec<String> {
            let mut v: Vec<String> = concerns
                .into_iter()
                .map(|c| {
                    let pod = c.pod.map_or("-".to_string(), |p| p.name.clone());
                    format!("{}:{}:{pod}", c.watch.name, c.uid)
                })
                .collect();
            v.sort();
            v
        };
        let p = on_node(pod("a", "u1", serde_json::json!({"app": "api"})));
        assert_eq!(
            targets(t.on_event(&Event::Apply(p), &w)),
            ["all:u1:p-u1", "api:u1:p-u1"]
        );
        // Labels moved out of `api`: it drops the pod, `web` takes it.
        let moved = on_node(pod("a", "u1", serde_json::json!({"app": "web"})));
        assert_eq!(
            targets(t.on_event(&Event::Apply(moved.clone()), &w)),
            ["all:u1:p-u1", "api:u1:-", "web:u1:p-u1"]
        );
        // Finished: selected still, targeted by none.
        let mut done = moved.clone();
        done.status = Some(crate::pods::CachedPodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        assert_eq!(
            targets(t.on_event(&Event::Apply(done), &w)),
            ["all:u1:-", "web:u1:-"]
        );
        // Deleted, and a pod a relist no longer sees: targeted by none.
        assert_eq!(
            targets(t.on_event(&Event::Delete(moved), &w)),
            ["all:u1:-", "web:u1:-"]
        );
        t.on_event(
            &Event::Apply(pod("a", "u2", serde_json::json!({"app": "api"}))),
            &w,
        );
        t.on_event(&Event::Init, &w);
        assert_eq!(
            targets(t.on_event(&Event::InitDone, &w)),
            ["all:u2:-", "api:u2:-"]
        );
    }

    #[test]
    fn a_relist_forgets_pods_deleted_while_the_watch_was_down_and_reconciles_their_watches() {
        let (mut t, w) = (listed(), watches());
        t.on_event(
            &Event::Apply(pod("a", "u1", serde_json::json!({"app": "api"}))),
            &w,
        );
        t.on_event(
            &Event::Apply(pod("a", "u2", serde_json::json!({"app": "web"}))),
            &w,
        );
        assert!(t.on_event(&Event::Init, &w).is_empty());
        let kept = pod("a", "u2", serde_json::json!({"app": "web"}));
        assert_eq!(
            names(t.on_event(&Event::InitApply(kept), &w)),
            ["a/all", "a/web"]
        );
        // u1 was deleted during the outage: its watches must drop it.
        assert_eq!(names(t.on_event(&Event::InitDone, &w)), ["a/all", "a/api"]);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn the_first_list_maps_nothing_but_remembers_every_pod() {
        let (mut t, w) = (PodTriggers::default(), watches());
        t.on_event(&Event::Init, &w);
        let p = pod("a", "u1", serde_json::json!({"app": "api"}));
        assert!(t.on_event(&Event::InitApply(p), &w).is_empty());
        assert!(t.on_event(&Event::InitDone, &w).is_empty());
        // Remembered: moving it out of `api` still reaches `api`.
        let moved = pod("a", "u1", serde_json::json!({"app": "web"}));
        assert_eq!(
            names(t.on_event(&Event::Apply(moved), &w)),
            ["a/all", "a/api", "a/web"]
        );
    }

    #[test]
    fn the_label_index_follows_labels_deletions_and_relists() {
        let sel = |json| -> LabelSelector { serde_json::from_value(json).unwrap() };
        // The names of the pods `selector` selects in `ns`: running, then finished.
        let chosen = |t: &PodTriggers, ns: &str, selector: &LabelSelector| {
            let names = |v: Vec<Arc<SelectedPod>>| -> Vec<String> {
                v.iter().map(|p| p.name.clone()).collect()
            };
            t.select(ns, selector, &pod_selector(selector))
                .map(|s| (names(s.running), names(s.finished)))
        };
        let running = |names: &[&str]| {
            Some((
                names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
                vec![],
            ))
        };
        let api = sel(serde_json::json!({"matchLabels": {"app": "api"}}));
        let mut t = PodTriggers::default();
        t.on_event(&Event::Init, &[]);
        t.on_event(
            &Event::InitApply(pod(
                "a",
                "u1",
                serde_json::json!({"app": "api", "tier": "x"}),
            )),
            &[],
        );
        assert_eq!(
            chosen(&t, "a", &api),
            None,
            "not before the first list ends"
        );
        t.on_event(&Event::InitDone, &[]);
        t.on_event(
            &Event::Apply(pod("a", "u2", serde_json::json!({"app": "api"}))),
            &[],
        );
        t.on_event(
            &Event::Apply(pod("b", "u3", serde_json::json!({"app": "api"}))),
            &[],
        );
        assert_eq!(chosen(&t, "a", &api), running(&["p-u1", "p-u2"]));
        // The smallest set of the pairs: only u1 has tier=x.
        let both = sel(serde_json::json!({"matchLabels": {"app": "api", "tier": "x"}}));
        assert_eq!(chosen(&t, "a", &both), running(&["p-u1"]));
        assert_eq!(
            chosen(
                &t,
                "a",
                &sel(serde_json::json!({"matchLabels": {"app": "none"}}))
            ),
            running(&[])
        );
        // Expressions are tested on each candidate; no matchLabels: every pod of the
        // namespace is tested.
        let not_x = sel(serde_json::json!({"matchLabels": {"app": "api"},
            "matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}));
        assert_eq!(chosen(&t, "a", &not_x), running(&["p-u2"]));
        assert_eq!(
            chosen(&t, "a", &sel(serde_json::json!({}))),
            running(&["p-u1", "p-u2"])
        );
        // What a reconcile reads of a pod follows its changes: a container that started,
        // a pod that finished.
        let mut started = pod("a", "u2", serde_json::json!({"app": "api"}));
        started.status = Some(crate::pods::CachedPodStatus {
            container_statuses: Some(vec![crate::pods::CachedContainerStatus {
                name: "app".into(),
                container_id: Some("containerd://c2".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        t.on_event(&Event::Apply(started.clone()), &[]);
        let s = t.select("a", &api, &pod_selector(&api)).unwrap();
        let u2 = s.running.iter().find(|p| p.uid == "u2").unwrap();
        assert_eq!(u2.containers.get("c2").map(String::as_str), Some("app"));
        let mut failed = started;
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        t.on_event(&Event::Apply(failed), &[]);
        assert_eq!(
            chosen(&t, "a", &api),
            Some((vec!["p-u1".to_string()], vec!["p-u2".to_string()]))
        );
        // A relabel and a deletion leave the index.
        t.on_event(
            &Event::Apply(pod("a", "u1", serde_json::json!({"app": "web"}))),
            &[],
        );
        t.on_event(
            &Event::Delete(pod("a", "u2", serde_json::json!({"app": "api"}))),
            &[],
        );
        assert_eq!(chosen(&t, "a", &api), running(&[]));
        // A relist that no longer lists u3 drops it.
        t.on_event(&Event::Init, &[]);
        t.on_event(&Event::InitDone, &[]);
        assert_eq!(chosen(&t, "b", &api), running(&[]));
        assert!(t.by_label.is_empty() && t.is_empty());
    }

    #[test]
    fn a_pod_without_uid_or_namespace_triggers_nothing() {
        let (mut t, w) = (listed(), watches());
        let p: CachedPod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}})).unwrap();
        assert!(t.on_event(&Event::Apply(p), &w).is_empty());
        assert!(t.is_empty());
    }
}
