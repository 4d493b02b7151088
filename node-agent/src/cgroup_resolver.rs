//! Which cgroup, container and pod a process belongs to, from `/proc/PID/cgroup`, on
//! cgroup v1, v2 and hybrid hosts, for the path shapes of containerd, CRI-O and Docker
//! under both kubelet cgroup drivers (cgroupfs and systemd).

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

/// How cgroups are mounted on this host, and so which hierarchy identifies a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupLayout {
    /// Only cgroup2, at `root`.
    Unified { root: PathBuf },
    /// cgroup v1 controllers, possibly with an unused cgroup2 mount beside them (hybrid).
    /// Container runtimes place containers in the v1 controllers, so the memory
    /// controller's hierarchy is the one that identifies a container and holds its limit.
    V1 {
        memory_root: PathBuf,
        unified_root: Option<PathBuf>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no cgroup v2 mount and no cgroup v1 memory controller mount in /proc/self/mountinfo")]
    NoHierarchy,
    #[error("cgroup {0} does not exist")]
    NoSuchCgroup(PathBuf),
}

impl CgroupLayout {
    /// Reads the mount table of this process.
    pub fn detect() -> Result<Self, CgroupError> {
        let path = Path::new("/proc/self/mountinfo");
        let text = fs::read_to_string(path).map_err(|source| CgroupError::Read {
            path: path.into(),
            source,
        })?;
        Self::from_mountinfo(&text).ok_or(CgroupError::NoHierarchy)
    }

    /// Parses `/proc/self/mountinfo` text.
    pub fn from_mountinfo(text: &str) -> Option<Self> {
        let mut unified = None;
        let mut memory = None;
        for line in text.lines() {
            // 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split_whitespace().nth(4);
            let mut r = right.split_whitespace();
            let fstype = r.next();
            let super_opts = r.nth(1).unwrap_or("");
            match (fstype, mount_point) {
                (Some("cgroup2"), Some(mp)) if unified.is_none() => {
                    unified = Some(PathBuf::from(unescape(mp)))
                }
                (Some("cgroup"), Some(mp)) if super_opts.split(',').any(|o| o == "memory") => {
                    memory = Some(PathBuf::from(unescape(mp)))
                }
                _ => {}
            }
        }
        match (memory, unified) {
            (Some(memory_root), unified_root) => Some(Self::V1 {
                memory_root,
                unified_root,
            }),
            (None, Some(root)) => Some(Self::Unified { root }),
            (None, None) => None,
        }
    }

    /// The hierarchy whose directories (and inode numbers) are cgroup ids for the kernel
    /// programs.
    pub fn root(&self) -> &Path {
        match self {
            Self::Unified { root } => root,
            Self::V1 { memory_root, .. } => memory_root,
        }
    }

