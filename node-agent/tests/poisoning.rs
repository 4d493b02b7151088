//! A chrooted tenant cannot poison what other tenants' stacks are named from: the agent
//! keys what it keeps of a file by the file it opened inside each process's root, not by
//! the path or the (device, inode) that /proc/PID/maps print.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use resourcewatch_agent::stacks::symbolize::Symbolizer;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hostile")
        .join(name)
}

fn cc(args: &[&str], out: &Path, source: &Path) {
    let o = Command::new("cc")
        .args(args)
        .arg("-o")
        .arg(out)
        .arg(source)
        .output()
        .expect("cc runs (build-essential is installed by .ci/install-deps)");
    assert!(
        o.status.success(),
        "building {}: {}",
        source.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A tenant process, killed on drop, and the address of its library's function.
struct Tenant(Child, u64);

impl Tenant {
    fn start(bin: &Path, lib: &Path, jail: Option<&Path>) -> Self {
        let mut cmd = Command::new(bin);
        cmd.arg(lib).stdout(Stdio::piped());
        if let Some(j) = jail {
            cmd.arg(j);
        }
        let mut child = cmd.spawn().expect("the tenant starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("its line");
        let addr = u64::from_str_radix(line.trim(), 16).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!(
                "the tenant said {line:?} (chroot needs root: {:?})",
                child.wait()
            )
        });
        Self(child, addr)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two tenants map the same base-layer library. One chroots into a jail where the
/// library's path holds a crafted copy (the same code, its function renamed) and is
/// named first; the other's frame in the real file is still named from the real file,
/// whichever order, and the jailed tenant's own frame is named from what it shows.
#[test]
fn a_chrooted_tenant_cannot_poison_another_tenants_names() {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("poisoning-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("base")).expect("base dir");
    // The path the maps print: through no symlink (CI's target/ is one).
    let dir = dir.canonicalize().expect("the test's directory");
    let lib = dir.join("base/libtenant.so");
    let shared = ["-O2", "-fno-omit-frame-pointer", "-shared", "-fPIC"];
    cc(&shared, &lib, &fixture("libtenant.c"));
    // The crafted copy at the same absolute path inside the jail.
    let jail = dir.join("jail");
    let crafted = jail.join(lib.strip_prefix("/").expect("absolute"));
    std::fs::create_dir_all(crafted.parent().expect("parent")).expect("jail dirs");
    let mut poisoned = shared.to_vec();
    poisoned.push("-DTENANT_FN=poisoned_by_the_jail");
    cc(&poisoned, &crafted, &fixture("libtenant.c"));
    let bin = dir.join("chroot_tenant");
    cc(&["-O2"], &bin, &fixture("chroot_tenant.c"));

    let attacker = Tenant::start(&bin, &lib, Some(&jail));
    let victim = Tenant::start(&bin, &lib, None);
    // The same file mapped by both: what the maps show cannot tell the copies apart.
    let inode_in_maps = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .expect("maps")
            .lines()
            .find(|l| l.ends_with("libtenant.so"))
            .map(|l| l.split_whitespace().nth(4).unwrap_or_default().to_owned())
    };
    assert_eq!(inode_in_maps(attacker.pid()), inode_in_maps(victim.pid()));
    assert!(
        inode_in_maps(victim.pid()).is_some(),
        "the library is mapped"
    );

    // The attacker's frame first (what would fill a cache keyed by path or maps inode).
    let name = |t: &Tenant| Symbolizer::new().user(t.pid(), &[t.1], false);
    let a = name(&attacker);
    assert!(
        a.iter().any(|f| f.contains("poisoned_by_the_jail")),
        "the jailed tenant's own frame is named from its own root: {a:?}"
    );
    let v = name(&victim);
    assert_eq!(v, ["tenant_leak_and_burn"], "the victim's frame");
    // And again, the other way round, with both files known.
    assert_eq!(name(&victim), ["tenant_leak_and_burn"]);
    assert!(
        name(&attacker)
            .iter()
            .any(|f| f.contains("poisoned_by_the_jail"))
    );
    drop((attacker, victim));
    let _ = std::fs::remove_dir_all(&dir);
}
