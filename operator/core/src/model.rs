//! The operator's vocabulary as types: condition types, Event reasons and actions.
//! Decisions compare these, never strings (a misspelt string compares false and decides
//! silently); the API sees their PascalCase names.

macro_rules! names {
    ($(#[$m:meta])* $name:ident { $($v:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name { $($v),* }
        impl $name {
            pub fn as_str(self) -> &'static str {
                match self { $($name::$v => stringify!($v)),* }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool { self.as_str() == *other }
        }
    };
}

names!(
    /// `status.conditions[].type`.
    ConditionType { Ready, Degraded, Remediation }
);

names!(
    /// Event reasons, PascalCase.
    EventReason {
        WatchReady,
        InvalidSpec,
        AgentLost,
        AgentRecovered,
        ConfigRejected,
        LeakDetected,
        LeakSiteFound,
        ThresholdCrossed,
        OOMKilled,
        Restarted,
        RestartBlocked,
        WouldRestart,
        RestartExpired,
        ProfileRefused,
        ProfileSucceeded,
        ProfileFailed,
    }
);

names!(
    /// Event actions, PascalCase.
    EventAction { Validate, Reconcile, Monitor, Configure, Predict, Remediate, Profile }
);

impl EventReason {
    /// Reasons that come from a remediation decision: their status is written at once,
    /// not at the next interval.
    pub fn is_remediation(self) -> bool {
        matches!(
            self,
            EventReason::Restarted
                | EventReason::RestartBlocked
                | EventReason::WouldRestart
                | EventReason::RestartExpired
        )
    }
}

// Condition and remediation reasons are the API's own enums (resourcewatch_crds::
// ConditionReason, RemediationReason): the schema lists them.

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_variants() {
        assert_eq!(EventReason::RestartBlocked.as_str(), "RestartBlocked");
        assert!(EventReason::LeakDetected == "LeakDetected");
        assert_eq!(ConditionType::Remediation.to_string(), "Remediation");
        assert!(EventReason::WouldRestart.is_remediation());
        assert!(!EventReason::LeakDetected.is_remediation());
    }
}
