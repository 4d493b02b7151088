//! Compiles the C CO-RE programs in `src/*.bpf.c` with clang into `$OUT_DIR/*.bpf.o`.
//!
//! Why C and not aya-ebpf: the toolchain here has no rust-src, so a Rust BPF target cannot be
//! built; clang-14 with libbpf's headers is what every distribution ships.

use std::{env, path::PathBuf, process::Command};

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = env::var("BPF_CLANG").unwrap_or_else(|_| "clang-14".to_owned());
    let arch = match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86",
        Ok("aarch64") => "arm64",
        Ok(other) => panic!("resourcewatch's BPF programs are not ported to {other}"),
        Err(_) => "x86",
    };
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    println!("cargo:rerun-if-changed=include");

    let src = manifest.join("src");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&src)
        .expect("ebpf/src is readable")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".bpf.c"))
        .collect();
    sources.sort();
    for source in sources {
        println!("cargo:rerun-if-changed={}", source.display());
        let name = source.file_name().and_then(|n| n.to_str()).expect("utf-8 file name");
        let object = out.join(name.replace(".bpf.c", ".bpf.o"));
        let multiarch = format!("/usr/include/{}-linux-gnu", env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into()));
        let status = Command::new(&clang)
            .args(["-target", "bpf", "-O2", "-g", "-mcpu=v3", "-Wall", "-Werror"])
            .arg(format!("-D__TARGET_ARCH_{arch}"))
            .arg("-I")
            .arg(manifest.join("include"))
            .arg("-idirafter")
            .arg(multiarch)
            .arg("-c")
            .arg(&source)
            .arg("-o")
            .arg(&object)
            .status()
            .unwrap_or_else(|e| {
                panic!("cannot run `{clang}` ({e}): install clang-14 and libbpf-dev (see .ci/run), or set BPF_CLANG")
            });
        assert!(status.success(), "{clang} failed to compile {}", source.display());
    }
}
