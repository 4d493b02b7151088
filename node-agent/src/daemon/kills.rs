//! The OOM kills an agent repeats in its reports, kept so that no tenant can push out
//! another's: a kill storm of pods no watch selects (a fork bomb in a small cgroup, a
//! crash-looping job) is folded to its newest kill per cgroup and only fills the room
//! the watched pods' kills leave; a watched pod's kill, predicted or not (the
//! unpredicted-kill alert is made of it), is dropped only when its resend window ends,
//! or, past `MAX_OOM_KILLS_PER_REPORT` watched kills within that window, for a newer
//! watched one.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use resourcewatch_proto as pb;

/// Kills seen, in the order seen, each with whether a watch selects its pod.
#[derive(Default)]
pub struct Kills {
    kept: VecDeque<(Instant, pb::OomKill, bool)>,
}

/// What folds an unwatched kill with another: the same pod, container and limit.
fn cgroup_of(k: &pb::OomKill) -> (&str, &str, &str) {
    (&k.pod_uid, &k.container_id, &k.limit_cgroup)
}

impl Kills {
    /// A kill seen at `now`; `watched` when its pod is one of this node's targets.
    pub fn push(&mut self, now: Instant, kill: pb::OomKill, watched: bool) {
        if !watched {
            // Folded: only the newest kill of an unwatched cgroup is repeated.
            self.kept
                .retain(|(_, k, w)| *w || cgroup_of(k) != cgroup_of(&kill));
        }
        self.kept.push_back((now, kill, watched));
    }

    /// Drops kills older than `resend`, then keeps at most `max`: every watched kill
    /// (the newest `max` of them), then the newest unwatched ones in the room left.
    pub fn trim(&mut self, now: Instant, resend: Duration, max: usize) {
        self.kept
            .retain(|(seen, ..)| now.duration_since(*seen) <= resend);
        let watched = self.kept.iter().filter(|(_, _, w)| *w).count();
        let mut drop_watched = watched.saturating_sub(max);
        let mut drop_unwatched =
            (self.kept.len() - watched).saturating_sub(max.saturating_sub(watched));
        self.kept.retain(|(_, _, w)| {
            let drop = if *w {
                &mut drop_watched
            } else {
                &mut drop_unwatched
            };
            if *drop > 0 {
                *drop -= 1;
                false
            } else {
                true
            }
        });
    }

    /// The kills to report, oldest first.
    pub fn report(&self) -> Vec<pb::OomKill> {
        self.kept.iter().map(|(_, k, _)| k.clone()).collect()
    }

    pub fn len(&self) -> usize {
        self.kept.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kill(pod: &str, pid: u32) -> pb::OomKill {
        pb::OomKill {
            pod_uid: pod.into(),
            container_id: format!("c-{pod}"),
            pid,
            limit_cgroup: format!("/kubepods/pod{pod}"),
            ..Default::default()
        }
    }

    /// A storm of an unwatched pod's kills, before and after a watched pod's, never
    /// pushes the watched kill out; it is folded to its newest kill.
    #[test]
    fn an_unwatched_kill_storm_never_pushes_out_a_watched_kill() {
        let mut k = Kills::default();
        let t0 = Instant::now();
        let resend = Duration::from_secs(600);
        for pid in 0..500 {
            k.push(t0, kill("storm", pid), false);
            k.trim(t0, resend, 32);
        }
        k.push(t0, kill("watched", 9999), true);
        for pid in 500..1000 {
            k.push(t0, kill("storm", pid), false);
            k.trim(t0, resend, 32);
        }
        let r = k.report();
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!((r[0].pod_uid.as_str(), r[0].pid), ("watched", 9999));
        assert_eq!((r[1].pod_uid.as_str(), r[1].pid), ("storm", 999));
        // Many unwatched cgroups fill only the room left.
        for i in 0..100 {
            k.push(t0, kill(&format!("u{i}"), i), false);
        }
        k.trim(t0, resend, 32);
        let r = k.report();
        assert_eq!(r.len(), 32);
        assert!(r.iter().any(|x| x.pid == 9999));
        assert!(r.iter().any(|x| x.pod_uid == "u99"), "the newest stay");
        // Watched kills past the bound: the newest stay; and all go with their window.
        for pid in 0..40 {
            k.push(t0, kill("w", 20_000 + pid), true);
        }
        k.trim(t0, resend, 32);
        let r = k.report();
        assert_eq!(r.len(), 32);
        assert!(r.iter().all(|x| x.pod_uid == "w"));
        assert_eq!(r.last().map(|x| x.pid), Some(20_039));
        k.trim(t0 + resend + Duration::from_secs(1), resend, 32);
        assert!(k.is_empty());
    }
}
