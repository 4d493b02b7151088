//! CPU profiles on request: a user sets `resourcewatch.io/profile: pod=NAME[,container=C]
//! [,duration=30s][,request=ANY]` on a ResourceWatch; the operator takes each new value
//! once, records it in `status.profile` (with the value, so the same value is never taken
//! twice), and has the pod's node agent sample the pod's cgroups for that long. The agent
//! renders the result; the operator stores it in a ConfigMap owned by the watch, deleted
//! after [`RETENTION`].
//!
//! The operator never removes the annotation (as Argo CD's controller removes its refresh
//! annotation): a GitOps tool re-applying it would fight the removal, and the operator
//! writes only the status of a watch, never the object its users own.
//!
//! Everything here is pure (inputs to decisions); the controller makes the API calls.
//!
//! What a user can reach: only pods the watch selects, in its own namespace, for a
//! bounded time at a fixed low frequency; the kernel sees nothing of the request but
//! cgroup ids the agent resolves itself. One request per namespace per [`MIN_GAP`].

use std::{collections::BTreeMap, time::Duration};

use resourcewatch_crds::{
    HotFunction, MAX_FRAME_LENGTH, MAX_HOT_FUNCTIONS, MAX_MESSAGE, ProfileState, ProfileStatus,
};
use resourcewatch_proto as pb;

use crate::{
    model::{EventAction, EventReason},
    nodes::ProfileOrder,
    status::{EventSpec, SelectedPod, Subject},
};

/// The longest profile a user may ask for: long enough to catch a periodic hot path,
/// short enough that a forgotten request costs nothing for long.
pub const MAX_DURATION: Duration = Duration::from_secs(60);
/// Without `duration=`.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(30);
/// 99 Hz: Brendan Gregg's usual choice (not a multiple of common timer frequencies), and
/// measured at under 1 % of the profiled process's CPU (node-agent/BENCHMARKS.md).
pub const FREQUENCY_HZ: u32 = 99;
/// The least time between two requests taken in one namespace.
pub const MIN_GAP: Duration = Duration::from_secs(60);
/// How long a result's ConfigMap lives.
pub const RETENTION: Duration = Duration::from_secs(3600);
/// A Pending request with no result this long after its profile should have ended fails
/// (the agent was lost, or cannot profile).
pub const RESULT_GRACE: Duration = Duration::from_secs(60);

/// A parsed `resourcewatch.io/profile` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub pod: String,
    pub container: Option<String>,
    pub duration: Duration,
}

/// A `resourcewatch.io/profile` value that is not a request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("{0:?} is not pod=NAME, container=NAME, duration=D or request=ANY")]
    Part(String),
    #[error("duration {value:?}: {problem}")]
    Duration {
        value: String,
        problem: resourcewatch_units::UnitError,
    },
    #[error("no pod named: expected pod=NAME[,container=NAME][,duration=30s]")]
    NoPod,
    #[error("duration {} s is outside 1-{} s", .0.as_secs_f64(), MAX_DURATION.as_secs())]
    DurationOutOfRange(Duration),
}

/// Why a request is not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("one profile per namespace per {} s: the last was taken {ago} s ago", MIN_GAP.as_secs())]
    RateLimited { ago: i64 },
    #[error("the watch does not select this pod (or it is not running)")]
    NotSelected,
    #[error("the pod is not scheduled to a node")]
    NotScheduled,
    #[error("the pod has no started container {0:?}")]
    NoSuchContainer(String),
    #[error("none of the pod's containers has started")]
    NoneStarted,
}

/// `pod=NAME[,container=NAME][,duration=D][,request=ANY]`, or a bare pod name. `request`
/// only makes a value new, to ask again for the same profile.
pub fn parse(value: &str) -> Result<Request, RequestError> {
    let value = value.trim();
    let mut pod = None;
    let mut container = None;
    let mut duration = DEFAULT_DURATION;
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('=') {
            None if pod.is_none() && !value.contains('=') => pod = Some(part.to_owned()),
            Some(("pod", v)) => pod = Some(v.trim().to_owned()),
            Some(("container", v)) => container = Some(v.trim().to_owned()),
            Some(("request", _)) => {}
            Some(("duration", v)) => {
                duration = resourcewatch_units::parse_duration(v.trim()).map_err(|e| {
                    RequestError::Duration {
                        value: v.to_owned(),
                        problem: e,
                    }
                })?;
            }
            _ => {
                return Err(RequestError::Part(part.to_owned()));
            }
        }
    }
    let pod = pod.filter(|p| !p.is_empty()).ok_or(RequestError::NoPod)?;
    if duration < Duration::from_secs(1) || duration > MAX_DURATION {
        return Err(RequestError::DurationOutOfRange(duration));
    }
    Ok(Request {
        pod,
        container: container.filter(|c| !c.is_empty()),
        duration,
    })
}

