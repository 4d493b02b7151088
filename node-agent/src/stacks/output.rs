//! The formats profilers already speak: folded stacks (Brendan Gregg's, read by
//! flamegraph.pl, inferno, speedscope), an SVG flame graph (inferno), and pprof (Go's
//! `go tool pprof`, Pyroscope, Parca, Grafana).

use std::time::Duration;

use resourcewatch_proto::pprof;

use super::Stack;

/// One line per stack, root first, frames joined by `;`, then the count. Kernel frames
/// carry perf's `_[k]` suffix, which flame graph tools colour apart.
pub fn folded(stacks: &[Stack]) -> String {
    let mut out = String::new();
    for s in stacks {
        let user = s.frames.len() - s.kernel_frames;
        let names: Vec<String> = s
            .frames
            .iter()
            .enumerate()
            .map(|(i, f)| {
                // `;` separates frames and the last space the count: neither may appear in a
                // name (C++ and Rust names contain spaces: "{closure#0}", "operator new").
                let clean = f.replace(';', ":").replace(' ', "_");
                if i >= user {
                    format!("{clean}_[k]")
                } else {
                    clean
                }
            })
            .collect();
        out.push_str(&names.join(";"));
        out.push(' ');
        out.push_str(&s.value.to_string());
        out.push('\n');
    }
    out
}

/// An SVG flame graph of the stacks.
pub fn svg(stacks: &[Stack], title: &str, count_name: &str) -> std::io::Result<Vec<u8>> {
    let text = folded(stacks);
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_owned();
    opts.count_name = count_name.to_owned();
    let mut out = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, text.lines(), &mut out)?;
    Ok(out)
}

/// What a pprof profile's values are.
#[derive(Clone, Copy, Debug)]
pub struct PprofKind<'a> {
    /// e.g. ("samples", "count") and ("cpu", "nanoseconds").
    pub sample_type: &'a str,
    pub sample_unit: &'a str,
    /// A second value per sample, `value * scale` (CPU time from samples), if any.
    pub scaled: Option<(&'a str, &'a str, i64)>,
    pub duration: Duration,
}

/// A pprof sample label (its process, its pod...).
pub use resourcewatch_proto::pprof::Tag as Label;

/// A gzipped pprof protobuf (`profile.proto`) of the stacks, each sample carrying the
/// labels `labels` gives its stack (its process, its pod...) and each frame the file it
/// is in (pprof's mappings).
pub fn pprof(
    stacks: &[Stack],
    kind: PprofKind<'_>,
    labels: impl Fn(&Stack) -> Vec<Label>,
) -> std::io::Result<Vec<u8>> {
    let mut types = vec![(kind.sample_type, kind.sample_unit)];
    if let Some((t, u, _)) = kind.scaled {
        types.push((t, u));
    }
    let mut b = pprof::Builder::new(&types);
    for s in stacks {
        let mut value = vec![s.value as i64];
        if let Some((_, _, scale)) = kind.scaled {
            value.push((s.value as i64).saturating_mul(scale));
        }
        // pprof lists a sample's locations leaf first.
        let frames = s.frames.iter().enumerate().rev().map(|(i, f)| {
            let file = s
                .modules
                .get(i)
                .and_then(Option::as_ref)
                .map(|m| pprof::File {
                    path: &m.path,
                    build_id: m.build_id.as_deref(),
                });
            (f.as_str(), file)
        });
        b.sample(frames, value, labels(s));
    }
    let profile = b.finish(kind.duration, kind.scaled.map(|(t, u, p)| ((t, u), p)));
    pprof::gzip(&profile)
}

#[cfg(test)]
mod tests {
    use std::{io::Read, sync::Arc};

    use prost::{
        Message,
        encoding::{DecodeContext, WireType, decode_key, skip_field},
    };
    use resourcewatch_proto::pprof::Profile;

    use super::{super::Module, *};

    fn stacks() -> Vec<Stack> {
        let app = Some(Arc::new(Module {
            path: "/usr/bin/app".into(),
            build_id: Some("0badc0de".into()),
        }));
        vec![
            Stack {
                tgid: 1,
                comm: Some("app".into()),
                frames: vec![
                    "app".into(),
                    "main".into(),
                    "burn cpu;now".into(),
                    "clear_page".into(),
                ],
                modules: vec![
                    None,
                    app.clone(),
                    app.clone(),
                    Some(super::super::symbolize::kernel_module()),
                ],
                kernel_frames: 1,
                value: 90,
            },
            Stack {
                tgid: 1,
                comm: Some("app".into()),
                frames: vec!["app".into(), "main".into(), "idle".into()],
                modules: Vec::new(),
                kernel_frames: 0,
                value: 10,
            },
        ]
    }

