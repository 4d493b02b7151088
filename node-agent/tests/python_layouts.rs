//! The CPython layouts the kernel's frame walk reads (`stacks::python::LAYOUTS`) against
//! each version's own headers: a C program compiled with `Py_BUILD_CORE` prints the
//! `offsetof` of every field, and it must equal the table. Headers are looked for where
//! Debian (`python3.11-dev`) and pyenv install them; a version with none found is a skip
//! with the reason (a failure in CI).

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use resourcewatch_agent::stacks::python::{LAYOUTS, Layout};

/// Include directories holding `internal/pycore_frame.h` for 3.`minor`.
fn header_dirs(minor: u8) -> Vec<PathBuf> {
    let name = format!("python3.{minor}");
    let mut dirs = vec![Path::new("/usr/include").join(&name)];
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv"));
    if let Ok(versions) = std::fs::read_dir(pyenv.join("versions")) {
        for v in versions.filter_map(Result::ok) {
            if v.file_name()
                .to_string_lossy()
                .starts_with(&format!("3.{minor}."))
            {
                dirs.push(v.path().join("include").join(&name));
            }
        }
    }
    dirs.retain(|d| d.join("internal/pycore_frame.h").is_file());
    dirs
}

/// The C side's figures for `l`, in the order `ours` lists them.
fn offsets_from_headers(include: &Path, l: &Layout) -> Vec<u64> {
    let frame_field = if l.version >= (3, 13) {
        "f_executable"
    } else {
        "f_code"
    };
    let entry_field = if l.version == (3, 11) {
        "is_entry"
    } else {
        "owner"
    };
    let (tstate_frame, cframe) = if l.cframe_frame.is_some() {
        ("cframe", "offsetof(_PyCFrame, current_frame)")
    } else {
        ("current_frame", "0")
    };
    let program = format!(
        r#"#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_frame.h"
int main(void) {{
  unsigned long v[] = {{
    offsetof(_PyRuntimeState, interpreters.main),
    offsetof(PyInterpreterState, threads.head),
    offsetof(PyThreadState, next),
    offsetof(PyThreadState, thread_id),
    offsetof(PyThreadState, {tstate_frame}),
    {cframe},
    offsetof(_PyInterpreterFrame, {frame_field}),
    offsetof(_PyInterpreterFrame, previous),
    offsetof(_PyInterpreterFrame, {entry_field}),
    offsetof(PyCodeObject, co_filename),
    offsetof(PyCodeObject, co_qualname),
    sizeof(PyASCIIObject),
    sizeof(PyCompactUnicodeObject),
    offsetof(PyASCIIObject, length),
    offsetof(PyASCIIObject, state),
    PY_MAJOR_VERSION, PY_MINOR_VERSION,
  }};
  for (unsigned i = 0; i < sizeof v / sizeof v[0]; i++) printf("%lu\n", v[i]);
  return 0;
}}
"#
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-layouts");
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let tag = include.to_string_lossy().replace('/', "_");
    let src = dir.join(format!("{tag}.c"));
    let exe = dir.join(&tag);
    std::fs::write(&src, program).expect("write the probe");
    let out = Command::new("cc")
        .arg("-I")
        .arg(include)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "the probe does not compile against {}: {}",
        include.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().expect("run the probe");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().expect("a number"))
        .collect()
}

fn ours(l: &Layout) -> Vec<u64> {
    vec![
        l.interp_main.into(),
        l.threads_head.into(),
        l.tstate_next.into(),
        l.tstate_thread_id.into(),
        l.tstate_frame.into(),
        l.cframe_frame.unwrap_or(0).into(),
        l.frame_code.into(),
        l.frame_previous.into(),
        l.frame_entry.into(),
        l.code_filename.into(),
        l.code_qualname.into(),
        l.ascii_size,
        l.compact_size,
        // read_str reads the length at 16 and the state bits at 32 in every version.
        16,
        32,
        l.version.0.into(),
        l.version.1.into(),
    ]
}

#[test]
fn layouts_match_the_installed_headers() {
    const TEST: &str = "layouts_match_the_installed_headers";
    let mut checked = 0;
    for l in &LAYOUTS {
        let dirs = header_dirs(l.version.1);
        if dirs.is_empty() {
            common::skip(
                TEST,
                &format!(
                    "no headers of CPython 3.{} (python3.{}-dev or pyenv's)",
                    l.version.1, l.version.1
                ),
            );
        }
        for d in dirs {
            assert_eq!(
                offsets_from_headers(&d, l),
                ours(l),
                "stacks::python::LAYOUTS for 3.{} disagrees with {}",
                l.version.1,
                d.display()
            );
            checked += 1;
        }
    }
    eprintln!("{checked} header sets checked");
}
