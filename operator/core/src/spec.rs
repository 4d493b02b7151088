//! What the CRD schema cannot check: durations' values (the interval floor), selector
//! semantics, label syntax. A spec that fails here is reported as `Ready=False` with
//! reason `InvalidSpec` and the message below; nothing is pushed to the nodes for it.

pub use resourcewatch_units::{format_duration, parse_duration};
use std::{collections::BTreeMap, time::Duration};

use resourcewatch_crds::{
    LabelSelector, Metric, PodSelector, RemediationAction, ResourceWatchSpec, SelectorOperator,
};

/// Status writes (and so the agents' report cadence it drives) never go below this: a
/// thousand watches at 1 s would be a thousand API writes per second.
pub const MIN_INTERVAL: Duration = Duration::from_secs(5);

/// A spec the operator can act on, with durations parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchSettings {
    pub selector: LabelSelector,
    /// `selector`, to match pods with.
    pub pods: PodSelector,
    pub top_k: u32,
    pub cpu: bool,
    pub memory: bool,
    pub interval: Duration,
    pub cpu_threshold: Option<f64>,
    pub memory_threshold: Option<f64>,
    pub leaks_enabled: bool,
    pub min_confidence: u8,
    pub horizon: Duration,
    /// A leak is listed once it has grown at leak level this long.
    pub min_growing: Duration,
    pub action: RemediationAction,
    pub min_time_to_oom: Duration,
    pub cooldown: Duration,
    pub max_restarts: u32,
    pub window: Duration,
    pub dry_run: bool,
}

/// The admin's floors for `Restart` watches (operator flags): a watch asking for less
/// caution is `Ready=False` and never acts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Floors {
    pub min_confidence: u8,
    pub min_cooldown: Duration,
    pub min_window: Duration,
    pub max_restarts: u32,
}

impl Floors {
    /// No floor at all (tests of the rails themselves).
    pub fn none() -> Self {
        Self {
            min_confidence: 0,
            min_cooldown: Duration::ZERO,
            min_window: Duration::ZERO,
            max_restarts: u32::MAX,
        }
    }
}

impl Default for Floors {
    /// The operator's defaults.
    fn default() -> Self {
        Self {
            min_confidence: 60,
            min_cooldown: Duration::from_secs(5 * 60),
            min_window: Duration::from_secs(30 * 60),
            max_restarts: 10,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("remediation is below the operator's floors: {0}")]
    BelowFloor(String),
    #[error("{field}: {value:?} is not a duration such as 30s, 1m30s or 500ms")]
    Duration { field: &'static str, value: String },
    #[error("interval {0:?} is below the 5s minimum that protects the API server")]
    IntervalTooShort(String),
    #[error(
        "topK {0} is outside {min}..{max}",
        min = resourcewatch_proto::TOP_K_MIN,
        max = resourcewatch_proto::TOP_K_MAX
    )]
    TopK(u32),
    #[error("selector: {0}")]
    Selector(SelectorError),
}

/// Whether `k` is a K the API allows (`resourcewatch_proto::TOP_K_MIN..=TOP_K_MAX`).
pub fn top_k_allowed(k: u32) -> bool {
    (resourcewatch_proto::TOP_K_MIN..=resourcewatch_proto::TOP_K_MAX).contains(&k)
}

impl WatchSettings {
    pub fn from_spec(spec: &ResourceWatchSpec, floors: &Floors) -> Result<Self, SpecError> {
        let interval = duration("interval", &spec.interval)?;
        if interval < MIN_INTERVAL {
            return Err(SpecError::IntervalTooShort(spec.interval.clone()));
        }
        // The schema bounds topK too; an older CRD version in the cluster may not.
        if !top_k_allowed(spec.top_k) {
            return Err(SpecError::TopK(spec.top_k));
        }
        validate_selector(&spec.selector).map_err(SpecError::Selector)?;
        let r = &spec.remediation;
        let settings = Self {
            selector: spec.selector.clone(),
            pods: pod_selector(&spec.selector),
            top_k: spec.top_k,
            cpu: spec.metrics.contains(&Metric::Cpu),
            memory: spec.metrics.contains(&Metric::Memory),
            interval,
            cpu_threshold: spec.thresholds.cpu_percent,
            memory_threshold: spec.thresholds.memory_percent_of_limit,
            leaks_enabled: spec.leak_detection.enabled,
            min_confidence: spec.leak_detection.min_confidence.min(100),
            horizon: duration("leakDetection.horizon", &spec.leak_detection.horizon)?,
            min_growing: duration(
                "leakDetection.minGrowingTime",
                &spec.leak_detection.min_growing_time,
            )?,
            action: r.action,
            min_time_to_oom: duration("remediation.minTimeToOOM", &r.min_time_to_oom)?,
            cooldown: duration("remediation.cooldown", &r.cooldown)?,
            max_restarts: r.max_restarts,
            window: duration("remediation.window", &r.window)?,
            dry_run: r.dry_run,
        };
        settings.check_floors(floors)?;
        Ok(settings)
    }

