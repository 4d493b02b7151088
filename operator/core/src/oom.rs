//! OOM kills of a watch's containers, as their agents saw them in the kernel, graded
//! against what was predicted for each: whether a leak was listed at the watch's
//! `minConfidence` before the kill, how long before, how far off its time to OOM was at
//! the first listing and half-way to the kill, and whether its lower bound held. Pure:
//! the status step feeds it the reports and the stored kills.

use std::collections::BTreeMap;

use resourcewatch_crds::{MAX_STATUS_OOM_KILLS, OomKillEntry, OomScope};
use resourcewatch_proto as pb;

use crate::status::SelectedPod;

/// A kill as the status keeps it, graded at `min_confidence`.
pub fn grade(min_confidence: u8, node: &str, pod: &SelectedPod, k: &pb::OomKill) -> OomKillEntry {
    let kill_ms = k.timestamp_unix_ms;
    // Listings at the watch's threshold, before the kill (a clock step cannot make a
    // listing after the kill count as a warning).
    let alerts: Vec<&pb::Prediction> = k
        .predictions
        .iter()
        .filter(|p| p.confidence >= u32::from(min_confidence) && p.timestamp_unix_ms <= kill_ms)
        .collect();
    let eta_error = |p: &pb::Prediction| {
        p.time_to_oom_seconds
            .map(|t| round1((p.timestamp_unix_ms - kill_ms) as f64 / 1000.0 + t))
    };
    let first = alerts.first().copied();
    let halfway = first.and_then(|f| {
        let mid = f.timestamp_unix_ms + (kill_ms - f.timestamp_unix_ms) / 2;
        alerts
            .iter()
            .filter(|p| p.time_to_oom_seconds.is_some())
            .min_by_key(|p| (p.timestamp_unix_ms - mid).abs())
            .copied()
    });
    let bounds: Vec<bool> = alerts
        .iter()
        .filter_map(|p| {
            // Held: the kill came no earlier than the earliest it was said to be likely
            // (a second for the listings' whole-second rounding).
            p.time_to_oom_low_seconds
                .map(|low| p.timestamp_unix_ms as f64 + low * 1000.0 <= kill_ms as f64 + 1000.0)
        })
        .collect();
    let container = pod
        .containers
        .get(&k.container_id)
        .or_else(|| pod.exited_containers.get(&k.container_id))
        .cloned()
        .unwrap_or_default();
    OomKillEntry {
        pod: pod.name.clone(),
        container,
        node: node.to_owned(),
        time: rfc3339_ms(kill_ms),
        pid: k.pid,
        command: cut(&k.command, 64),
        scope: if k.system_wide {
            OomScope::System
        } else {
            OomScope::Cgroup
        },
        limit_bytes: (k.limit_bytes > 0).then_some(k.limit_bytes),
        memory_bytes: k.memory_bytes,
        predicted: first.is_some(),
        warned_seconds_before: first
            .map(|f| round1((kill_ms - f.timestamp_unix_ms) as f64 / 1000.0)),
        eta_error_at_first_alert_seconds: first.and_then(eta_error),
        eta_error_at_halfway_seconds: halfway.and_then(eta_error),
        lower_bound_held: (!bounds.is_empty()).then(|| bounds.iter().all(|&b| b)),
    }
}

/// The stored kills and the reported ones of the selected pods, each once (by node, pid
/// and time: an agent repeats a kill in its reports for ten minutes; the stored grade
/// wins), oldest first, the newest `MAX_STATUS_OOM_KILLS` kept.
pub fn merge<'a>(
    min_confidence: u8,
    stored: &[OomKillEntry],
    reported: impl Iterator<Item = (&'a str, &'a pb::OomKill)>,
    by_uid: &crate::status::ByUid<'_>,
) -> Vec<OomKillEntry> {
    let key = |e: &OomKillEntry| (e.time.clone(), e.node.clone(), e.pid);
    let mut all: BTreeMap<(String, String, u32), OomKillEntry> =
        stored.iter().map(|e| (key(e), e.clone())).collect();
    for (node, k) in reported {
        // A node speaks for the pods it runs only.
        let Some(pod) = by_uid
            .get(k.pod_uid.as_str())
            .filter(|p| p.node.as_deref() == Some(node))
        else {
            continue;
        };
        let e = grade(min_confidence, node, pod, k);
        all.entry(key(&e)).or_insert(e);
    }
    let mut kills: Vec<OomKillEntry> = all.into_values().collect();
    if kills.len() > MAX_STATUS_OOM_KILLS {
        kills.drain(..kills.len() - MAX_STATUS_OOM_KILLS);
    }
    kills
}

/// "2 (1 predicted)", or None without kills.
pub fn summary(kills: &[OomKillEntry]) -> Option<String> {
    (!kills.is_empty()).then(|| {
        format!(
            "{} ({} predicted)",
            kills.len(),
            kills.iter().filter(|k| k.predicted).count()
        )
    })
}

