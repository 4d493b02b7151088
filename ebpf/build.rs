//! Compiles the C CO-RE programs in `src/*.bpf.c` with clang into `$OUT_DIR/*.bpf.o`.
//!
//! Why C and not aya-ebpf: the toolchain here has no rust-src, so a Rust BPF target cannot be
//! built; clang-14 with libbpf's headers is what every distribution ships.

use std::{env, path::PathBuf, process::Command};

fn main() {
    let manifest =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
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
    // The directory too, so that adding a program is noticed.
    println!("cargo:rerun-if-changed=src");

    let src = manifest.join("src");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&src)
        .expect("ebpf/src is readable")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".bpf.c"))
        .collect();
    sources.sort();
    for source in sources {
        println!("cargo:rerun-if-changed={}", source.display());
        let name = source
            .file_name()
            .and_then(|n| n.to_str())
            .expect("utf-8 file name");
        let object = out.join(name.replace(".bpf.c", ".bpf.o"));
        let multiarch = format!(
            "/usr/include/{}-linux-gnu",
            env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into())
        );
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
        assert!(
            status.success(),
            "{clang} failed to compile {}",
            source.display()
        );
    }
    layout_probe(&manifest, &out);
}

/// Compiles and runs a host C program that prints the size and offset of every field of
/// every `struct rw_*` in the shared header, as the C compiler lays them out, and the value
/// of every `#define RW_*` constant. The Rust mirror's tests (`shared::tests`) compare
/// themselves against that list, so a field or a constant changed on one side only, or a
/// padding difference, fails the build's tests.
fn layout_probe(manifest: &std::path::Path, out: &std::path::Path) {
    let header = manifest.join("include/resourcewatch.h");
    let text = std::fs::read_to_string(&header).expect("shared header is readable");
    let mut body = String::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.split("/*").next().unwrap_or("").trim();
        // Constants: `#define RW_NAME value` (not function-like), printed by value.
        if let Some(name) = line
            .strip_prefix("#define RW_")
            .and_then(|r| r.split_whitespace().next())
            .filter(|n| !n.contains('('))
            .filter(|_| line.split_whitespace().count() >= 3)
        {
            body.push_str(&format!(
                "printf(\"const RW_{name} %llu\\n\", (unsigned long long)(RW_{name}));\n"
            ));
            continue;
        }
        if let Some(name) = line
            .strip_prefix("struct ")
            .and_then(|r| r.strip_suffix(" {"))
        {
            body.push_str(&format!("P(\"{name}\", sizeof(struct {name}), 0);\n"));
            current = Some(name.to_owned());
            continue;
        }
        if line.starts_with("};") {
            current = None;
            continue;
        }
        let Some(st) = &current else { continue };
        let Some(decl) = line.strip_suffix(';') else {
            continue;
        };
        let field = decl
            .rsplit(|c: char| c.is_whitespace() || c == '*')
            .next()
            .unwrap_or("");
        let field = field.split('[').next().unwrap_or("");
        if field.is_empty() {
            continue;
        }
        body.push_str(&format!(
            "P(\"{st}.{field}\", sizeof(((struct {st} *)0)->{field}), offsetof(struct {st}, {field}));\n"
        ));
    }
    let program = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"resourcewatch.h\"\n\
         #define P(n, s, o) printf(\"%s %zu %zu\\n\", n, (size_t)(s), (size_t)(o))\n\
         int main(void) {{\n{body}return 0;\n}}\n"
    );
    let c_file = out.join("layout_probe.c");
    let exe = out.join("layout_probe");
    std::fs::write(&c_file, program).expect("OUT_DIR is writable");
    let cc = env::var("HOST_CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&cc)
        .arg("-I")
        .arg(manifest.join("include"))
        .arg(&c_file)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the host C compiler `{cc}`: {e}"));
    assert!(status.success(), "the layout probe did not compile");
    let output = Command::new(&exe).output().expect("the layout probe runs");
    assert!(output.status.success(), "the layout probe failed");
    std::fs::write(out.join("layout.txt"), output.stdout).expect("OUT_DIR is writable");
}