    #[test]
    fn folded_lines_are_root_first_with_kernel_frames_marked() {
        assert_eq!(
            folded(&stacks()),
            "app;main;burn_cpu:now;clear_page_[k] 90\napp;main;idle 10\n"
        );
    }

    #[test]
    fn the_flame_graph_is_an_svg_naming_every_frame() {
        let svg = String::from_utf8(svg(&stacks(), "CPU", "samples").expect("svg")).expect("utf-8");
        assert!(svg.starts_with("<?xml"), "{}", &svg[..100]);
        for f in ["burn_cpu:now", "idle", "clear_page"] {
            assert!(svg.contains(f), "{f} missing");
        }
    }

    /// The field numbers and wire types at the top level of an encoded message, read
    /// with protobuf's wire format alone (no struct of ours), so a wrong tag in the
    /// encoder's derives can't check itself.
    fn top_level_fields(mut buf: &[u8]) -> std::collections::BTreeMap<u32, WireType> {
        let mut fields = std::collections::BTreeMap::new();
        while !buf.is_empty() {
            let (tag, wire) = decode_key(&mut buf).expect("key");
            skip_field(wire, tag, &mut buf, DecodeContext::default()).expect("field");
            fields.insert(tag, wire);
        }
        fields
    }

    #[test]
    fn pprof_decodes_to_the_same_stacks_leaf_first() {
        let gz = pprof(
            &stacks(),
            PprofKind {
                sample_type: "samples",
                sample_unit: "count",
                scaled: Some(("cpu", "nanoseconds", 10_101_010)),
                duration: Duration::from_secs(10),
            },
            |s| {
                vec![
                    Label::Number("pid", s.tgid.into()),
                    Label::Text("pod", "api-1".into()),
                ]
            },
        )
        .expect("pprof");
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut raw)
            .expect("gzip");
        // profile.proto: sample_type 1, sample 2, mapping 3, location 4, function 5,
        // string_table 6 (messages and strings: length-delimited), time_nanos 9,
        // duration_nanos 10, period_type 11 (a message), period 12.
        use WireType::{LengthDelimited as Len, Varint};
        assert_eq!(
            top_level_fields(&raw).into_iter().collect::<Vec<_>>(),
            [
                (1, Len),
                (2, Len),
                (3, Len),
                (4, Len),
                (5, Len),
                (6, Len),
                (9, Varint),
                (10, Varint),
                (11, Len),
                (12, Varint)
            ]
        );
        let p = Profile::decode(&raw[..]).expect("protobuf");
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.period, 10_101_010);
        let name = |loc: u64| {
            let l = p.location.iter().find(|l| l.id == loc).expect("location");
            let f = p
                .function
                .iter()
                .find(|f| f.id == l.line[0].function_id)
                .expect("function");
            p.string_table[f.name as usize].clone()
        };
        let first: Vec<String> = p.sample[0].location_id.iter().map(|&l| name(l)).collect();
        assert_eq!(first, ["clear_page", "burn cpu;now", "main", "app"]);
        // Each frame's file: the kernel's, the program's (with its build ID), none for
        // the command; a frame of no known file has none either.
        let file = |loc: u64| {
            let l = p.location.iter().find(|l| l.id == loc).expect("location");
            p.mapping.iter().find(|m| m.id == l.mapping_id).map(|m| {
                (
                    p.string_table[m.filename as usize].clone(),
                    p.string_table[m.build_id as usize].clone(),
                    m.has_functions,
                )
            })
        };
        let files: Vec<_> = p.sample[0].location_id.iter().map(|&l| file(l)).collect();
        let app = Some(("/usr/bin/app".to_owned(), "0badc0de".to_owned(), true));
        assert_eq!(
            files,
            [
                Some(("[kernel.kallsyms]".to_owned(), String::new(), true)),
                app.clone(),
                app,
                None
            ]
        );
        assert_eq!(p.mapping.len(), 2);
        // `main` of the program and `main` of no known file are two locations of one
        // function.
        assert_eq!(p.location.len(), 6);
        assert_eq!(p.function.len(), 5);
        assert_eq!(p.sample[0].value, [90, 909_090_900]);
        // Every sample's labels, by the string table.
        for sample in &p.sample {
            let labels: Vec<(String, String, i64)> = sample
                .label
                .iter()
                .map(|l| {
                    (
                        p.string_table[l.key as usize].clone(),
                        p.string_table[l.str as usize].clone(),
                        l.num,
                    )
                })
                .collect();
            assert_eq!(
                labels,
                [
                    ("pid".to_owned(), String::new(), 1),
                    ("pod".to_owned(), "api-1".to_owned(), 0)
                ]
            );
        }
    }
}