    pub fn version_name(&self) -> &'static str {
        match self {
            Self::Unified { .. } => "v2",
            Self::V1 {
                unified_root: Some(_),
                ..
            } => "hybrid",
            Self::V1 {
                unified_root: None, ..
            } => "v1",
        }
    }

    /// The process's path inside [`Self::root`], from `/proc/PID/cgroup` text.
    ///
    /// The kernel writes that path relative to the *reader's* cgroup namespace. containerd
    /// gives every unprivileged container its own namespace on cgroup v2, the agent's
    /// included, so there another pod's process reads
    /// `0::/../../kubepods-burstable.slice/…/cri-containerd-<id>.scope`: relative to the
    /// agent's own cgroup. Such a path is resolved against where this process's namespace
    /// root is in the hierarchy ([`own_namespace_root`]). Without it the path named no
    /// directory: no memory limit (time to OOM against the node's memory) and no cgroup id
    /// (a process already running in a target not seeded) on every v2 node.
    pub fn path_in_proc_cgroup(&self, text: &str) -> Option<String> {
        let raw = self.raw_path_in_proc_cgroup(text)?;
        if !raw.starts_with("/..") {
            return Some(raw.to_owned());
        }
        let root = OWN_NAMESPACE_ROOT.get_or_init(|| own_namespace_root(self));
        resolve_in_namespace(root.as_deref()?, raw)
    }

    /// The path as `/proc/PID/cgroup` writes it, relative to the reader's cgroup namespace.
    pub fn raw_path_in_proc_cgroup<'a>(&self, text: &'a str) -> Option<&'a str> {
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (_id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            match self {
                Self::Unified { .. } if controllers.is_empty() => return Some(path),
                Self::V1 { .. } if controllers.split(',').any(|c| c == "memory") => {
                    return Some(path);
                }
                _ => {}
            }
        }
        None
    }

    /// The kernel's id of a cgroup: the inode number of its directory in [`Self::root`].
    pub fn cgroup_id(&self, path_in_hierarchy: &str) -> Result<u64, CgroupError> {
        let dir = self.root().join(path_in_hierarchy.trim_start_matches('/'));
        fs::metadata(&dir)
            .map(|m| m.ino())
            .map_err(|_| CgroupError::NoSuchCgroup(dir))
    }

    /// The path in the hierarchy of the cgroup whose id is `id`, found by walking it (at
    /// most [`MAX_CGROUPS_WALKED`] directories; the id is the directory's inode number, which
    /// `readdir` gives without a `stat`). For what is rare (an OOM kill's victim that was
    /// in no row): a node with a thousand containers has a few thousand cgroups.
    pub fn path_of_id(&self, id: u64) -> Option<String> {
        use std::os::unix::fs::DirEntryExt;
        let root = self.root();
        if fs::metadata(root).is_ok_and(|m| m.ino() == id) {
            return Some("/".into());
        }
        let mut queue = std::collections::VecDeque::from([root.to_path_buf()]);
        let mut walked = 0;
        while let Some(dir) = queue.pop_front() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                walked += 1;
                if walked > MAX_CGROUPS_WALKED {
                    return None;
                }
                if e.ino() == id {
                    let path = e.path();
                    return Some(format!("/{}", path.strip_prefix(root).ok()?.to_str()?));
                }
                queue.push_back(e.path());
            }
        }
        None
    }

    /// Resolves a user's `--target-cgroup`: a path under the root, an absolute path to a
    /// cgroup directory, or a numeric id.
    pub fn resolve_target(&self, spec: &str) -> Result<u64, CgroupError> {
        if let Ok(id) = spec.parse::<u64>() {
            return Ok(id);
        }
        let p = Path::new(spec);
        if p.is_absolute() && p.starts_with("/sys/fs/cgroup") {
            return fs::metadata(p)
                .map(|m| m.ino())
                .map_err(|_| CgroupError::NoSuchCgroup(p.into()));
        }
        self.cgroup_id(spec)
    }
}

/// Where this process's cgroup namespace root is in the hierarchy, found once.
static OWN_NAMESPACE_ROOT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Directories visited at most while looking for this process's own cgroup: a node with
/// a thousand containers has a few thousand.
const MAX_CGROUPS_WALKED: usize = 100_000;

/// Where this process's cgroup namespace root is in `layout`'s hierarchy, or None (with a
/// warning) when its cgroup can't be found there. The namespace hides the answer from
/// `/proc/self/cgroup` ("/"), so it is found the other way: the directory whose
/// `cgroup.procs` lists this process (PIDs there are in the reader's PID namespace), less
/// the part of the path `/proc/self/cgroup` still shows.
pub fn own_namespace_root(layout: &CgroupLayout) -> Option<String> {
    let me = std::process::id().to_string();
    let own_in_ns = fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| layout.raw_path_in_proc_cgroup(&t).map(str::to_owned))?;
    let root = layout.root();
    let mut queue = std::collections::VecDeque::from([root.to_path_buf()]);
    let mut walked = 0;
    while let Some(dir) = queue.pop_front() {
        walked += 1;
        if walked > MAX_CGROUPS_WALKED {
            break;
        }
        let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        if procs.lines().any(|l| l == me) {
            let host = format!("/{}", dir.strip_prefix(root).ok()?.to_str()?);
            let host = host.trim_end_matches('/');
            let suffix = own_in_ns.trim_end_matches('/');
            let ns_root = host.strip_suffix(suffix)?;
            return Some(if ns_root.is_empty() { "/" } else { ns_root }.to_owned());
        }
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                queue.push_back(e.path());
            }
        }
    }
    tracing::warn!(
        root = %root.display(),
        "this process's own cgroup is not under the cgroup root: paths of other cgroup namespaces stay unresolved"
    );
    None
}

