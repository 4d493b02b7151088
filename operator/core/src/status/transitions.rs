//! The Events a status change deserves, computed against the status stored in the
//! object: a restarted operator does not repeat Events it already published.

use super::*;

/// The Events the change from `old` to `new` deserves. `rejecting`: the nodes whose
/// agents refused their configuration.
pub(super) fn transitions(
    old: Option<&ResourceWatchStatus>,
    new: &ResourceWatchStatus,
    settings: &WatchSettings,
    rejecting: &BTreeSet<&str>,
) -> Vec<EventSpec> {
    let mut out = Vec::new();
    became_ready(old, new, &mut out);
    node_transitions(old, new, rejecting, &mut out);
    leak_transitions(old, new, settings, &mut out);
    threshold_transitions(old, new, &mut out);
    oom_kill_transitions(old, new, &mut out);
    out
}

/// One `OOMKilled` Event per kill the stored status did not hold yet.
pub(super) fn oom_kill_transitions(
    old: Option<&ResourceWatchStatus>,
    new: &ResourceWatchStatus,
    out: &mut Vec<EventSpec>,
) {
    let known: BTreeSet<(&str, &str, u32)> = old
        .map(|o| {
            o.oom_kills
                .iter()
                .map(|k| (k.time.as_str(), k.node.as_str(), k.pid))
                .collect()
        })
        .unwrap_or_default();
    // Only kills newer than every stored one: a stored list cut to its bound must not
    // announce again the older kills an agent still repeats.
    let newest_known = old
        .and_then(|o| o.oom_kills.last())
        .map(|k| k.time.as_str());
    for k in &new.oom_kills {
        if known.contains(&(k.time.as_str(), k.node.as_str(), k.pid))
            || newest_known.is_some_and(|t| k.time.as_str() < t)
        {
            continue;
        }
        out.push(
            ev(
                true,
                EventReason::OOMKilled,
                EventAction::Monitor,
                crate::oom::note(k),
                None,
            )
            .about(Subject::container(&k.pod, &k.container)),
        );
    }
}

pub(super) fn became_ready(
    old: Option<&ResourceWatchStatus>,
    new: &ResourceWatchStatus,
    out: &mut Vec<EventSpec>,
) {
    let was_ready = old
        .and_then(|o| find(&o.conditions, ConditionType::Ready))
        .is_some_and(|c| c.status == ConditionStatus::True);
    if let Some(r) = find(&new.conditions, ConditionType::Ready)
        && r.status == ConditionStatus::True
        && !was_ready
    {
        out.push(ev(
            false,
            EventReason::WatchReady,
            EventAction::Reconcile,
            r.message.clone(),
            None,
        ));
    }
}

/// Agents lost and recovered, and configurations refused (once per message).
pub(super) fn node_transitions(
    old: Option<&ResourceWatchStatus>,
    new: &ResourceWatchStatus,
    rejecting: &BTreeSet<&str>,
    out: &mut Vec<EventSpec>,
) {
    let old_nodes: BTreeMap<&str, bool> = old
        .map(|o| {
            o.nodes
                .iter()
                .map(|n| (n.name.as_str(), n.reporting))
                .collect()
        })
        .unwrap_or_default();
    for n in &new.nodes {
        match (old_nodes.get(n.name.as_str()), n.reporting) {
            (Some(true) | None, false) => out.push(ev(
                true,
                EventReason::AgentLost,
                EventAction::Monitor,
                format!("the agent on node {} stopped reporting: its pods' figures are missing from this status", n.name),
                None,
            ).about(Subject::Node(n.name.clone()))),
            (Some(false), true) => out.push(ev(
                false,
                EventReason::AgentRecovered,
                EventAction::Monitor,
                format!("the agent on node {} reports again", n.name),
                None,
            ).about(Subject::Node(n.name.clone()))),
            _ => {}
        }
        let old_msg = old
            .and_then(|o| o.nodes.iter().find(|m| m.name == n.name))
            .map(|m| m.message.as_str())
            .unwrap_or("");
        if rejecting.contains(n.name.as_str()) && n.message != old_msg {
            out.push(
                ev(
                    true,
                    EventReason::ConfigRejected,
                    EventAction::Configure,
                    format!("node {}: {}", n.name, n.message),
                    None,
                )
                .about(Subject::Node(n.name.clone())),
            );
        }
    }
}