/// What the controller knows when it meets the annotation.
pub struct Take<'a> {
    pub annotation: &'a str,
    /// The watch's profile so far.
    pub old: Option<&'a ProfileStatus>,
    pub pods: &'a [std::sync::Arc<SelectedPod>],
    /// The latest `requestedAt` of any watch's profile in the namespace (unix seconds).
    pub namespace_last: Option<i64>,
    pub now: i64,
    /// Unique per request: the watch's UID and the time.
    pub id: String,
}

/// The longest annotation value taken (and kept in status).
pub const MAX_REQUEST: usize = 256;

/// Whether the annotation's value is a request the status does not answer yet. The
/// annotation stays on the watch, so every reconcile meets it: this is checked before
/// anything costlier.
pub fn is_new(annotation: &str, old: Option<&ProfileStatus>) -> bool {
    old.is_none_or(|o| o.request != cut(annotation, MAX_REQUEST))
}

/// What taking the annotation gives: a new profile status (Pending or Refused), or
/// nothing new when the status already answers this value.
pub fn take(t: &Take<'_>) -> Option<ProfileStatus> {
    if !is_new(t.annotation, t.old) {
        return None;
    }
    let request = cut(t.annotation, MAX_REQUEST);
    let requested_at = rfc3339(t.now);
    let refused = |pod: String, message: String| ProfileStatus {
        id: t.id.clone(),
        request: request.clone(),
        pod,
        container: String::new(),
        node: String::new(),
        state: ProfileState::Refused,
        message: cut(&message, MAX_MESSAGE),
        duration_seconds: 0,
        frequency_hz: FREQUENCY_HZ,
        requested_at: requested_at.clone(),
        finished_at: None,
        config_map: None,
        expires_at: None,
        samples: 0,
        hottest: Vec::new(),
    };
    let req = match parse(t.annotation) {
        Ok(r) => r,
        Err(e) => return Some(refused(String::new(), e.to_string())),
    };
    let node = match node_for(t, &req) {
        Ok(node) => node,
        Err(why) => return Some(refused(req.pod, why.to_string())),
    };
    Some(ProfileStatus {
        id: t.id.clone(),
        request,
        pod: req.pod,
        container: req.container.unwrap_or_default(),
        node,
        state: ProfileState::Pending,
        message: String::new(),
        duration_seconds: req.duration.as_secs() as u32,
        frequency_hz: FREQUENCY_HZ,
        requested_at,
        finished_at: None,
        config_map: None,
        expires_at: None,
        samples: 0,
        hottest: Vec::new(),
    })
}

/// What one reconcile knows of the watch's profile besides its status.
pub struct Inputs<'a> {
    /// The watch's `resourcewatch.io/profile` annotation.
    pub annotation: Option<&'a str>,
    /// The latest request taken in the namespace (unix seconds), gathered only when the
    /// annotation [`is_new`]: it reads every watch of the namespace.
    pub namespace_last: Option<i64>,
    /// The id a request taken now gets (unique per request: the watch's UID and the time).
    pub id: String,
    /// A node's result for the Pending request, if one has arrived.
    pub result: Option<&'a pb::ProfileResult>,
}

/// An effect on the result's ConfigMap the controller carries out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Store the node's result in the watch's ConfigMap, then finish the request with how
    /// that went ([`stored`]), before the status is written.
    Store,
    /// Delete the expired result's ConfigMap (before the status saying Expired is
    /// written: a failed delete is retried by the next reconcile, which ages it again).
    Delete,
}

/// What a reconcile makes of the watch's profile.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    pub status: Option<ProfileStatus>,
    pub events: Vec<EventSpec>,
    pub effect: Option<Effect>,
    /// A request was taken now: it counts in the namespace's rate limit once the status
    /// recording it is written.
    pub taken: bool,
    /// The node's result was used: the hub may forget it once the status is written.
    pub result_used: bool,
}

