//! OOM kills as the kernel decides them (`rw_oom_kill` in `ebpf/src/mem.bpf.h`), each
//! with the verdicts this agent listed for the killed process or its container before it:
//! what lets a prediction be graded against what happened (the operator does, per watch,
//! at the watch's own minimum confidence).

use std::{collections::HashMap, sync::Arc};

use serde::Serialize;

use super::Attribution;
use crate::leak::SeriesKey;

/// One listed verdict: when (Unix ms), how sure, and the times to OOM it gave.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Prediction {
    pub ts_ms: i64,
    pub confidence: u8,
    pub time_to_oom_secs: Option<f64>,
    pub time_to_oom_low_secs: Option<f64>,
}

/// An OOM kill and what was predicted for its victim.
#[derive(Clone, Debug, Serialize)]
pub struct OomKill {
    /// When the kernel chose the victim (Unix epoch, ns).
    pub ts_ns: u64,
    pub pid: u32,
    /// The victim's resident size when it was chosen.
    pub rss_bytes: u64,
    /// True when the node ran out of memory; false when a memory cgroup (a container's or
    /// a pod's limit) reached its limit.
    pub system_wide: bool,
    /// The cgroup whose limit was reached (path in the hierarchy), when known.
    pub limit_cgroup: Option<String>,
    /// What the killer measured against: that cgroup's limit, or the node's RAM + swap.
    pub limit_bytes: u64,
    /// The verdicts listed for the victim's container (or, with no container-level
    /// series, the process) before the kill, oldest first; empty: nothing was predicted.
    pub predictions: Vec<Prediction>,
    #[serde(flatten)]
    pub who: Arc<Attribution>,
}

/// Verdicts kept per series: one per second while a leak is listed would be an hour's
/// worth in 3,600; thinned as the series' own points are (see [`thin`]), so a trail
/// holds at most twice this (`MAX_PREDICTIONS_PER_KILL` in the protocol).
pub const MAX_PREDICTIONS: usize = 32;

/// The listed verdicts of every series, until its process exits or its series ends.
#[derive(Default)]
pub struct Trails {
    by_series: HashMap<SeriesKey, Vec<Prediction>>,
}

impl Trails {
    pub fn record(&mut self, key: SeriesKey, p: Prediction) {
        let t = self.by_series.entry(key).or_default();
        t.push(p);
        if t.len() > MAX_PREDICTIONS {
            thin(t);
        }
    }

    /// The trail of `key`, removed (its process was killed).
    pub fn take(&mut self, key: SeriesKey) -> Vec<Prediction> {
        self.by_series.remove(&key).unwrap_or_default()
    }

    pub fn retain(&mut self, mut keep: impl FnMut(SeriesKey) -> bool) {
        self.by_series.retain(|k, _| keep(*k));
    }
}

/// Halves the older half of a trail, but keeps each verdict more confident than every one
/// before it: a watch's first alert is the first verdict at its minimum confidence, and
/// thinning must not move it. The newer half stays whole. Past twice `MAX_PREDICTIONS`
/// (a confidence that climbed through more than about 30 distinct values) the oldest
/// after the first go: a first alert may then move by a verdict or two.
fn thin(t: &mut Vec<Prediction>) {
    let half = t.len() / 2;
    let mut best: Option<u8> = None;
    let mut out = Vec::with_capacity(t.len());
    for (i, p) in t[..half].iter().enumerate() {
        let record = best.is_none_or(|b| p.confidence > b);
        best = Some(best.map_or(p.confidence, |b| b.max(p.confidence)));
        if record || i % 2 == 0 {
            out.push(*p);
        }
    }
    out.extend_from_slice(&t[half..]);
    // Bounded whatever the series did (records alone could be 101).
    while out.len() > 2 * MAX_PREDICTIONS {
        out.remove(1);
    }
    *t = out;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn p(ts_ms: i64, confidence: u8) -> Prediction {
        Prediction {
            ts_ms,
            confidence,
            time_to_oom_secs: Some(100.0),
            time_to_oom_low_secs: Some(50.0),
        }
    }

    #[test]
    fn thinning_keeps_the_first_verdict_at_every_confidence_and_the_newest_half() {
        let mut t = Trails::default();
        let key = SeriesKey::Process { tgid: 7 };
        // Confidence climbs 40 -> 98 by 2 over the first 30 verdicts, then holds.
        for i in 0..1000i64 {
            t.record(key, p(i * 1000, (40 + 2 * i.min(29)) as u8));
        }
        let kept = t.take(key);
        assert!(kept.len() <= 2 * MAX_PREDICTIONS, "{} kept", kept.len());
        for c in (40..=98u8).step_by(2) {
            let first = kept.iter().find(|v| v.confidence >= c).unwrap();
            assert_eq!(
                first.ts_ms,
                i64::from(c - 40) / 2 * 1000,
                "first verdict at {c} moved"
            );
        }
        assert_eq!(
            kept.last().unwrap().ts_ms,
            999_000,
            "the newest verdict went"
        );
        assert!(kept.windows(2).all(|w| w[0].ts_ms < w[1].ts_ms));
        assert!(t.take(key).is_empty(), "take removes the trail");
    }
}