/// A new leak (on the watch, and on its pod when the watch may act on it), and its
/// growth site once it is found.
pub(super) fn leak_transitions(
    old: Option<&ResourceWatchStatus>,
    new: &ResourceWatchStatus,
    settings: &WatchSettings,
    out: &mut Vec<EventSpec>,
) {
    // Old leaks, and whether their growth site was announced then.
    let old_leaks: BTreeMap<(&str, &str), bool> = old
        .map(|o| {
            o.leaks
                .iter()
                .map(|l| {
                    (
                        (l.pod.as_str(), l.container.as_str()),
                        announced_site(l).is_some(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    for l in &new.leaks {
        let who = format!(
            "{}/{}",
            l.pod,
            if l.container.is_empty() {
                "?"
            } else {
                &l.container
            }
        );
        let site = announced_site(l);
        match old_leaks.get(&(l.pod.as_str(), l.container.as_str())) {
            // Already announced; the site came later (it is captured once the leak is
            // found): say where it grows, once. Its own reason: the Event recorder merges
            // Events of one reason about one object into a series that keeps the first
            // note, so a second LeakDetected would never show the site.
            Some(false) if site.is_some() => {
                out.push(
                    ev(
                        true,
                        EventReason::LeakSiteFound,
                        EventAction::Predict,
                        format!("{who} grows at {}", site.unwrap_or_default()),
                        None,
                    )
                    .about(Subject::container(&l.pod, &l.container)),
                );
                continue;
            }
            Some(_) => continue,
            None => {}
        }
        let note = leak_note(&who, l, site.as_deref());
        out.push(
            ev(
                true,
                EventReason::LeakDetected,
                EventAction::Predict,
                note.clone(),
                None,
            )
            .about(Subject::container(&l.pod, &l.container)),
        );
        if settings.action != resourcewatch_crds::RemediationAction::None {
            out.push(
                ev(
                    true,
                    EventReason::LeakDetected,
                    EventAction::Predict,
                    note,
                    Some(l.pod.clone()),
                )
                .about(Subject::container(&l.pod, &l.container)),
            );
        }
    }
}

/// A new leak as its Event says it.
pub(super) fn leak_note(who: &str, l: &LeakEntry, site: Option<&str>) -> String {
    format!(
        "{who} grows {}/s (confidence {}){}{}{}",
        format_bytes(l.growth_bytes_per_second.max(0.0) as u64),
        l.confidence,
        l.time_to_oom_seconds
            .map(|s| format!(
                ", predicted OOM kill in {}",
                format_duration(std::time::Duration::from_secs_f64(s.max(0.0)))
            ))
            .unwrap_or_default(),
        l.limit_bytes
            .map(|b| format!(" (limit {})", format_bytes(b)))
            .unwrap_or_default(),
        site.map(|s| format!(", at {s}")).unwrap_or_default(),
    )
}

/// A threshold newly crossed, per container and metric.
pub(super) fn threshold_transitions(
    old: Option<&ResourceWatchStatus>,
    new: &ResourceWatchStatus,
    out: &mut Vec<EventSpec>,
) {
    let old_ex: BTreeSet<(&str, &str, Metric)> = old
        .map(|o| {
            o.exceeding
                .iter()
                .map(|e| (e.pod.as_str(), e.container.as_str(), e.metric))
                .collect()
        })
        .unwrap_or_default();
    for e in &new.exceeding {
        if old_ex.contains(&(e.pod.as_str(), e.container.as_str(), e.metric)) {
            continue;
        }
        let (what, field) = match e.metric {
            Metric::Cpu => (
                format!("CPU {}% of a core, above {}%", e.value, e.threshold),
                "spec.thresholds.cpuPercent",
            ),
            Metric::Memory => (
                format!("memory {}% of its limit, above {}%", e.value, e.threshold),
                "spec.thresholds.memoryPercentOfLimit",
            ),
        };
        out.push(
            ev(
                true,
                EventReason::ThresholdCrossed,
                EventAction::Monitor,
                format!("{}/{}: {what}", e.pod, e.container),
                None,
            )
            .about(Subject::container(&e.pod, &e.container))
            .on_field(field),
        );
    }
}

/// The top growth site worth an Event: one that names a function. A top site of only
/// `[libc.so.6]` / `[unknown]` frames (a program's start-up heap growth in glibc's
/// unwalkable code, named first while the capture is young) says nothing a user can act
/// on, and the Event recorder keeps a series' first note: announcing it would hide the
/// leak's real site when it takes the top a few seconds later.
pub fn announced_site(l: &LeakEntry) -> Option<String> {
    l.growth_sites
        .first()
        .filter(|g| g.frames.iter().any(|f| !f.starts_with('[')))
        .map(site_note)
}

/// Frames of a growth site an Event shows: enough to pass the allocator's own frames
/// (`sysmalloc < _int_malloc < __libc_malloc`, a memset) and reach the code that grows.
pub(super) const NOTE_FRAMES: usize = 6;

/// A growth site as an Event says it: its first frames, leaf first, and its share.
pub(super) fn site_note(site: &GrowthSiteEntry) -> String {
    let mut frames: Vec<&str> = site
        .frames
        .iter()
        .take(NOTE_FRAMES)
        .map(String::as_str)
        .collect();
    if site.frames.len() > NOTE_FRAMES {
        frames.push("...");
    }
    format!(
        "{} ({:.0}% of its growth)",
        frames.join(" < "),
        site.percent
    )
}