/// Takes a new request, applies a node's result, fails an overdue request and expires an
/// old result.
pub fn step(
    old: Option<&ProfileStatus>,
    i: &Inputs<'_>,
    pods: &[std::sync::Arc<SelectedPod>],
    now: i64,
) -> Step {
    let mut out = Step {
        status: old.cloned(),
        ..Step::default()
    };
    if let Some(a) = i.annotation
        && let Some(p) = take(&Take {
            annotation: a,
            old,
            pods,
            namespace_last: i.namespace_last,
            now,
            id: i.id.clone(),
        })
    {
        if p.state == ProfileState::Refused {
            out.events.push(event(EventReason::ProfileRefused, &p));
        } else {
            out.taken = true;
        }
        out.status = Some(p);
    }
    let Some(p) = out.status.as_mut() else {
        return out;
    };
    match i.result.filter(|r| r.id == p.id) {
        Some(r) if p.state == ProfileState::Pending => {
            out.result_used = true;
            if r.error.is_empty() {
                out.effect = Some(Effect::Store);
            } else {
                finish(p, r, Err(""), now);
                out.events.push(event(EventReason::ProfileFailed, p));
            }
        }
        _ if age(p, now) => {
            if p.state == ProfileState::Failed {
                out.events.push(event(EventReason::ProfileFailed, p));
            } else {
                out.effect = Some(Effect::Delete);
            }
        }
        _ => {}
    }
    out
}

/// The follow-up of [`Effect::Store`]: the request finished with the ConfigMap's name, or
/// failed saying why it was not stored. Returns its Event.
pub fn stored(
    p: &mut ProfileStatus,
    r: &pb::ProfileResult,
    result: Result<String, impl std::fmt::Display>,
    now: i64,
) -> EventSpec {
    finish(p, r, result, now);
    let reason = if p.state == ProfileState::Succeeded {
        EventReason::ProfileSucceeded
    } else {
        EventReason::ProfileFailed
    };
    event(reason, p)
}

fn event(reason: EventReason, p: &ProfileStatus) -> EventSpec {
    let what = format!("CPU profile {} of pod {}", p.id, p.pod);
    EventSpec::new(
        reason != EventReason::ProfileSucceeded,
        reason,
        EventAction::Profile,
        match &p.config_map {
            Some(cm) => format!("{what}: {}; in ConfigMap {cm}", p.message),
            None => format!("{what}: {}", p.message),
        },
        None,
    )
    .about(Subject::container(&p.pod, &p.container))
}

/// The node of the request's pod, or why the request is refused.
fn node_for(t: &Take<'_>, req: &Request) -> Result<String, Refusal> {
    if let Some(last) = t.namespace_last
        && t.now - last < MIN_GAP.as_secs() as i64
    {
        return Err(Refusal::RateLimited { ago: t.now - last });
    }
    let pod = t
        .pods
        .iter()
        .find(|p| p.name == req.pod)
        .ok_or(Refusal::NotSelected)?;
    let node = pod.node.clone().ok_or(Refusal::NotScheduled)?;
    if let Some(c) = &req.container
        && !pod.containers.values().any(|name| name == c)
    {
        return Err(Refusal::NoSuchContainer(c.clone()));
    }
    if pod.containers.is_empty() {
        return Err(Refusal::NoneStarted);
    }
    Ok(node)
}

/// What the hub sends the pod's node while the request is Pending. None once the pod is
/// gone (the request then fails at its deadline) or for any other state.
pub fn order(
    p: &ProfileStatus,
    namespace: &str,
    pods: &[std::sync::Arc<SelectedPod>],
) -> Option<ProfileOrder> {
    if p.state != ProfileState::Pending {
        return None;
    }
    let pod = pods.iter().find(|x| x.name == p.pod)?;
    let containers: BTreeMap<String, String> = pod
        .containers
        .iter()
        .filter(|(_, name)| p.container.is_empty() || **name == p.container)
        .map(|(id, name)| (id.clone(), name.clone()))
        .collect();
    Some(ProfileOrder {
        id: p.id.clone(),
        pod_uid: pod.uid.clone(),
        node: pod.node.clone()?,
        container_ids: containers.keys().cloned().collect(),
        namespace: namespace.to_owned(),
        pod: pod.name.clone(),
        container_names: containers,
        duration: Duration::from_secs(p.duration_seconds.into()),
        frequency_hz: p.frequency_hz,
    })
}

/// The name of the ConfigMap holding a watch's last profile.
pub fn config_map_name(watch: &str) -> String {
    // A watch name is at most 253 characters; so is a ConfigMap's.
    let mut name = watch.chars().take(253 - 8).collect::<String>();
    name.push_str("-profile");
    name
}