    fn check_floors(&self, f: &Floors) -> Result<(), SpecError> {
        if self.action != RemediationAction::Restart {
            return Ok(());
        }
        let mut below = Vec::new();
        if self.min_confidence < f.min_confidence {
            below.push(format!(
                "leakDetection.minConfidence {} < {}",
                self.min_confidence, f.min_confidence
            ));
        }
        if self.cooldown < f.min_cooldown {
            below.push(format!(
                "remediation.cooldown {} < {}",
                format_duration(self.cooldown),
                format_duration(f.min_cooldown)
            ));
        }
        if self.window < f.min_window {
            below.push(format!(
                "remediation.window {} < {}",
                format_duration(self.window),
                format_duration(f.min_window)
            ));
        }
        if self.max_restarts > f.max_restarts {
            below.push(format!(
                "remediation.maxRestarts {} > {}",
                self.max_restarts, f.max_restarts
            ));
        }
        if below.is_empty() {
            Ok(())
        } else {
            Err(SpecError::BelowFloor(below.join(", ")))
        }
    }
}

#[cfg(test)]
impl WatchSettings {
    fn from_spec_default(spec: &ResourceWatchSpec) -> Result<Self, SpecError> {
        Self::from_spec(spec, &Floors::default())
    }
}

pub fn duration(field: &'static str, value: &str) -> Result<Duration, SpecError> {
    parse_duration(value).map_err(|_| SpecError::Duration {
        field,
        value: value.into(),
    })
}

/// A label selector the API server would refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("label key {0:?}: prefix must be a DNS subdomain (lowercase, digits, '-', '.')")]
    KeyPrefix(String),
    #[error(
        "label key {0:?}: name must be 1-63 characters of [A-Za-z0-9_.-], starting and ending alphanumeric"
    )]
    KeyName(String),
    #[error(
        "label value {0:?} must be at most 63 characters of [A-Za-z0-9_.-], starting and ending alphanumeric"
    )]
    Value(String),
    #[error("operator {0} needs at least one value")]
    NeedsValues(String),
    #[error("operator {0} takes no values")]
    TakesNoValues(String),
    /// Where in the selector: `matchLabels[key]` or `matchExpressions[i]`.
    #[error("{at}: {problem}")]
    At {
        at: String,
        problem: Box<SelectorError>,
    },
}

/// Label keys and values as Kubernetes defines them (a DNS-1123 subdomain prefix, a name
/// of at most 63 characters); the schema only bounds their length.
pub fn validate_selector(sel: &LabelSelector) -> Result<(), SelectorError> {
    let at = |at: String| {
        move |e: SelectorError| SelectorError::At {
            at,
            problem: Box::new(e),
        }
    };
    for (k, v) in &sel.match_labels {
        valid_key(k)?;
        valid_value(v).map_err(at(format!("matchLabels[{k}]")))?;
    }
    for (i, r) in sel.match_expressions.iter().enumerate() {
        let here = format!("matchExpressions[{i}]");
        valid_key(&r.key).map_err(at(here.clone()))?;
        let op = format!("{:?}", r.operator);
        match r.operator {
            SelectorOperator::In | SelectorOperator::NotIn if r.values.is_empty() => {
                return Err(at(here)(SelectorError::NeedsValues(op)));
            }
            SelectorOperator::Exists | SelectorOperator::DoesNotExist if !r.values.is_empty() => {
                return Err(at(here)(SelectorError::TakesNoValues(op)));
            }
            _ => {}
        }
        for v in &r.values {
            valid_value(v).map_err(at(here.clone()))?;
        }
    }
    Ok(())
}

fn valid_key(key: &str) -> Result<(), SelectorError> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(SelectorError::KeyPrefix(key.to_owned()));
        }
    }
    if name.is_empty() || name.len() > 63 || !is_label_name(name) {
        return Err(SelectorError::KeyName(key.to_owned()));
    }
    Ok(())
}

