//! Pre-OOM remediation: whether a leaking pod is restarted (evicted) before its predicted
//! OOM kill, and every rail that says no. Pure: the reconciler supplies the facts and
//! carries out the decision (record first, then evict).
//!
//! Rails, in order: a pod already being deleted is left alone; one decision per pod (by
//! UID); `dryRun`, and the operator's master switch when off, only report
//! (`WouldRestart`); a bare pod is never evicted (nothing would replace it); per workload a
//! cooldown after a restart, at most `maxRestarts` per `window`, and never a second pod
//! while one restart is pending. PodDisruptionBudgets are the Eviction API's to enforce:
//! a refusal is recorded as `Blocked` and retried while the prediction holds.

use std::time::Duration;

use resourcewatch_crds::{LeakEntry, RemediationAction, RemediationOutcome, RemediationRecord};

use crate::spec::WatchSettings;

/// What the reconciler knows of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    pub name: String,
    pub uid: String,
    /// `Kind/name` of the controller that replaces it (a ReplicaSet's Deployment when
    /// there is one); None for a bare pod or one whose owner would not replace it.
    pub workload: Option<String>,
    pub deleting: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Not (or no longer) a case for remediation.
    Nothing,
    /// Record `Pending`, then evict.
    Evict,
    /// Record and announce, touch nothing.
    Report {
        outcome: RemediationOutcome,
        reason: &'static str,
        message: String,
    },
}

/// A PDB refusal is retried this often while the pod still heads for an OOM kill.
pub const PDB_RETRY: Duration = Duration::from_secs(30);
/// Records kept in status (newest last).
pub const MAX_RECORDS: usize = 50;

pub fn triggered(s: &WatchSettings, leak: &LeakEntry) -> bool {
    s.action == RemediationAction::Restart
        && leak.confidence >= s.min_confidence
        && leak
            .time_to_oom_seconds
            .is_some_and(|t| t <= s.min_time_to_oom.as_secs_f64())
}