/// Applies a node's result: Succeeded with what it found (`stored` is the ConfigMap the
/// caller wrote first), or Failed with the node's reason, or why it was not stored.
pub fn finish(
    p: &mut ProfileStatus,
    r: &pb::ProfileResult,
    stored: Result<String, impl std::fmt::Display>,
    now: i64,
) {
    p.finished_at = Some(rfc3339(now));
    p.samples = r.samples;
    let config_map = match stored {
        Ok(name) if r.error.is_empty() => name,
        Ok(_) => {
            p.state = ProfileState::Failed;
            p.message = cut(&r.error, MAX_MESSAGE);
            return;
        }
        Err(why) => {
            p.state = ProfileState::Failed;
            let why = if r.error.is_empty() {
                why.to_string()
            } else {
                r.error.clone()
            };
            p.message = cut(&why, MAX_MESSAGE);
            return;
        }
    };
    p.state = ProfileState::Succeeded;
    p.config_map = Some(config_map);
    p.expires_at = Some(rfc3339(now + RETENTION.as_secs() as i64));
    p.hottest = r
        .hottest
        .iter()
        .take(MAX_HOT_FUNCTIONS as usize)
        .map(|h| HotFunction {
            function: cut(&h.name, MAX_FRAME_LENGTH as usize),
            percent: (h.samples as f64 * 1000.0 / r.samples.max(1) as f64).round() / 10.0,
        })
        .collect();
    p.message = match p.hottest.first() {
        Some(h) => format!(
            "{} samples in {:.1} s; hottest {} ({}%)",
            r.samples, r.duration_seconds, h.function, h.percent
        ),
        None => format!(
            "no samples in {:.1} s: the pod did not run on a CPU",
            r.duration_seconds
        ),
    };
    if r.lost > 0 {
        p.message.push_str(&format!(
            "; {} stacks lost (the kernel's maps were full)",
            r.lost
        ));
    }
    if r.svg.is_empty() {
        p.message
            .push_str("; no flame graph: it would not fit the ConfigMap (folded and pprof do)");
    }
}

/// A Pending request whose result is overdue fails; a Succeeded one whose ConfigMap
/// outlived [`RETENTION`] expires (the caller deletes the ConfigMap). Returns whether the
/// status changed.
pub fn age(p: &mut ProfileStatus, now: i64) -> bool {
    match p.state {
        ProfileState::Pending => {
            let due = seconds(&p.requested_at).unwrap_or(now)
                + i64::from(p.duration_seconds)
                + RESULT_GRACE.as_secs() as i64;
            if now <= due {
                return false;
            }
            p.state = ProfileState::Failed;
            p.finished_at = Some(rfc3339(now));
            p.message = format!(
                "no result from node {:?} within {} s of the profile's end (agent lost, or the pod gone)",
                p.node,
                RESULT_GRACE.as_secs()
            );
            true
        }
        ProfileState::Succeeded => {
            let Some(exp) = p.expires_at.as_deref().and_then(seconds) else {
                return false;
            };
            if now < exp {
                return false;
            }
            p.state = ProfileState::Expired;
            p.message = format!("its ConfigMap was deleted after {} s", RETENTION.as_secs());
            p.config_map = None;
            true
        }
        _ => false,
    }
}

/// When the controller must look again: the end of a Pending request's grace, or a
/// result's expiry.
pub fn next_check(p: &ProfileStatus, now: i64) -> Option<Duration> {
    let at = match p.state {
        ProfileState::Pending => {
            seconds(&p.requested_at)?
                + i64::from(p.duration_seconds)
                + RESULT_GRACE.as_secs() as i64
                + 1
        }
        ProfileState::Succeeded => seconds(p.expires_at.as_deref()?)?,
        _ => return None,
    };
    Some(Duration::from_secs((at - now).max(1) as u64))
}

/// The state a written status newly gave a request (counted once in
/// `resourcewatch_operator_profiles_total`): a new id, or a new state of the same id.
pub fn transition(
    old: Option<&ProfileStatus>,
    new: Option<&ProfileStatus>,
) -> Option<ProfileState> {
    let new = new?;
    match old {
        Some(o) if o.id == new.id && o.request == new.request && o.state == new.state => None,
        _ => Some(new.state),
    }
}

