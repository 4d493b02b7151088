//! A container's memory limit and usage from its cgroup (v2 `memory.max` /
//! `memory.current`, v1 `memory.limit_in_bytes` / `memory.usage_in_bytes`, and the hybrid
//! layout, which uses the v1 files), and the node's available memory for processes
//! without a limit.

use std::{fs, path::Path};

/// The tightest limit on a cgroup: its own or an ancestor's (a pod's limit is on the pod
/// cgroup, a container's on its own), with the usage charged against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    pub limit_bytes: Option<u64>,
    pub usage_bytes: u64,
    /// Page cache on the cgroup's file LRU lists (`active_file` + `inactive_file`), part
    /// of the usage: the kernel reclaims it before it OOM-kills, so a leak's real OOM
    /// comes when its anonymous memory alone fills the limit. Measured: a Node.js leak's
    /// charge reached its 256Mi limit at 180 s and was killed at 240 s, once its 65 MiB
    /// of cached binary and libraries had been reclaimed. 0 when not read.
    pub reclaimable_bytes: u64,
}

impl MemoryLimit {
    /// Bytes left before the limit, if there is one.
    pub fn headroom(&self) -> Option<u64> {
        self.limit_bytes.map(|l| l.saturating_sub(self.usage_bytes))
    }
}

/// v1 reports "no limit" as a huge page-aligned number (PAGE_COUNTER_MAX pages).
const V1_UNLIMITED_FLOOR: u64 = 1 << 62;

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Reads one cgroup directory's own limit, whichever cgroup version it belongs to.
pub fn read_one(dir: &Path) -> Option<MemoryLimit> {
    if let Ok(max) = fs::read_to_string(dir.join("memory.max")) {
        let usage = read_u64(&dir.join("memory.current"))?;
        let limit = match max.trim() {
            "max" => None,
            v => v.parse().ok(),
        };
        return Some(MemoryLimit {
            limit_bytes: limit,
            usage_bytes: usage,
            reclaimable_bytes: 0,
        });
    }
    let limit = read_u64(&dir.join("memory.limit_in_bytes"))?;
    let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
    Some(MemoryLimit {
        limit_bytes: (limit < V1_UNLIMITED_FLOOR).then_some(limit),
        usage_bytes: usage,
        reclaimable_bytes: 0,
    })
}

