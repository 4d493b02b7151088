//! pprof's `profile.proto`, the format of the profiles the agents send (CPU profiles) and
//! the tools write (growth sites as a memory profile), and a builder of it: both sides
//! agree on what a profile holds, so the operator can read one to pass it on (as OTLP).
//!
//! The messages are written as prost derives rather than generated from the .proto:
//! eight small messages, and the agent then needs no protoc for them. Field numbers are
//! the format's (github.com/google/pprof/proto/profile.proto), checked on the wire format
//! itself by the agent's tests and read back by `go tool pprof` (node-agent/tests/pprof.rs).

use std::collections::HashMap;

use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// Leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// A key with a text (`str`) or a numeric (`num`) value, both string table indexes but
/// `num`.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
}

/// A file the profiled code was in. Addresses are not kept, so the address range and
/// offset stay 0.
#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
}

/// A file a frame was in: its path and, when known, its GNU build ID in hex.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct File<'a> {
    pub path: &'a str,
    pub build_id: Option<&'a str>,
}

/// A sample label: text, or a number (`go tool pprof -tags` lists them, `-tagfocus`
/// filters on them; Pyroscope and Parca keep them as series labels).
#[derive(Clone, Debug, PartialEq)]
pub enum Tag {
    Text(&'static str, String),
    Number(&'static str, i64),
}

/// Builds a profile of named stacks: strings, functions, mappings and locations interned
/// (one location per function and file: the stacks are named already, addresses are not
/// kept).
#[derive(Default)]
pub struct Builder {
    profile: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<String, u64>,
    mappings: HashMap<(String, Option<String>), u64>,
    locations: HashMap<(String, u64), u64>,
}

impl Builder {
    /// A profile whose samples have the values `sample_types` ((type, unit), e.g.
    /// ("samples", "count"), ("cpu", "nanoseconds")).
    pub fn new(sample_types: &[(&str, &str)]) -> Self {
        let mut b = Self::default();
        b.string(""); // index 0 is the empty string, by the format's rule
        b.profile.sample_type = sample_types
            .iter()
            .map(|(t, u)| ValueType {
                r#type: b.string(t),
                unit: b.string(u),
            })
            .collect();
        b
    }

    /// The string's index in the string table.
    pub fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn mapping(&mut self, file: Option<File<'_>>) -> u64 {
        let Some(f) = file else { return 0 };
        let key = (f.path.to_owned(), f.build_id.map(str::to_owned));
        if let Some(&id) = self.mappings.get(&key) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1; // ids start at 1; 0 means none
        let filename = self.string(f.path);
        let build_id = f.build_id.map_or(0, |b| self.string(b));
        self.profile.mapping.push(Mapping {
            id,
            filename,
            build_id,
            // The frames are named already: a reader must not symbolize them again.
            has_functions: true,
            ..Default::default()
        });
        self.mappings.insert(key, id);
        id
    }

    fn function(&mut self, name: &str) -> u64 {
        if let Some(&id) = self.functions.get(name) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let name_index = self.string(name);
        self.profile.function.push(Function {
            id,
            name: name_index,
            system_name: name_index,
        });
        self.functions.insert(name.to_owned(), id);
        id
    }

    fn location(&mut self, name: &str, file: Option<File<'_>>) -> u64 {
        let mapping_id = self.mapping(file);
        if let Some(&id) = self.locations.get(&(name.to_owned(), mapping_id)) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        let function_id = self.function(name);
        self.profile.location.push(Location {
            id,
            mapping_id,
            line: vec![Line {
                function_id,
                line: 0,
            }],
        });
        self.locations.insert((name.to_owned(), mapping_id), id);
        id
    }

    /// Adds a sample: its frames leaf first, each with the file it is in, its values (one
    /// per sample type) and its labels.
    pub fn sample<'a>(
        &mut self,
        frames: impl IntoIterator<Item = (&'a str, Option<File<'a>>)>,
        value: Vec<i64>,
        tags: Vec<Tag>,
    ) {
        let location_id = frames
            .into_iter()
            .map(|(name, file)| self.location(name, file))
            .collect();
        let label = tags
            .into_iter()
            .map(|t| match t {
                Tag::Text(k, v) => Label {
                    key: self.string(k),
                    str: self.string(&v),
                    num: 0,
                },
                Tag::Number(k, n) => Label {
                    key: self.string(k),
                    str: 0,
                    num: n,
                },
            })
            .collect();
        self.profile.sample.push(Sample {
            location_id,
            value,
            label,
        });
    }

    /// The profile, over `duration` ending now; `period` ((type, unit), value) when the
    /// samples were taken at one.
    pub fn finish(
        mut self,
        duration: std::time::Duration,
        period: Option<((&str, &str), i64)>,
    ) -> Profile {
        if let Some(((t, u), p)) = period {
            self.profile.period_type = Some(ValueType {
                r#type: self.string(t),
                unit: self.string(u),
            });
            self.profile.period = p;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        self.profile.duration_nanos = duration.as_nanos() as i64;
        self.profile.time_nanos = now - self.profile.duration_nanos;
        self.profile
    }
}

/// The profile, gzipped (how pprof files are stored).
pub fn gzip(p: &Profile) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&p.encode_to_vec())?;
    gz.finish()
}

