//! The formats profilers already speak: folded stacks (Brendan Gregg's, read by
//! flamegraph.pl, inferno, speedscope), an SVG flame graph (inferno), and pprof (Go's
//! `go tool pprof`, Pyroscope, Parca, Grafana).

use std::{io::Write, sync::Arc, time::Duration};

use prost::Message;

use super::{Module, Stack};

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

/// A pprof sample label: text, or a number with its unit (`go tool pprof -tags` lists
/// them, `-tagfocus` filters on them; Pyroscope and Parca keep them as series labels).
#[derive(Clone, Debug, PartialEq)]
pub enum Label {
    Text(&'static str, String),
    Number(&'static str, i64),
}

/// A gzipped pprof protobuf (`profile.proto`) of the stacks, each sample carrying the
/// labels `labels` gives its stack (its process, its pod...).
pub fn pprof(
    stacks: &[Stack],
    kind: PprofKind<'_>,
    labels: impl Fn(&Stack) -> Vec<Label>,
) -> std::io::Result<Vec<u8>> {
    let mut b = PprofBuilder::default();
    b.string(""); // index 0 is the empty string, by the format's rule
    let mut sample_type = vec![ValueType {
        r#type: b.string(kind.sample_type),
        unit: b.string(kind.sample_unit),
    }];
    if let Some((t, u, _)) = kind.scaled {
        sample_type.push(ValueType {
            r#type: b.string(t),
            unit: b.string(u),
        });
    }
    let mut samples = Vec::new();
    for s in stacks {
        // pprof lists a sample's locations leaf first.
        let location_id = s
            .frames
            .iter()
            .enumerate()
            .rev()
            .map(|(i, f)| b.location(f, s.modules.get(i).and_then(Option::as_ref)))
            .collect();
        let mut value = vec![s.value as i64];
        if let Some((_, _, scale)) = kind.scaled {
            value.push((s.value as i64).saturating_mul(scale));
        }
        let label = labels(s)
            .into_iter()
            .map(|l| match l {
                Label::Text(k, v) => PprofLabel {
                    key: b.string(k),
                    str: b.string(&v),
                    num: 0,
                },
                Label::Number(k, n) => PprofLabel {
                    key: b.string(k),
                    str: 0,
                    num: n,
                },
            })
            .collect();
        samples.push(Sample {
            location_id,
            value,
            label,
        });
    }
    let period_type = kind.scaled.map(|(t, u, _)| ValueType {
        r#type: b.string(t),
        unit: b.string(u),
    });
    let profile = Profile {
        sample_type,
        sample: samples,
        mapping: b.mappings,
        location: b.locations,
        function: b.functions,
        string_table: b.strings,
        time_nanos: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64)
            - kind.duration.as_nanos() as i64,
        duration_nanos: kind.duration.as_nanos() as i64,
        period: kind.scaled.map_or(0, |(_, _, p)| p),
        period_type,
    };
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()
}

/// Interns strings, functions, mappings and locations (one location per function and
/// file: the stacks are already named, addresses are not kept).
#[derive(Default)]
struct PprofBuilder {
    strings: Vec<String>,
    string_ids: std::collections::HashMap<String, i64>,
    functions: Vec<Function>,
    function_ids: std::collections::HashMap<String, u64>,
    mappings: Vec<Mapping>,
    mapping_ids: std::collections::HashMap<Arc<Module>, u64>,
    locations: Vec<Location>,
    location_ids: std::collections::HashMap<(String, u64), u64>,
}

impl PprofBuilder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.string_ids.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.string_ids.insert(s.to_owned(), i);
        i
    }

    /// The mapping of a file (0: none).
    fn mapping(&mut self, module: Option<&Arc<Module>>) -> u64 {
        let Some(m) = module else { return 0 };
        if let Some(&id) = self.mapping_ids.get(m) {
            return id;
        }
        let id = self.mappings.len() as u64 + 1; // ids start at 1; 0 means none
        let filename = self.string(&m.path);
        let build_id = m.build_id.as_deref().map_or(0, |b| self.string(b));
        self.mappings.push(Mapping {
            id,
            filename,
            build_id,
            // The frames are named already: a reader must not symbolize them again.
            has_functions: true,
            ..Default::default()
        });
        self.mapping_ids.insert(m.clone(), id);
        id
    }

    fn function(&mut self, frame: &str) -> u64 {
        if let Some(&id) = self.function_ids.get(frame) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let name = self.string(frame);
        self.functions.push(Function {
            id,
            name,
            system_name: name,
        });
        self.function_ids.insert(frame.to_owned(), id);
        id
    }

    fn location(&mut self, frame: &str, module: Option<&Arc<Module>>) -> u64 {
        let mapping_id = self.mapping(module);
        if let Some(&id) = self.location_ids.get(&(frame.to_owned(), mapping_id)) {
            return id;
        }
        let id = self.locations.len() as u64 + 1;
        let function_id = self.function(frame);
        self.locations.push(Location {
            id,
            mapping_id,
            line: vec![Line {
                function_id,
                line: 0,
            }],
        });
        self.location_ids.insert((frame.to_owned(), mapping_id), id);
        id
    }
}

// The messages of pprof's profile.proto that are written, with its field numbers. Written
// as prost derives rather than generated from the .proto: eight small messages, and the
// agent then needs no protoc at build time for them. Field numbers are the format's
// (github.com/google/pprof/proto/profile.proto), checked by the test below on the wire
// format itself.
#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    time_nanos: i64,
    #[prost(int64, tag = "10")]
    duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    period: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    label: Vec<PprofLabel>,
}

/// pprof's `Label`: a key with a text (`str`) or a numeric (`num`) value, both string
/// table indexes but `num`.
#[derive(Clone, PartialEq, Message)]
struct PprofLabel {
    #[prost(int64, tag = "1")]
    key: i64,
    #[prost(int64, tag = "2")]
    str: i64,
    #[prost(int64, tag = "3")]
    num: i64,
}

/// pprof's `Mapping`: a file the profiled code was in. Addresses are not kept, so the
/// address range and offset stay 0.
#[derive(Clone, PartialEq, Message)]
struct Mapping {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "2")]
    memory_start: u64,
    #[prost(uint64, tag = "3")]
    memory_limit: u64,
    #[prost(uint64, tag = "4")]
    file_offset: u64,
    #[prost(int64, tag = "5")]
    filename: i64,
    #[prost(int64, tag = "6")]
    build_id: i64,
    #[prost(bool, tag = "7")]
    has_functions: bool,
}

#[derive(Clone, PartialEq, Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "2")]
    mapping_id: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
    #[prost(int64, tag = "2")]
    line: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
    #[prost(int64, tag = "3")]
    system_name: i64,
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use prost::encoding::{DecodeContext, WireType, decode_key, skip_field};

    use super::*;

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
