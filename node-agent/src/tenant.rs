//! Whose a process is, for sharing what the node has little of (growth-capture slots,
//! JVM attach requests, the reader's time): its pod's namespace, as Kubernetes draws
//! tenancy, so that one namespace's many pods cannot take every share.
//!
//! The namespace of a watched pod comes with the operator's configuration; any other
//! pod's from the kubelet's pod log directories (`/var/log/pods/<namespace>_<name>_<uid>`,
//! which the kubelet makes for every pod it runs and which no tenant writes). A pod found
//! in neither is its own tenant, a process outside Kubernetes its cgroup's, and the
//! node's own processes one tenant together.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Mutex, RwLock},
    time::{Duration, Instant},
};

/// How often the pod log directory is listed again for a pod not found in it.
const RESCAN_EVERY: Duration = Duration::from_secs(10);
/// Pods remembered from the log directory (a node runs at most a few hundred).
const MAX_LISTED: usize = 8192;

/// A tenant: `ns:<namespace>`, `pod:<uid>`, `cgroup:<path>` or `node`.
pub type Tenant = String;

struct Listed {
    by_uid: Option<HashMap<String, String>>,
    at: Option<Instant>,
}

static WATCHED: RwLock<Option<HashMap<String, String>>> = RwLock::new(None);
static LISTED: Mutex<Listed> = Mutex::new(Listed {
    by_uid: None,
    at: None,
});

fn pod_logs_dir() -> PathBuf {
    std::env::var_os("RESOURCEWATCH_POD_LOGS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/log/pods"))
}

/// The watched pods' namespaces, by pod UID (from each configuration the agent applies).
pub fn set_watched<'a>(pods: impl IntoIterator<Item = (&'a str, &'a str)>) {
    let map = pods
        .into_iter()
        .map(|(uid, ns)| (uid.to_owned(), ns.to_owned()))
        .collect();
    *WATCHED.write().unwrap_or_else(|e| e.into_inner()) = Some(map);
}

/// The namespace of the pod `uid`, when known.
pub fn namespace_of(uid: &str) -> Option<String> {
    if let Some(ns) = WATCHED
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(uid))
    {
        return Some(ns.clone());
    }
    let mut listed = LISTED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(ns) = listed.by_uid.as_ref().and_then(|m| m.get(uid)) {
        return Some(ns.clone());
    }
    if listed.at.is_some_and(|at| at.elapsed() < RESCAN_EVERY) {
        return None;
    }
    listed.at = Some(Instant::now());
    let m = list_pod_logs(&pod_logs_dir());
    let ns = m.get(uid).cloned();
    listed.by_uid = Some(m);
    ns
}

/// `<namespace>_<name>_<uid>` directories: neither a namespace nor a pod name can hold
/// an underscore (DNS labels and subdomains), so the split is unambiguous.
fn list_pod_logs(dir: &std::path::Path) -> HashMap<String, String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return HashMap::new();
    };
    entries
        .filter_map(Result::ok)
        .take(MAX_LISTED)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (ns, rest) = name.split_once('_')?;
            let (_, uid) = rest.rsplit_once('_')?;
            (!ns.is_empty() && !uid.is_empty()).then(|| (uid.to_owned(), ns.to_owned()))
        })
        .collect()
}

/// The tenant of a process attributed to pod `pod_uid` or to cgroup `cgroup`.
pub fn of(pod_uid: Option<&str>, cgroup: Option<&str>) -> Tenant {
    if let Some(uid) = pod_uid {
        return match namespace_of(uid) {
            Some(ns) => format!("ns:{ns}"),
            None => format!("pod:{uid}"),
        };
    }
    cgroup.map_or_else(|| "node".to_owned(), |c| format!("cgroup:{c}"))
}

/// The tenant of process `pid`, from its cgroup (`node` when it is gone).
pub fn of_pid(pid: u32) -> Tenant {
    let Some(text) = crate::procfs::cgroup_text(pid) else {
        return "node".to_owned();
    };
    // One line per hierarchy (v1) or the one line of v2: `ID:CONTROLLERS:PATH`.
    let paths: Vec<&str> = text
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .collect();
    let uid = paths
        .iter()
        .find_map(|p| crate::cgroup_resolver::attribute(p).pod_uid);
    let cgroup = paths.iter().find(|p| **p != "/").copied();
    of(uid.as_deref(), cgroup)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kubelet's directory names give each pod's namespace; other entries are
    /// ignored.
    #[test]
    fn pod_log_directories_name_each_pods_namespace() {
        let dir = std::env::temp_dir().join(format!("rw-pod-logs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in [
            "team-a_web-7d4b9_0b7c1f1e-1111-4a4a-9b9b-000000000001",
            "kube-system_kube-proxy-x2x_0b7c1f1e-2222-4a4a-9b9b-000000000002",
            "stray",
        ] {
            std::fs::create_dir_all(dir.join(d)).expect("mkdir");
        }
        let m = list_pod_logs(&dir);
        assert_eq!(
            m.get("0b7c1f1e-1111-4a4a-9b9b-000000000001")
                .map(String::as_str),
            Some("team-a")
        );
        assert_eq!(
            m.get("0b7c1f1e-2222-4a4a-9b9b-000000000002")
                .map(String::as_str),
            Some("kube-system")
        );
        assert_eq!(m.len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A watched pod's namespace comes from the configuration; an unknown pod is its own
    /// tenant; a process outside Kubernetes is its cgroup's.
    #[test]
    fn a_tenant_is_the_namespace_when_known() {
        set_watched([("uid-watched-1", "team-b")]);
        assert_eq!(of(Some("uid-watched-1"), Some("/x")), "ns:team-b");
        assert_eq!(of(Some("uid-nowhere-9"), Some("/x")), "pod:uid-nowhere-9");
        assert_eq!(
            of(None, Some("/system.slice/a.service")),
            "cgroup:/system.slice/a.service"
        );
        assert_eq!(of(None, None), "node");
        // A process that is gone is the node's.
        assert_eq!(of_pid(u32::MAX), "node");
    }
}