/// `raw` (a path relative to a cgroup namespace whose root is `ns_root`, as
/// `/proc/PID/cgroup` writes it) as a path from the hierarchy's root; None if it climbs
/// above the root.
pub fn resolve_in_namespace(ns_root: &str, raw: &str) -> Option<String> {
    let mut parts: Vec<&str> = ns_root.split('/').filter(|p| !p.is_empty()).collect();
    for p in raw.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            name => parts.push(name),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

/// mountinfo escapes spaces and a few other bytes as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Container and pod a cgroup path names, when it names them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attribution {
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
}

/// Finds the pod UID and container id in a cgroup path. Shapes handled:
/// - kubelet cgroupfs driver: `/kubepods[/burstable|/besteffort]/pod<UID>/<id>`, where `<id>`
///   is a bare id (containerd, Docker) or `crio-<id>`;
/// - kubelet systemd driver: `/kubepods.slice/kubepods-<qos>.slice/
///   kubepods-<qos>-pod<UID_with_underscores>.slice/<runtime>-<id>.scope` with runtime
///   `cri-containerd`, `crio` or `docker`;
/// - plain Docker: `/docker/<id>` and `/system.slice/docker-<id>.scope`;
/// - any of these nested under another prefix (kind, a node in a container).
///
/// CRI-O's `crio-conmon-<id>` is the container's monitor, not the container: pod only.
pub fn attribute(path: &str) -> Attribution {
    let mut out = Attribution::default();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    for (i, seg) in segments.iter().enumerate() {
        if let Some(uid) = pod_uid_of(seg) {
            out.pod_uid = Some(uid);
            if let Some(next) = segments.get(i + 1) {
                out.container_id = container_id_of(next);
            }
        }
    }
    if out.pod_uid.is_none() {
        // Docker without Kubernetes.
        for (i, seg) in segments.iter().enumerate() {
            if *seg == "docker" {
                if let Some(next) = segments.get(i + 1) {
                    out.container_id = container_id_of(next);
                }
            } else if let Some(id) = seg
                .strip_prefix("docker-")
                .and_then(|s| s.strip_suffix(".scope"))
            {
                out.container_id = is_container_id(id).then(|| id.to_owned());
            }
        }
    }
    out
}

fn pod_uid_of(seg: &str) -> Option<String> {
    // cgroupfs: "pod<uid>"; systemd: "kubepods-<qos>-pod<uid_underscored>.slice" or
    // "kubepods-pod<uid>.slice" (guaranteed QoS).
    let raw = if let Some(s) = seg.strip_suffix(".slice") {
        s.rsplit_once("-pod").map(|(_, uid)| uid)?
    } else {
        seg.strip_prefix("pod")?
    };
    let uid = raw.replace('_', "-");
    is_uid(&uid).then_some(uid)
}

