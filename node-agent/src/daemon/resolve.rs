//! From the operator's targets (pod UIDs and container ids) to this node's cgroups.
//!
//! The runtime's container id is the only name both sides know: kubelet puts it in the
//! pod's status, and every cgroup driver and runtime puts it in the container's cgroup
//! directory name. So the hierarchy is walked (it is small: kubepods is a few hundred
//! directories on a busy node) and each directory's name is parsed with the same
//! attribution code the Top-K lists use.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    os::unix::fs::MetadataExt,
    path::Path,
};

use crate::cgroup_resolver::attribute;

/// A targeted container found on this node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ResolvedContainer {
    pub pod_uid: String,
    pub container_id: String,
    /// Path inside the hierarchy root, e.g. `/kubepods/burstable/pod<UID>/<id>`.
    pub cgroup_path: String,
    pub cgroup_id: u64,
}

/// Directories deeper than this are not visited (kubepods containers sit at depth 3-5,
/// nested setups such as kind add one or two).
const MAX_DEPTH: usize = 8;

/// Finds the cgroups of `wanted` container ids under `root`; returns those found and the
/// ids that were not (not started yet, or on another node after all).
pub fn resolve(
    root: &Path,
    wanted: &BTreeSet<String>,
) -> (Vec<ResolvedContainer>, BTreeSet<String>) {
    let mut found: BTreeMap<String, ResolvedContainer> = BTreeMap::new();
    if !wanted.is_empty() {
        walk(root, root, 0, wanted, &mut found);
    }
    let missing = wanted
        .iter()
        .filter(|id| !found.contains_key(*id))
        .cloned()
        .collect();
    (found.into_values().collect(), missing)
}

fn walk(
    root: &Path,
    dir: &Path,
    depth: usize,
    wanted: &BTreeSet<String>,
    found: &mut BTreeMap<String, ResolvedContainer>,
) {
    if depth > MAX_DEPTH || found.len() == wanted.len() {
        return;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        if !ft.is_dir() {
            continue;
        }
        let path = e.path();
        let Ok(rel) = path.strip_prefix(root) else {
            continue;
        };
        let rel = format!("/{}", rel.to_string_lossy());
        let a = attribute(&rel);
        if let (Some(cid), Some(uid)) = (&a.container_id, &a.pod_uid)
            && wanted.contains(cid)
        {
            if let Ok(meta) = e.metadata() {
                found.insert(
                    cid.clone(),
                    ResolvedContainer {
                        pod_uid: uid.clone(),
                        container_id: cid.clone(),
                        cgroup_path: rel,
                        cgroup_id: meta.ino(),
                    },
                );
            }
            // A container's own cgroup has no container below it.
            continue;
        }
        walk(root, &path, depth + 1, wanted, found);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "3f1b2a6e-5c4d-4e8f-9a0b-1c2d3e4f5a6b";

    fn cid(n: u8) -> String {
        format!("{:064x}", n)
    }

    #[test]
    fn finds_containers_under_both_cgroup_drivers_and_reports_the_rest() {
        let tmp = std::env::temp_dir().join(format!("rw-resolve-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        let cgroupfs = tmp.join(format!("kubepods/burstable/pod{UID}/{}", cid(1)));
        let systemd = tmp.join(format!(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{}.scope",
            UID.replace('-', "_"),
            cid(2)
        ));
        fs::create_dir_all(&cgroupfs).expect("mkdir");
        fs::create_dir_all(&systemd).expect("mkdir");
        let wanted: BTreeSet<String> = [cid(1), cid(2), cid(3)].into();
        let (found, missing) = resolve(&tmp, &wanted);
        let _ = fs::remove_dir_all(&tmp);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].container_id, cid(1));
        assert_eq!(found[0].pod_uid, UID);
        assert_eq!(
            found[0].cgroup_path,
            format!("/kubepods/burstable/pod{UID}/{}", cid(1))
        );
        assert!(found[1].cgroup_path.ends_with(".scope"));
        assert_ne!(found[0].cgroup_id, 0);
        assert_eq!(missing, [cid(3)].into());
    }
}