/// The limit that will trigger the OOM kill first for a cgroup at `path` under `root`:
/// the one with the least headroom among it and its ancestors, with its reclaimable page
/// cache.
pub fn effective(root: &Path, path: &str) -> Option<MemoryLimit> {
    let mut dir = root.join(path.trim_start_matches('/'));
    let mut best: Option<(MemoryLimit, std::path::PathBuf)> = None;
    loop {
        if let Some(l) = read_one(&dir) {
            let better = match (best.as_ref().and_then(|b| b.0.headroom()), l.headroom()) {
                (_, None) => best.is_none(),
                (None, Some(_)) => true,
                (Some(b), Some(h)) => h < b,
            };
            if better {
                best = Some((l, dir.clone()));
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    let (mut limit, dir) = best?;
    limit.reclaimable_bytes = read_reclaimable(&dir).unwrap_or(0);
    Some(limit)
}

/// `active_file` + `inactive_file` of a cgroup's `memory.stat` (v1: the hierarchical
/// `total_` ones).
pub fn read_reclaimable(dir: &Path) -> Option<u64> {
    let s = fs::read_to_string(dir.join("memory.stat")).ok()?;
    let get = |k: &str| stat_value(&s, k);
    match (get("total_active_file"), get("total_inactive_file")) {
        (Some(a), Some(i)) => Some(a + i),
        _ => Some(get("active_file")? + get("inactive_file")?),
    }
}

/// One `key value` line of a `memory.stat`.
fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// A cgroup's charged memory by kind, from `memory.stat`: (anon, file, shmem) bytes.
/// v2 has `anon`, `file`, `shmem`; v1 has hierarchical `total_rss` (anon), `total_cache`
/// (file, shmem included) and `total_shmem`.
pub fn read_stat(dir: &Path) -> Option<(u64, u64, u64)> {
    let s = fs::read_to_string(dir.join("memory.stat")).ok()?;
    let get = |k: &str| stat_value(&s, k);
    if let Some(anon) = get("anon") {
        return Some((anon, get("file").unwrap_or(0), get("shmem").unwrap_or(0)));
    }
    let shmem = get("total_shmem").unwrap_or(0);
    Some((
        get("total_rss")?,
        get("total_cache").unwrap_or(0).saturating_sub(shmem),
        shmem,
    ))
}

/// The highest charge a cgroup ever had: v2 `memory.peak` (kernel 5.19+), v1
/// `memory.max_usage_in_bytes`.
pub fn read_peak(dir: &Path) -> Option<u64> {
    read_u64(&dir.join("memory.peak")).or_else(|| read_u64(&dir.join("memory.max_usage_in_bytes")))
}

/// When the oldest process of a cgroup started (CLOCK_MONOTONIC ns).
pub fn oldest_start_ns(dir: &Path) -> Option<u64> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .ok()?
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .filter_map(crate::procfs::start_monotonic_ns)
        .min()
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn node_available() -> Option<u64> {
    crate::procfs::kib_field(&fs::read_to_string("/proc/meminfo").ok()?, "MemAvailable:")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("rw-limit-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn v2_files() {
        let d = dir("v2");
        fs::write(d.join("memory.max"), "134217728\n").expect("write");
        fs::write(d.join("memory.current"), "67108864\n").expect("write");
        assert_eq!(
            read_one(&d),
            Some(MemoryLimit {
                limit_bytes: Some(128 << 20),
                usage_bytes: 64 << 20,
                reclaimable_bytes: 0,
            })
        );
        fs::write(d.join("memory.max"), "max\n").expect("write");
        assert_eq!(read_one(&d).and_then(|l| l.limit_bytes), None);
    }

    #[test]
    fn v1_files_and_unlimited() {
        let d = dir("v1");
        fs::write(d.join("memory.limit_in_bytes"), "9223372036854771712\n").expect("write");
        fs::write(d.join("memory.usage_in_bytes"), "1000\n").expect("write");
        assert_eq!(
            read_one(&d),
            Some(MemoryLimit {
                limit_bytes: None,
                usage_bytes: 1000,
                reclaimable_bytes: 0,
            })
        );
    }

    #[test]
    fn the_tightest_ancestor_wins() {
        // pod limit 100 MiB with 90 used; container limit 200 MiB with 50 used.
        let root = dir("tree");
        let pod = root.join("kubepods/podx");
        let ctr = pod.join("ctr");
        fs::create_dir_all(&ctr).expect("mkdir");
        for (d, limit, usage) in [
            (&root, u64::MAX >> 1, 0u64),
            (&pod, 100 << 20, 90 << 20),
            (&ctr, 200 << 20, 50 << 20),
        ] {
            fs::write(d.join("memory.limit_in_bytes"), limit.to_string()).expect("write");
            fs::write(d.join("memory.usage_in_bytes"), usage.to_string()).expect("write");
        }
        // The reclaimable cache is the limiting cgroup's (v1: hierarchical totals).
        fs::write(
            pod.join("memory.stat"),
            "active_file 1\ninactive_file 2\ntotal_active_file 3145728\ntotal_inactive_file 1048576\n",
        )
        .expect("write");
        fs::write(
            ctr.join("memory.stat"),
            "total_active_file 99\ntotal_inactive_file 99\n",
        )
        .expect("write");
        let l = effective(&root, "/kubepods/podx/ctr").expect("limit");
        assert_eq!(l.limit_bytes, Some(100 << 20));
        assert_eq!(l.headroom(), Some(10 << 20));
        assert_eq!(l.reclaimable_bytes, 4 << 20);
    }

    /// A v2 tree as the kubelet's systemd driver lays it out: the root has no memory
    /// files, `kubepods.slice` is unlimited (`max`), the pod slice carries a pod-level limit
    /// (PodLevelResources, or the sum of its containers' limits) and the container's scope
    /// has none (`max`). The pod's limit is the one the OOM kill comes from, with the pod's
    /// own (v2: already hierarchical) file cache.
    #[test]
    fn v2_pod_level_limit_over_an_unlimited_container() {
        let root = dir("tree2");
        let pod =
            root.join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice");
        let ctr = pod.join("cri-containerd-abc.scope");
        fs::create_dir_all(&ctr).expect("mkdir");
        for (d, max, current) in [
            (root.join("kubepods.slice"), "max", 900u64 << 20),
            (
                root.join("kubepods.slice/kubepods-burstable.slice"),
                "max",
                600 << 20,
            ),
            (pod.clone(), "268435456", 200 << 20),
            (ctr.clone(), "max", 150 << 20),
        ] {
            fs::write(d.join("memory.max"), format!("{max}\n")).expect("write");
            fs::write(d.join("memory.current"), format!("{current}\n")).expect("write");
        }
        fs::write(
            pod.join("memory.stat"),
            "anon 150000000\nfile 9437184\nactive_file 6291456\ninactive_file 3145728\n",
        )
        .expect("write");
        let l = effective(&root, "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/cri-containerd-abc.scope")
            .expect("limit");
        assert_eq!(l.limit_bytes, Some(256 << 20));
        assert_eq!(l.usage_bytes, 200 << 20);
        assert_eq!(l.headroom(), Some(56 << 20));
        assert_eq!(l.reclaimable_bytes, 9 << 20);
        // With no limit anywhere (every level `max`), none is found: the agent falls back
        // to the node's available memory.
        fs::write(pod.join("memory.max"), "max\n").expect("write");
        let l = effective(&root, "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/cri-containerd-abc.scope")
            .expect("usage");
        assert_eq!(l.limit_bytes, None);
    }

    #[test]
    fn reclaimable_v2() {
        let d = dir("reclaim2");
        fs::write(
            d.join("memory.stat"),
            "anon 100\nfile 50\nactive_file 30\ninactive_file 12\nshmem 8\n",
        )
        .expect("write");
        assert_eq!(read_reclaimable(&d), Some(42));
    }

    #[test]
    fn stat_v1_and_v2() {
        let d = dir("stat");
        fs::write(
            d.join("memory.stat"),
            "anon 100\nfile 50\nshmem 5\nfile_mapped 3\n",
        )
        .expect("write");
        assert_eq!(read_stat(&d), Some((100, 50, 5)));
        fs::write(
            d.join("memory.stat"),
            "cache 1\nrss 2\ntotal_cache 60\ntotal_rss 200\ntotal_shmem 10\n",
        )
        .expect("write");
        assert_eq!(read_stat(&d), Some((200, 50, 10)));
    }

    #[test]
    fn node_memory_is_readable() {
        assert!(node_available().expect("meminfo") > 0);
    }
}