fn container_id_of(seg: &str) -> Option<String> {
    let s = seg.strip_suffix(".scope").unwrap_or(seg);
    if s.starts_with("crio-conmon-") {
        return None;
    }
    let id = ["cri-containerd-", "crio-", "docker-", "containerd-"]
        .iter()
        .find_map(|p| s.strip_prefix(p))
        .unwrap_or(s);
    is_container_id(id).then(|| id.to_owned())
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_uid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && [8, 4, 4, 4, 12]
            .iter()
            .zip(&parts)
            .all(|(n, p)| p.len() == *n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID: &str = "9c2bd5b1a0f3c7e2d4b6a8f0e1c3d5b7a9f1e3c5d7b9a1f3e5c7d9b1a3f5e7c9";
    const UID: &str = "3f1b2a6e-5c4d-4e8f-9a0b-1c2d3e4f5a6b";

    #[test]
    fn this_machines_kubelet_shape_cgroupfs_v1() {
        // As written by the e2e cluster's kubelet here: /kubepods/<qos>/pod<UID>/<containerID>.
        for qos in ["/kubepods/besteffort", "/kubepods/burstable", "/kubepods"] {
            let a = attribute(&format!("{qos}/pod{UID}/{CID}"));
            assert_eq!(a.pod_uid.as_deref(), Some(UID), "{qos}");
            assert_eq!(a.container_id.as_deref(), Some(CID), "{qos}");
        }
        // The pod cgroup itself (the sandbox's parent) names a pod but no container.
        assert_eq!(
            attribute(&format!("/kubepods/burstable/pod{UID}")),
            Attribution {
                container_id: None,
                pod_uid: Some(UID.into())
            }
        );
    }

    #[test]
    fn systemd_driver_shapes_for_each_runtime() {
        let u = UID.replace('-', "_");
        for (runtime, qos) in [
            ("cri-containerd", "burstable"),
            ("crio", "besteffort"),
            ("docker", "burstable"),
        ] {
            let p = format!(
                "/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/{runtime}-{CID}.scope"
            );
            let a = attribute(&p);
            assert_eq!(a.pod_uid.as_deref(), Some(UID), "{p}");
            assert_eq!(a.container_id.as_deref(), Some(CID), "{p}");
        }
        let guaranteed =
            format!("/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{CID}.scope");
        assert_eq!(attribute(&guaranteed).container_id.as_deref(), Some(CID));
    }

    #[test]
    fn crio_cgroupfs_and_conmon() {
        assert_eq!(
            attribute(&format!("/kubepods/burstable/pod{UID}/crio-{CID}"))
                .container_id
                .as_deref(),
            Some(CID)
        );
        let conmon = attribute(&format!(
            "/kubepods.slice/kubepods-pod{}.slice/crio-conmon-{CID}.scope",
            UID.replace('-', "_")
        ));
        assert_eq!(conmon.pod_uid.as_deref(), Some(UID));
        assert_eq!(conmon.container_id, None);
    }

    #[test]
    fn plain_docker_and_nested_kubernetes() {
        assert_eq!(
            attribute(&format!("/docker/{CID}")).container_id.as_deref(),
            Some(CID)
        );
        assert_eq!(
            attribute(&format!("/system.slice/docker-{CID}.scope"))
                .container_id
                .as_deref(),
            Some(CID)
        );
        // A kind node: the node is a Docker container and kubepods live inside it.
        let other = CID.replace('9', "8");
        let nested = attribute(&format!(
            "/docker/{other}/kubepods/besteffort/pod{UID}/{CID}"
        ));
        assert_eq!(nested.pod_uid.as_deref(), Some(UID));
        assert_eq!(nested.container_id.as_deref(), Some(CID));
    }

    #[test]
    fn host_processes_have_no_attribution() {
        for p in [
            "/",
            "/user.slice/user-0.slice/session-1.scope",
            "/system.slice/containerd.service",
            "/podman",
        ] {
            assert_eq!(attribute(p), Attribution::default(), "{p}");
        }
    }

    #[test]
    fn detects_this_machines_hybrid_layout() {
        let mountinfo = "\
30 1 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 30 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 30 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        let layout = CgroupLayout::from_mountinfo(mountinfo).expect("a layout");
        assert_eq!(
            layout,
            CgroupLayout::V1 {
                memory_root: "/sys/fs/cgroup/memory".into(),
                unified_root: Some("/sys/fs/cgroup/unified".into())
            }
        );
        assert_eq!(layout.version_name(), "hybrid");
        let proc_cgroup =
            format!("12:pids:/kubepods/x\n4:memory:/kubepods/besteffort/pod{UID}/{CID}\n0::/\n");
        assert_eq!(
            layout.path_in_proc_cgroup(&proc_cgroup),
            Some(format!("/kubepods/besteffort/pod{UID}/{CID}"))
        );
    }

    #[test]
    fn detects_unified_and_pure_v1() {
        let v2 = "25 20 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate";
        let layout = CgroupLayout::from_mountinfo(v2).expect("v2");
        assert_eq!(layout.version_name(), "v2");
        assert_eq!(
            layout
                .path_in_proc_cgroup("0::/system.slice/x.service\n")
                .as_deref(),
            Some("/system.slice/x.service")
        );
        let v1 = "34 30 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory";
        assert_eq!(
            CgroupLayout::from_mountinfo(v1).expect("v1").version_name(),
            "v1"
        );
        assert_eq!(
            CgroupLayout::from_mountinfo("1 0 8:1 / / rw - ext4 /dev/sda rw"),
            None
        );
    }

    /// Whole `/proc/PID/cgroup` files of a container's process on cgroup v2 nodes, through
    /// the same two steps the agent takes (the unified line, then the path's names).
    /// containerd 2 names its scopes `cri-containerd-<id>.scope` as 1.x did, and the
    /// kubelet its slices; what varies is the prefix (kind runs the kubelet with
    /// `--cgroup-root=/kubelet`) and the driver (k3s keeps cgroupfs on v2). Shapes written
    /// from those projects' documented layouts: no such node can run here.
    #[test]
    fn cgroup_v2_proc_files_of_containerd_2_kind_and_k3s() {
        let u = UID.replace('-', "_");
        let mountinfo = "25 20 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate";
        let layout = CgroupLayout::from_mountinfo(mountinfo).expect("v2");
        for proc_cgroup in [
            // containerd 2 (as 1.x) under the kubelet's systemd driver.
            format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CID}.scope\n"
            ),
            // A kind node: systemd driver, the kubelet's cgroup root /kubelet.
            format!(
                "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-{CID}.scope\n"
            ),
            // k3s (embedded containerd, cgroupfs driver on v2).
            format!("0::/kubepods/burstable/pod{UID}/{CID}\n"),
            // Guaranteed QoS has no QoS slice.
            format!("0::/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{CID}.scope\n"),
        ] {
            let path = layout.path_in_proc_cgroup(&proc_cgroup).expect("a v2 path");
            let a = attribute(&path);
            assert_eq!(a.pod_uid.as_deref(), Some(UID), "{proc_cgroup}");
            assert_eq!(a.container_id.as_deref(), Some(CID), "{proc_cgroup}");
        }
        // The kubelet itself and containerd's own service are host processes.
        for host in [
            "0::/kubelet.slice/kubelet.service\n",
            "0::/system.slice/containerd.service\n",
        ] {
            let path = layout.path_in_proc_cgroup(host).expect("a v2 path");
            assert_eq!(attribute(&path), Attribution::default(), "{host}");
        }
    }

    /// What containerd's cgroup namespace makes of another pod's path (the agent in
    /// kubepods-burstable-podA's container, the process in besteffort-podB's), resolved
    /// back; a path climbing above the root is refused.
    #[test]
    fn paths_relative_to_a_cgroup_namespace_resolve_to_the_hierarchys() {
        let agent = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podA.slice/cri-containerd-a.scope";
        let raw = "/../../../kubepods-besteffort.slice/kubepods-besteffort-podB.slice/cri-containerd-b.scope";
        assert_eq!(
            resolve_in_namespace(agent, raw).as_deref(),
            Some(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podB.slice/cri-containerd-b.scope"
            )
        );
        assert_eq!(
            resolve_in_namespace(agent, "/../../../..").as_deref(),
            Some("/")
        );
        assert_eq!(resolve_in_namespace(agent, "/../../../../.."), None);
        assert_eq!(resolve_in_namespace("/", "/a/./b").as_deref(), Some("/a/b"));
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape("/mnt/with\\040space"), "/mnt/with space");
    }
}