/// A gzipped (or plain) profile read back, with at most `max` bytes once inflated.
pub fn read(bytes: &[u8], max: u64) -> Result<Profile, String> {
    use std::io::Read;
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .take(max + 1)
            .read_to_end(&mut raw)
            .map_err(|e| format!("gzip: {e}"))?;
        if raw.len() as u64 > max {
            return Err(format!("over {max} bytes once inflated"));
        }
        raw
    } else {
        bytes.to_vec()
    };
    Profile::decode(&raw[..]).map_err(|e| format!("pprof: {e}"))
}

/// Where a leak's resident memory grew, as a memory profile: each growth site's frames
/// (leaf first) with the resident bytes its stack added while captured (sample type
/// `resident_growth`, `bytes`), every sample labelled `tags` (its pod and container).
pub fn growth<'a>(
    sites: impl IntoIterator<Item = (&'a [String], u64)>,
    tags: &[Tag],
    captured_for: std::time::Duration,
) -> Profile {
    let mut b = Builder::new(&[("resident_growth", "bytes")]);
    for (frames, bytes) in sites {
        b.sample(
            frames.iter().map(|f| (f.as_str(), None)),
            vec![i64::try_from(bytes).unwrap_or(i64::MAX)],
            tags.to_vec(),
        );
    }
    b.finish(captured_for, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_sites_are_a_memory_profile_read_back_the_same() {
        let sites = [
            (vec!["leak_here".to_owned(), "main".to_owned()], 48 << 20),
            (vec!["grow".to_owned(), "main".to_owned()], 16 << 20),
        ];
        let p = growth(
            sites.iter().map(|(f, b)| (f.as_slice(), *b)),
            &[Tag::Text("container", "app".into())],
            std::time::Duration::from_secs(30),
        );
        let back = read(&gzip(&p).expect("gzip"), 1 << 20).expect("read");
        assert_eq!(back, p);
        let s = |i: i64| back.string_table[i as usize].as_str();
        assert_eq!(s(back.sample_type[0].r#type), "resident_growth");
        assert_eq!(s(back.sample_type[0].unit), "bytes");
        assert_eq!(back.sample[0].value, [48 << 20]);
        let leaf = back.sample[0].location_id[0];
        let f = back.location[leaf as usize - 1].line[0].function_id;
        assert_eq!(s(back.function[f as usize - 1].name), "leak_here");
        // `main` is one function and one location in both stacks.
        assert_eq!(back.function.len(), 3);
        assert_eq!(back.sample[0].location_id[1], back.sample[1].location_id[1]);
        assert_eq!(s(back.sample[1].label[0].str), "app");
        assert!(
            read(&gzip(&p).expect("gzip"), 16).is_err(),
            "over the bound"
        );
    }
}