/// `now` and record times are seconds since the epoch.
pub fn decide(
    s: &WatchSettings,
    master_switch: bool,
    leak: &LeakEntry,
    pod: &PodFacts,
    history: &[(RemediationRecord, i64)],
    now: i64,
) -> Decision {
    if !triggered(s, leak) || pod.deleting {
        return Decision::Nothing;
    }
    let mine: Vec<&(RemediationRecord, i64)> = history
        .iter()
        .filter(|(r, _)| r.pod_uid == pod.uid)
        .collect();
    if let Some((last, at)) = mine.last() {
        let pdb_retry = last.action == RemediationOutcome::Blocked
            && last.reason == "PodDisruptionBudget"
            && now - at >= PDB_RETRY.as_secs() as i64;
        if !pdb_retry {
            return Decision::Nothing;
        }
    }
    let why = format!(
        "predicted OOM kill in {:.0}s (below minTimeToOOM {}s) at confidence {}",
        leak.time_to_oom_seconds.unwrap_or(0.0),
        s.min_time_to_oom.as_secs(),
        leak.confidence
    );
    if s.dry_run {
        return Decision::Report {
            outcome: RemediationOutcome::WouldRestart,
            reason: "DryRun",
            message: format!("would restart: {why} (dryRun)"),
        };
    }
    if !master_switch {
        return Decision::Report {
            outcome: RemediationOutcome::WouldRestart,
            reason: "RemediationDisabled",
            message: format!(
                "would restart: {why}, but remediation is off in the operator (--enable-remediation)"
            ),
        };
    }
    let Some(workload) = &pod.workload else {
        return Decision::Report {
            outcome: RemediationOutcome::Blocked,
            reason: "NoController",
            message: format!("not restarted: {why}, but no controller would replace this pod"),
        };
    };
    let of_workload = || {
        history
            .iter()
            .filter(move |(r, _)| r.workload.as_deref() == Some(workload.as_str()))
    };
    if of_workload().any(|(r, _)| r.action == RemediationOutcome::Pending) {
        return Decision::Report {
            outcome: RemediationOutcome::Blocked,
            reason: "RestartInProgress",
            message: format!(
                "not restarted: {why}, but another pod of {workload} is being restarted"
            ),
        };
    }
    let restarts: Vec<i64> = of_workload()
        .filter(|(r, _)| r.action == RemediationOutcome::Restarted)
        .map(|(_, at)| *at)
        .collect();
    if let Some(last) = restarts.iter().max()
        && now - last < s.cooldown.as_secs() as i64
    {
        return Decision::Report {
            outcome: RemediationOutcome::Blocked,
            reason: "Cooldown",
            message: format!(
                "not restarted: {why}, but {workload} was restarted {}s ago (cooldown {}s)",
                now - last,
                s.cooldown.as_secs()
            ),
        };
    }
    let in_window = restarts
        .iter()
        .filter(|at| now - **at < s.window.as_secs() as i64)
        .count();
    if in_window >= s.max_restarts as usize {
        return Decision::Report {
            outcome: RemediationOutcome::Blocked,
            reason: "MaxRestarts",
            message: format!(
                "not restarted: {why}, but {workload} had {in_window} restarts in the last {}s (maxRestarts {})",
                s.window.as_secs(),
                s.max_restarts
            ),
        };
    }
    Decision::Evict
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use resourcewatch_crds::ResourceWatchSpec;

    fn settings(json: serde_json::Value) -> WatchSettings {
        let spec: ResourceWatchSpec = serde_json::from_value(json).unwrap();
        WatchSettings::from_spec(&spec).unwrap()
    }

    fn restart(extra: serde_json::Value) -> WatchSettings {
        let mut r = serde_json::json!({"action": "Restart", "minTimeToOOM": "60s", "cooldown": "10m", "maxRestarts": 2, "window": "1h"});
        if let (Some(r), Some(e)) = (r.as_object_mut(), extra.as_object()) {
            r.extend(e.clone());
        }
        settings(serde_json::json!({"remediation": r}))
    }

    fn leak(tto: Option<f64>, confidence: u8) -> LeakEntry {
        LeakEntry {
            pod: "api-1".into(),
            container: "main".into(),
            node: "n".into(),
            growth_bytes_per_second: 2e6,
            confidence,
            time_to_oom_seconds: tto,
            limit_bytes: Some(128 << 20),
        }
    }

    fn pod(workload: Option<&str>) -> PodFacts {
        PodFacts {
            name: "api-1".into(),
            uid: "uid-1".into(),
            workload: workload.map(Into::into),
            deleting: false,
        }
    }

    fn record(
        uid: &str,
        action: RemediationOutcome,
        reason: &str,
        at: i64,
    ) -> (RemediationRecord, i64) {
        (
            RemediationRecord {
                pod: "p".into(),
                pod_uid: uid.into(),
                workload: Some("Deployment/api".into()),
                action,
                reason: reason.into(),
                time_to_oom_seconds: Some(30.0),
                confidence: 90,
                time: String::new(),
            },
            at,
        )
    }

    #[test]
    fn only_a_confident_prediction_below_the_threshold_triggers() {
        let s = restart(serde_json::json!({}));
        let p = pod(Some("Deployment/api"));
        assert_eq!(
            decide(&s, true, &leak(Some(30.0), 90), &p, &[], 0),
            Decision::Evict
        );
        assert_eq!(
            decide(&s, true, &leak(Some(300.0), 90), &p, &[], 0),
            Decision::Nothing,
            "not soon enough"
        );
        assert_eq!(
            decide(&s, true, &leak(Some(30.0), 40), &p, &[], 0),
            Decision::Nothing,
            "not confident"
        );
        assert_eq!(
            decide(&s, true, &leak(None, 90), &p, &[], 0),
            Decision::Nothing,
            "no prediction"
        );
        let alert = settings(
            serde_json::json!({"remediation": {"action": "Alert", "minTimeToOOM": "60s"}}),
        );
        assert_eq!(
            decide(&alert, true, &leak(Some(30.0), 90), &p, &[], 0),
            Decision::Nothing,
            "Alert never restarts"
        );
        let deleting = PodFacts {
            deleting: true,
            ..p
        };
        assert_eq!(
            decide(&s, true, &leak(Some(30.0), 90), &deleting, &[], 0),
            Decision::Nothing
        );
    }

    /// What a decision records and announces, without its message.
    fn reported(d: &Decision) -> Option<(RemediationOutcome, &'static str)> {
        match d {
            Decision::Report {
                outcome, reason, ..
            } => Some((*outcome, *reason)),
            _ => None,
        }
    }

    #[test]
    fn dry_run_the_master_switch_and_bare_pods_touch_nothing() {
        let p = pod(Some("Deployment/api"));
        let d = decide(
            &restart(serde_json::json!({"dryRun": true})),
            true,
            &leak(Some(30.0), 90),
            &p,
            &[],
            0,
        );
        assert_eq!(
            reported(&d),
            Some((RemediationOutcome::WouldRestart, "DryRun"))
        );
        let d = decide(
            &restart(serde_json::json!({})),
            false,
            &leak(Some(30.0), 90),
            &p,
            &[],
            0,
        );
        assert_eq!(
            reported(&d),
            Some((RemediationOutcome::WouldRestart, "RemediationDisabled"))
        );
        let d = decide(
            &restart(serde_json::json!({})),
            true,
            &leak(Some(30.0), 90),
            &pod(None),
            &[],
            0,
        );
        assert_eq!(
            reported(&d),
            Some((RemediationOutcome::Blocked, "NoController"))
        );
    }

    #[test]
    fn one_decision_per_pod_and_the_workload_rails() {
        let s = restart(serde_json::json!({}));
        let p = pod(Some("Deployment/api"));
        let l = leak(Some(30.0), 90);
        // Already decided for this pod: nothing more (no repeated eviction, no repeated Event).
        assert_eq!(
            decide(
                &s,
                true,
                &l,
                &p,
                &[record("uid-1", RemediationOutcome::Pending, "", 0)],
                5
            ),
            Decision::Nothing
        );
        assert_eq!(
            decide(
                &s,
                true,
                &l,
                &p,
                &[record("uid-1", RemediationOutcome::Restarted, "", 0)],
                5
            ),
            Decision::Nothing
        );
        // A PDB refusal is retried after PDB_RETRY.
        let pdb = [record(
            "uid-1",
            RemediationOutcome::Blocked,
            "PodDisruptionBudget",
            0,
        )];
        assert_eq!(decide(&s, true, &l, &p, &pdb, 10), Decision::Nothing);
        assert_eq!(decide(&s, true, &l, &p, &pdb, 31), Decision::Evict);
        // Another pod of the workload: in progress, cooldown, max restarts.
        let d = decide(
            &s,
            true,
            &l,
            &p,
            &[record("uid-0", RemediationOutcome::Pending, "", 0)],
            5,
        );
        assert_eq!(
            reported(&d).map(|(_, r)| r),
            Some("RestartInProgress"),
            "{d:?}"
        );
        let d = decide(
            &s,
            true,
            &l,
            &p,
            &[record("uid-0", RemediationOutcome::Restarted, "", 0)],
            300,
        );
        assert_eq!(reported(&d).map(|(_, r)| r), Some("Cooldown"), "{d:?}");
        assert_eq!(
            decide(
                &s,
                true,
                &l,
                &p,
                &[record("uid-0", RemediationOutcome::Restarted, "", 0)],
                700
            ),
            Decision::Evict
        );
        let two = [
            record("uid-a", RemediationOutcome::Restarted, "", 0),
            record("uid-b", RemediationOutcome::Restarted, "", 1000),
        ];
        let d = decide(&s, true, &l, &p, &two, 2000);
        assert_eq!(reported(&d).map(|(_, r)| r), Some("MaxRestarts"), "{d:?}");
        assert_eq!(
            decide(&s, true, &l, &p, &two, 3700),
            Decision::Evict,
            "the window slid"
        );
    }
}