fn valid_value(v: &str) -> Result<(), SelectorError> {
    if v.is_empty() || (v.len() <= 63 && is_label_name(v)) {
        Ok(())
    } else {
        Err(SelectorError::Value(v.to_owned()))
    }
}

fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    b.iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// The watch's selector, compiled to match pods with (kube's `Selector` semantics, see
/// `LabelSelector::compile`). Built once per spec; `validate_selector` has already refused
/// what the API server would.
pub fn pod_selector(sel: &LabelSelector) -> PodSelector {
    sel.compile()
}

/// Whether a pod with these labels is selected.
pub fn selects(sel: &PodSelector, labels: &BTreeMap<String, String>) -> bool {
    sel.matches(labels)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use resourcewatch_crds::LabelSelectorRequirement;

    fn spec(json: serde_json::Value) -> ResourceWatchSpec {
        serde_json::from_value(json).expect("spec parses")
    }

    #[test]
    fn the_interval_floor_is_enforced_with_a_readable_reason() {
        let e = WatchSettings::from_spec_default(&spec(serde_json::json!({"interval": "1s"})));
        assert_eq!(e, Err(SpecError::IntervalTooShort("1s".into())));
        assert!(e.unwrap_err().to_string().contains("5s minimum"));
        let ok = WatchSettings::from_spec_default(&spec(serde_json::json!({"interval": "5s"})))
            .expect("5s is allowed");
        assert_eq!(ok.interval, Duration::from_secs(5));
        assert!(ok.cpu && ok.memory);
    }

    #[test]
    fn selector_semantics_the_schema_cannot_express_are_refused() {
        let e = WatchSettings::from_spec_default(&spec(serde_json::json!({"selector": {
            "matchExpressions": [{"key": "app", "operator": "In"}]}})))
        .unwrap_err();
        assert!(e.to_string().contains("needs at least one value"), "{e}");
        let e = WatchSettings::from_spec_default(&spec(serde_json::json!({"selector": {
            "matchLabels": {"bad key!": "x"}}})))
        .unwrap_err();
        assert!(e.to_string().contains("label key"), "{e}");
        let e = WatchSettings::from_spec_default(&spec(serde_json::json!({"selector": {
            "matchLabels": {"app": "-x"}}})))
        .unwrap_err();
        assert!(e.to_string().contains("label value"), "{e}");
        assert!(
            WatchSettings::from_spec_default(&spec(serde_json::json!({"selector": {
                "matchLabels": {"app.kubernetes.io/name": "api"}}})))
            .is_ok()
        );
    }

    #[test]
    fn a_restart_watch_below_the_floors_is_refused_with_each_floor_named() {
        let e = WatchSettings::from_spec_default(&spec(serde_json::json!({
            "leakDetection": {"minConfidence": 0},
            "remediation": {"action": "Restart", "cooldown": "0s", "window": "1ms", "maxRestarts": 100}})))
        .unwrap_err();
        let m = e.to_string();
        for part in [
            "minConfidence 0 < 60",
            "cooldown 0s < 5m",
            "window 1ms < 30m",
            "maxRestarts 100 > 10",
        ] {
            assert!(m.contains(part), "{m}");
        }
        // The same numbers are fine for a watch that never evicts.
        assert!(
            WatchSettings::from_spec_default(&spec(serde_json::json!({
            "leakDetection": {"minConfidence": 0},
            "remediation": {"action": "Alert", "cooldown": "0s"}})))
            .is_ok()
        );
    }

    #[test]
    fn selectors_match_like_kubernetes() {
        let labels: BTreeMap<String, String> = [("app", "api"), ("tier", "web")]
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        let mut sel = LabelSelector::default();
        assert!(selects(&pod_selector(&sel), &labels), "empty selects all");
        sel.match_labels.insert("app".into(), "api".into());
        assert!(selects(&pod_selector(&sel), &labels));
        sel.match_expressions.push(LabelSelectorRequirement {
            key: "tier".into(),
            operator: SelectorOperator::NotIn,
            values: vec!["web".into()],
        });
        assert!(!selects(&pod_selector(&sel), &labels));
        sel.match_expressions[0].operator = SelectorOperator::In;
        assert!(selects(&pod_selector(&sel), &labels));
        sel.match_expressions.push(LabelSelectorRequirement {
            key: "canary".into(),
            operator: SelectorOperator::DoesNotExist,
            values: vec![],
        });
        assert!(selects(&pod_selector(&sel), &labels));
        sel.match_expressions[1].operator = SelectorOperator::Exists;
        assert!(!selects(&pod_selector(&sel), &labels));
    }
}