/// The latest `requestedAt` of the watches' profiles (the namespace's rate limit).
pub fn latest_request<'a>(profiles: impl Iterator<Item = &'a ProfileStatus>) -> Option<i64> {
    profiles
        .filter(|p| p.state != ProfileState::Refused)
        .filter_map(|p| seconds(&p.requested_at))
        .max()
}

fn rfc3339(unix: i64) -> String {
    jiff::Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn seconds(s: &str) -> Option<i64> {
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}

pub fn cut(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn pods() -> Vec<std::sync::Arc<SelectedPod>> {
        vec![std::sync::Arc::new(SelectedPod {
            uid: "uid-1".into(),
            name: "api-1".into(),
            node: Some("n1".into()),
            containers: [
                ("cid-a".to_string(), "app".to_string()),
                ("cid-b".to_string(), "sidecar".to_string()),
            ]
            .into(),
            exited_containers: Default::default(),
            created: None,
        })]
    }

    fn take_at(
        annotation: &str,
        old: Option<&ProfileStatus>,
        last: Option<i64>,
    ) -> Option<ProfileStatus> {
        let pods = pods();
        take(&Take {
            annotation,
            old,
            pods: &pods,
            namespace_last: last,
            now: NOW,
            id: "w-1".into(),
        })
    }

    #[test]
    fn the_annotation_names_a_pod_a_container_and_a_bounded_duration() {
        assert_eq!(
            parse("pod=api-1, container=app, duration=10s"),
            Ok(Request {
                pod: "api-1".into(),
                container: Some("app".into()),
                duration: Duration::from_secs(10)
            })
        );
        assert_eq!(parse("api-1").unwrap().duration, DEFAULT_DURATION);
        assert_eq!(parse(""), Err(RequestError::NoPod));
        assert!(
            parse("pod=a,duration=2m")
                .unwrap_err()
                .to_string()
                .contains("outside 1-60")
        );
        assert!(
            parse("pod=a,duration=fast")
                .unwrap_err()
                .to_string()
                .contains("duration")
        );
        assert!(
            parse("pod=a,path=/x")
                .unwrap_err()
                .to_string()
                .contains("path")
        );
        assert!(parse("a,b").is_err(), "two bare names");
    }

    #[test]
    fn a_request_for_a_selected_pod_is_pending_and_ordered_to_its_node() {
        let p = take_at("pod=api-1,container=app,duration=5s", None, None).unwrap();
        assert_eq!(p.state, ProfileState::Pending);
        assert_eq!((p.node.as_str(), p.duration_seconds), ("n1", 5));
        let o = order(&p, "ns", &pods()).unwrap();
        assert_eq!(o.container_ids, ["cid-a"]);
        assert_eq!((o.pod_uid.as_str(), o.node.as_str()), ("uid-1", "n1"));
        assert_eq!(o.frequency_hz, FREQUENCY_HZ);
        // What the samples are labelled with.
        assert_eq!((o.namespace.as_str(), o.pod.as_str()), ("ns", "api-1"));
        assert_eq!(
            o.container_names,
            BTreeMap::from([("cid-a".to_owned(), "app".to_owned())])
        );
        // No container named: all of the pod's.
        let all = take_at("api-1", None, None).unwrap();
        assert_eq!(order(&all, "ns", &pods()).unwrap().container_ids.len(), 2);
    }

    #[test]
    fn bad_requests_are_refused_with_the_reason() {
        for (annotation, why) in [
            ("pod=other", "does not select"),
            ("pod=api-1,container=db", "no started container"),
            ("pod=api-1,duration=0s", "outside"),
            ("cmd=rm", "is not pod="),
        ] {
            let p = take_at(annotation, None, None).unwrap();
            assert_eq!(p.state, ProfileState::Refused, "{annotation}");
            assert!(p.message.contains(why), "{annotation}: {}", p.message);
            assert!(order(&p, "ns", &pods()).is_none());
        }
    }

    #[test]
    fn one_request_per_namespace_per_minute() {
        let p = take_at("api-1", None, Some(NOW - 30)).unwrap();
        assert_eq!(p.state, ProfileState::Refused);
        assert!(p.message.contains("30 s ago"), "{}", p.message);
        assert_eq!(
            take_at("api-1", None, Some(NOW - 61)).unwrap().state,
            ProfileState::Pending
        );
        // Refused requests do not count against the namespace.
        let refused = take_at("pod=other", None, None).unwrap();
        assert_eq!(latest_request([&refused].into_iter()), None);
    }

    #[test]
    fn each_value_is_taken_once_and_a_new_value_is_a_new_request() {
        let p = take_at("pod=api-1,duration=5s", None, None).unwrap();
        assert_eq!(p.request, "pod=api-1,duration=5s");
        // The annotation stays on the watch: every later reconcile sees the same value,
        // and the rate limit (which its own requestedAt would trip) must not refuse it.
        assert!(take_at("pod=api-1,duration=5s", Some(&p), Some(NOW)).is_none());
        // A refused value is not retried either.
        let refused = take_at("pod=nope", None, None).unwrap();
        assert!(take_at("pod=nope", Some(&refused), None).is_none());
        // Asking again: another value, here only `request=` changed.
        let again = take_at("pod=api-1,duration=5s,request=2", Some(&p), Some(NOW - 90));
        assert_eq!(again.unwrap().state, ProfileState::Pending);
        // Another request while one is pending is new, and rate-limited.
        let other = take_at("pod=api-1,duration=6s", Some(&p), Some(NOW)).unwrap();
        assert_eq!(other.state, ProfileState::Refused);
    }

    fn result(error: &str) -> pb::ProfileResult {
        pb::ProfileResult {
            id: "w-1".into(),
            error: error.into(),
            samples: 990,
            duration_seconds: 10.0,
            frequency_hz: 99,
            hottest: vec![
                pb::HotFunction {
                    name: "burn_here".into(),
                    samples: 960,
                },
                pb::HotFunction {
                    name: "middle".into(),
                    samples: 30,
                },
            ],
            folded: "burn;main;outer;middle;burn_here 960\n".into(),
            pprof: vec![1, 2, 3],
            svg: b"<svg/>".to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn each_state_a_request_reaches_is_counted_once() {
        let pending = take_at("api-1", None, None).unwrap();
        assert_eq!(
            transition(None, Some(&pending)),
            Some(ProfileState::Pending)
        );
        assert_eq!(transition(Some(&pending), Some(&pending)), None);
        let mut done = pending.clone();
        finish(
            &mut done,
            &result(""),
            Ok::<_, String>("w-profile".into()),
            NOW + 40,
        );
        assert_eq!(
            transition(Some(&pending), Some(&done)),
            Some(ProfileState::Succeeded)
        );
        let mut next = take_at("pod=api-1,request=2", Some(&done), None).unwrap();
        next.id = "w-2".into();
        next.state = ProfileState::Succeeded;
        assert_eq!(
            transition(Some(&done), Some(&next)),
            Some(ProfileState::Succeeded),
            "another id"
        );
        assert_eq!(transition(Some(&done), None), None);
    }

    #[test]
    fn a_result_succeeds_with_its_hottest_functions_and_expires() {
        let mut p = take_at("api-1", None, None).unwrap();
        finish(
            &mut p,
            &result(""),
            Ok::<_, String>("w-profile".into()),
            NOW + 40,
        );
        assert_eq!(p.state, ProfileState::Succeeded);
        assert_eq!(p.hottest[0].function, "burn_here");
        assert_eq!(p.hottest[0].percent, 97.0);
        assert!(
            p.message.contains("hottest burn_here (97%)"),
            "{}",
            p.message
        );
        assert_eq!(next_check(&p, NOW + 40), Some(RETENTION));
        assert!(!age(&mut p, NOW + 40 + 3599));
        assert!(age(&mut p, NOW + 40 + 3600));
        assert_eq!(p.state, ProfileState::Expired);
        assert_eq!(p.config_map, None);
    }

    #[test]
    fn a_node_error_fails_and_a_missing_result_fails_after_its_grace() {
        let mut p = take_at("pod=api-1,duration=10s", None, None).unwrap();
        finish(
            &mut p,
            &result("perf_event_open failed"),
            Err(String::new()),
            NOW + 12,
        );
        assert_eq!(p.state, ProfileState::Failed);
        assert!(p.message.contains("perf_event_open"));

        let mut p = take_at("pod=api-1,duration=10s", None, None).unwrap();
        assert!(!age(&mut p, NOW + 10 + 60));
        assert_eq!(next_check(&p, NOW), Some(Duration::from_secs(71)));
        assert!(age(&mut p, NOW + 10 + 61));
        assert_eq!(p.state, ProfileState::Failed);
        assert!(
            p.message.contains("no result from node \"n1\""),
            "{}",
            p.message
        );
    }
}