/// What an `OOMKilled` Event says of a kill.
pub fn note(k: &OomKillEntry) -> String {
    let who = if k.container.is_empty() {
        format!("{} (pid {} {})", k.pod, k.pid, k.command)
    } else {
        format!("{}/{} (pid {} {})", k.pod, k.container, k.pid, k.command)
    };
    let limit = match (k.scope, k.limit_bytes) {
        (OomScope::System, _) => "the node ran out of memory".to_owned(),
        (OomScope::Cgroup, Some(b)) => {
            format!(
                "its memory limit {} was reached",
                resourcewatch_units::format_bytes(b)
            )
        }
        (OomScope::Cgroup, None) => "its memory limit was reached".to_owned(),
    };
    let graded = match k.warned_seconds_before {
        Some(s) => {
            let mut g = format!("predicted {s:.0} s ahead");
            if let Some(e) = k.eta_error_at_first_alert_seconds {
                g.push_str(&format!(
                    " (time to OOM off by {e:+.0} s at the first warning)"
                ));
            }
            g
        }
        None => "not predicted".to_owned(),
    };
    format!("{who} was OOM-killed on {}: {limit}; {graded}", k.node)
}

pub(crate) fn rfc3339_ms(unix_ms: i64) -> String {
    jiff::Timestamp::from_millisecond(unix_ms)
        .map(|t| format!("{t:.3}"))
        .unwrap_or_default()
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn cut(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod() -> SelectedPod {
        SelectedPod {
            uid: "u1".into(),
            name: "api-1".into(),
            node: Some("n1".into()),
            containers: [("cid-new".to_string(), "app".to_string())].into(),
            exited_containers: [("cid-old".to_string(), "app".to_string())].into(),
            created: None,
        }
    }

    fn p(at_s: i64, confidence: u32, tto: f64, low: f64) -> pb::Prediction {
        pb::Prediction {
            timestamp_unix_ms: at_s * 1000,
            confidence,
            time_to_oom_seconds: Some(tto),
            time_to_oom_low_seconds: Some(low),
        }
    }

    fn kill(at_s: i64, predictions: Vec<pb::Prediction>) -> pb::OomKill {
        pb::OomKill {
            pod_uid: "u1".into(),
            container_id: "cid-old".into(),
            pid: 42,
            command: "leak".into(),
            timestamp_unix_ms: at_s * 1000,
            system_wide: false,
            limit_bytes: 128 << 20,
            memory_bytes: 127 << 20,
            predictions,
            limit_cgroup: String::new(),
        }
    }

    #[test]
    fn a_kill_is_graded_at_the_watchs_own_confidence() {
        // Listed at 50 from t=100, at 80 from t=120; killed at t=200.
        let k = kill(
            200,
            vec![
                p(100, 50, 90.0, 60.0),
                p(120, 80, 85.0, 70.0),
                p(160, 95, 38.0, 30.0),
                p(190, 99, 9.0, 8.0),
            ],
        );
        let g = grade(80, "n1", &pod(), &k);
        assert!(g.predicted);
        assert_eq!(g.container, "app", "named from the exited container's id");
        assert_eq!(g.scope, OomScope::Cgroup);
        assert_eq!(g.warned_seconds_before, Some(80.0));
        // First alert at 120 said 85 s: 205, 5 s late.
        assert_eq!(g.eta_error_at_first_alert_seconds, Some(5.0));
        // Half-way (160) said 38 s: 198, 2 s early.
        assert_eq!(g.eta_error_at_halfway_seconds, Some(-2.0));
        assert_eq!(g.lower_bound_held, Some(true));
        assert_eq!(g.time, "1970-01-01T00:03:20.000Z");
        // At 50, the first alert is 20 s earlier and its lower bound (100 + 60 = 160 <= 200) held.
        assert_eq!(
            grade(50, "n1", &pod(), &k).warned_seconds_before,
            Some(100.0)
        );
        // At 100, nothing was listed: a miss.
        let miss = grade(100, "n1", &pod(), &k);
        assert!(!miss.predicted);
        assert_eq!(miss.warned_seconds_before, None);
        assert_eq!(miss.lower_bound_held, None);
        assert!(note(&miss).contains("not predicted"), "{}", note(&miss));
        assert!(note(&g).contains("predicted 80 s ahead"), "{}", note(&g));
    }

    #[test]
    fn a_lower_bound_past_the_kill_did_not_hold() {
        let k = kill(200, vec![p(150, 90, 80.0, 60.0)]);
        assert_eq!(grade(60, "n1", &pod(), &k).lower_bound_held, Some(false));
    }

    #[test]
    fn a_kill_repeated_in_reports_is_kept_once_and_the_stored_grade_wins() {
        let pod = pod();
        let by_uid: crate::status::ByUid<'_> = [("u1", &pod)].into_iter().collect();
        let k = kill(200, vec![p(150, 90, 60.0, 40.0)]);
        let once = merge(60, &[], [("n1", &k)].into_iter(), &by_uid);
        assert_eq!(once.len(), 1);
        // The same kill again, and a kill of a pod the watch does not select.
        let mut other = kill(300, vec![]);
        other.pod_uid = "not-selected".into();
        let mut stored = once.clone();
        stored[0].warned_seconds_before = Some(1.0);
        let twice = merge(
            60,
            &stored,
            [("n1", &k), ("n1", &other)].into_iter(),
            &by_uid,
        );
        assert_eq!(twice.len(), 1);
        assert_eq!(twice[0].warned_seconds_before, Some(1.0));
        assert_eq!(summary(&twice).as_deref(), Some("1 (1 predicted)"));
        // Bounded, newest kept.
        let many: Vec<pb::OomKill> = (0..30).map(|i| kill(1000 + i, vec![])).collect();
        let kept = merge(60, &twice, many.iter().map(|k| ("n1", k)), &by_uid);
        assert_eq!(kept.len(), MAX_STATUS_OOM_KILLS);
        assert_eq!(kept.last().unwrap().time, rfc3339_ms(1029 * 1000));
    }
}
