//! Profiles sent where profilers go: each CPU profile the operator stores is also sent as
//! an OTLP profile (OpenTelemetry's `ProfilesService/Export`, gRPC) to the collector the
//! cluster admin names in the Secret [`SECRET`] of the operator's namespace:
//!
//! | key | |
//! | --- | --- |
//! | `endpoint` | `http://host:4317` (plain) or `https://host:4317` (TLS); required |
//! | `ca.crt` | the CA that signs the collector's certificate (else the system's roots) |
//! | `tls.crt`, `tls.key` | a client certificate, when the collector asks for one |
//! | `headers` | one `name: value` per line (e.g. `authorization: Bearer ...`) |
//!
//! The Secret is read at each export, so creating, changing or deleting it takes effect
//! from the next profile, without a restart; without it nothing is sent. One connection
//! is kept while the Secret is unchanged. Requests are gzipped. An export a collector
//! could take later (unreachable, UNAVAILABLE, DEADLINE_EXCEEDED and the other codes
//! OTLP calls retryable) is tried again after 1, 2, 4 and 8 s, within a minute: a
//! collector's restart loses nothing. A send never delays a reconcile, and is counted by
//! result in `resourcewatch_operator_otlp_exports_total` (a collector keeping only part
//! of it, its `partial_success`, as `partial`).
//!
//! So are each leak's growth sites, once a site is announced (`LeakDetected` or
//! `LeakSiteFound`), as a memory profile: the resident bytes each stack added
//! (`resident_growth`, `bytes`).
//!
//! The profile is the agent's pprof translated: its functions, files (with GNU build IDs)
//! and samples, the pod as resource attributes (`k8s.namespace.name`, `k8s.pod.name`,
//! `k8s.node.name`) and each sample's container, process and PID as attributes, named
//! by OpenTelemetry's semantic conventions.

use std::{collections::HashMap, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use resourcewatch_proto::pprof;

use crate::metrics::Metrics;

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod opentelemetry {
    pub mod proto {
        pub mod common {
            pub mod v1 {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.common.v1.rs"
                ));
            }
        }
        pub mod resource {
            pub mod v1 {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.resource.v1.rs"
                ));
            }
        }
        pub mod profiles {
            pub mod v1development {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.profiles.v1development.rs"
                ));
            }
        }
        pub mod collector {
            pub mod profiles {
                pub mod v1development {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.collector.profiles.v1development.rs"
                    ));
                }
            }
        }
    }
}

use opentelemetry::proto::{
    collector::profiles::v1development::{
        ExportProfilesServiceRequest, ExportProfilesServiceResponse,
        profiles_service_client::ProfilesServiceClient,
    },
    common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value},
    profiles::v1development as otlp,
    resource::v1::Resource,
};

/// The Secret naming the collector, in the operator's namespace.
pub const SECRET: &str = "resourcewatch-otlp";
/// How long one attempt may take, connecting included.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an export may take, its retries included.
const EXPORT_DEADLINE: Duration = Duration::from_secs(60);
/// The waits before the second, third... attempt.
const RETRY_AFTER: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];
/// The largest profile translated (inflated pprof bytes): the agent's are far smaller.
const MAX_PPROF_BYTES: u64 = 16 << 20;

/// A profile to send: as the agent sent it (gzipped pprof), or made here.
pub enum Source {
    Pprof(Vec<u8>),
    Profile(pprof::Profile),
}

/// Where the pod a profile is of runs: the OTLP resource.
#[derive(Clone, Debug, Default)]
pub struct PodRef {
    pub namespace: String,
    pub pod: String,
    pub node: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("the Secret {SECRET}")]
    Secret(#[source] kube::Error),
    #[error("the Secret {SECRET} has no endpoint")]
    NoEndpoint,
    #[error("the Secret {SECRET}: {0}")]
    BadSecret(String),
    #[error("the collector at {endpoint}")]
    Transport {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("the collector refused the profile")]
    Refused(#[source] tonic::Status),
    #[error("the collector did not take the profile within {EXPORT_DEADLINE:?}")]
    Timeout,
    #[error("the profile cannot be read: {0}")]
    Profile(String),
}

impl ExportError {
    fn result(&self) -> &'static str {
        match self {
            Self::Secret(_) | Self::NoEndpoint | Self::BadSecret(_) => "misconfigured",
            Self::Refused(_) => "refused",
            Self::Profile(_) => "unreadable",
            Self::Transport { .. } | Self::Timeout => "failed",
        }
    }
}

/// Sends profiles to the collector the Secret names.
#[derive(Clone)]
pub struct Exporter {
    secrets: Api<Secret>,
    metrics: Arc<Metrics>,
    sender: Sender,
}

/// What a collector said of a profile it took.
#[derive(Debug, PartialEq)]
enum Delivered {
    All,
    /// Its `partial_success`: how many profiles it dropped, and why.
    Part {
        rejected: i64,
        message: String,
    },
}

impl Exporter {
    pub fn new(client: Client, namespace: &str, metrics: Arc<Metrics>) -> Self {
        Self {
            secrets: Api::namespaced(client, namespace),
            metrics,
            sender: Sender::default(),
        }
    }

    /// Sends the profile of `pod` in the background, if a collector is configured.
    pub fn send(&self, profile: Source, pod: PodRef) {
        let this = self.clone();
        tokio::spawn(async move {
            let result =
                match tokio::time::timeout(EXPORT_DEADLINE, this.export(profile, &pod)).await {
                    Ok(r) => r,
                    Err(_) => Err(ExportError::Timeout),
                };
            match result {
                Ok(None) => {}
                Ok(Some((endpoint, Delivered::All))) => {
                    tracing::info!(%endpoint, pod = %pod.pod, "sent a profile over OTLP");
                    this.metrics.otlp_export("sent");
                }
                Ok(Some((endpoint, Delivered::Part { rejected, message }))) => {
                    tracing::warn!(%endpoint, pod = %pod.pod, rejected, %message, "the OTLP collector kept part of a profile");
                    this.metrics.otlp_export("partial");
                }
                Err(e) => {
                    tracing::warn!(pod = %pod.pod, error = %resourcewatch_runtime::error_chain(&e), "could not send a profile over OTLP");
                    this.metrics.otlp_export(e.result());
                }
            }
        });
    }

    /// The endpoint it was sent to and what the collector said; None when no collector is
    /// configured.
    async fn export(
        &self,
        profile: Source,
        pod: &PodRef,
    ) -> Result<Option<(String, Delivered)>, ExportError> {
        let Some(secret) = self
            .secrets
            .get_opt(SECRET)
            .await
            .map_err(ExportError::Secret)?
        else {
            return Ok(None);
        };
        let config = Config::of(&secret)?;
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        let profile = match profile {
            Source::Pprof(gz) => pprof::read(&gz, MAX_PPROF_BYTES).map_err(ExportError::Profile)?,
            Source::Profile(p) => p,
        };
        let request = translate(&profile, pod, profile_id());
        let delivered = self.sender.deliver(&config, &version, request).await?;
        Ok(Some((config.endpoint, delivered)))
    }
}

/// The connection to the collector, kept while its Secret is unchanged (by its
/// resourceVersion), and the retries of an export.
#[derive(Clone, Default)]
struct Sender {
    channel: Arc<tokio::sync::Mutex<Option<(String, tonic::transport::Channel)>>>,
}

impl Sender {
    async fn channel(
        &self,
        config: &Config,
        version: &str,
    ) -> Result<tonic::transport::Channel, ExportError> {
        let mut kept = self.channel.lock().await;
        if let Some((v, c)) = kept.as_ref()
            && v == version
        {
            return Ok(c.clone());
        }
        let channel =
            config
                .endpoint()?
                .connect()
                .await
                .map_err(|source| ExportError::Transport {
                    endpoint: config.endpoint.clone(),
                    source,
                })?;
        *kept = Some((version.to_owned(), channel.clone()));
        Ok(channel)
    }

    /// Sends `request`, trying again after `RETRY_AFTER` while what failed may pass later.
    async fn deliver(
        &self,
        config: &Config,
        version: &str,
        request: ExportProfilesServiceRequest,
    ) -> Result<Delivered, ExportError> {
        let mut waits = RETRY_AFTER.iter();
        loop {
            let err = match self.attempt(config, version, request.clone()).await {
                Ok(r) => {
                    return Ok(match r.partial_success {
                        Some(p) if p.rejected_profiles > 0 || !p.error_message.is_empty() => {
                            Delivered::Part {
                                rejected: p.rejected_profiles,
                                message: p.error_message.chars().take(300).collect(),
                            }
                        }
                        _ => Delivered::All,
                    });
                }
                Err(e) => e,
            };
            let retryable = match &err {
                // Not connected: a new connection next time.
                ExportError::Transport { .. } | ExportError::Timeout => {
                    *self.channel.lock().await = None;
                    true
                }
                // OTLP's retryable codes (RESOURCE_EXHAUSTED only with a RetryInfo, which
                // is not read here: not retried).
                ExportError::Refused(s) => matches!(
                    s.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::DeadlineExceeded
                        | tonic::Code::Aborted
                        | tonic::Code::Cancelled
                        | tonic::Code::OutOfRange
                        | tonic::Code::DataLoss
                ),
                _ => false,
            };
            match waits.next() {
                Some(wait) if retryable => {
                    tracing::debug!(endpoint = %config.endpoint, error = %resourcewatch_runtime::error_chain(&err), "OTLP export: trying again in {wait:?}");
                    tokio::time::sleep(*wait).await;
                }
                _ => return Err(err),
            }
        }
    }

    async fn attempt(
        &self,
        config: &Config,
        version: &str,
        request: ExportProfilesServiceRequest,
    ) -> Result<ExportProfilesServiceResponse, ExportError> {
        let once = async {
            let channel = self.channel(config, version).await?;
            let headers = config.headers.clone();
            let mut client = ProfilesServiceClient::with_interceptor(
                channel,
                move |mut req: tonic::Request<()>| {
                    for (k, v) in &headers {
                        req.metadata_mut().insert(k.clone(), v.clone());
                    }
                    Ok(req)
                },
            )
            .send_compressed(tonic::codec::CompressionEncoding::Gzip);
            client
                .export(request)
                .await
                .map(tonic::Response::into_inner)
                .map_err(ExportError::Refused)
        };
        tokio::time::timeout(EXPORT_TIMEOUT, once)
            .await
            .unwrap_or(Err(ExportError::Timeout))
    }
}

/// The collector as the Secret describes it.
struct Config {
    endpoint: String,
    ca: Option<String>,
    identity: Option<(String, String)>,
    headers: Vec<(
        tonic::metadata::MetadataKey<tonic::metadata::Ascii>,
        tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    )>,
}

impl Config {
    fn of(secret: &Secret) -> Result<Self, ExportError> {
        let get = |k: &str| -> Result<Option<String>, ExportError> {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|v| {
                    String::from_utf8(v.0.clone())
                        .map_err(|_| ExportError::BadSecret(format!("{k} is not UTF-8")))
                })
                .transpose()
        };
        let endpoint = get("endpoint")?
            .map(|e| e.trim().to_owned())
            .filter(|e| !e.is_empty())
            .ok_or(ExportError::NoEndpoint)?;
        let identity = match (get("tls.crt")?, get("tls.key")?) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                return Err(ExportError::BadSecret(
                    "tls.crt and tls.key go together".into(),
                ));
            }
        };
        let headers = get("headers")?
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let (k, v) = l.split_once(':').ok_or_else(|| {
                    ExportError::BadSecret(format!("a header without ':' ({})", first_word(l)))
                })?;
                let key =
                    k.trim().to_ascii_lowercase().parse().map_err(|_| {
                        ExportError::BadSecret(format!("header name {:?}", k.trim()))
                    })?;
                let value = v.trim().parse().map_err(|_| {
                    ExportError::BadSecret(format!("the value of header {:?}", k.trim()))
                })?;
                Ok((key, value))
            })
            .collect::<Result<_, ExportError>>()?;
        Ok(Self {
            endpoint,
            ca: get("ca.crt")?,
            identity,
            headers,
        })
    }

    fn endpoint(&self) -> Result<tonic::transport::Endpoint, ExportError> {
        let transport = |source| ExportError::Transport {
            endpoint: self.endpoint.clone(),
            source,
        };
        let mut e = tonic::transport::Endpoint::from_shared(self.endpoint.clone())
            .map_err(transport)?
            .connect_timeout(EXPORT_TIMEOUT)
            .timeout(EXPORT_TIMEOUT);
        if self.endpoint.starts_with("https://") {
            let mut tls = tonic::transport::ClientTlsConfig::new().with_enabled_roots();
            if let Some(ca) = &self.ca {
                tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(ca));
            }
            if let Some((c, k)) = &self.identity {
                tls = tls.identity(tonic::transport::Identity::from_pem(c, k));
            }
            e = e.tls_config(tls).map_err(transport)?;
        }
        Ok(e)
    }
}

/// A header line's first word, for an error that must not echo a credential.
fn first_word(l: &str) -> String {
    l.split_whitespace()
        .next()
        .unwrap_or("")
        .chars()
        .take(20)
        .collect()
}

fn profile_id() -> Vec<u8> {
    let mut id = [0u8; 16];
    // An all-zero ID is invalid in OTLP; the system's randomness does not fail here.
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut id);
    id.to_vec()
}

/// The semantic-convention name of an agent's pprof label.
fn attribute_key(label: &str) -> &str {
    match label {
        "namespace" => "k8s.namespace.name",
        "pod" => "k8s.pod.name",
        "container" => "k8s.container.name",
        "node" => "k8s.node.name",
        "pid" => "process.pid",
        "process" => "process.executable.name",
        other => other,
    }
}

/// The pprof profile as an OTLP export request: one resource (the pod), one scope, one
/// profile of the first sample type, the dictionary built from pprof's tables (index 0 of
/// every table is its zero value, as OTLP requires; pprof's string table already starts
/// with "").
pub fn translate(p: &pprof::Profile, pod: &PodRef, id: Vec<u8>) -> ExportProfilesServiceRequest {
    let mut d = Dictionary::new(p);
    let mappings: HashMap<u64, i32> = p
        .mapping
        .iter()
        .map(|m| {
            let mut attribute_indices = Vec::new();
            if m.build_id != 0 {
                let build_id = d.text(m.build_id);
                attribute_indices
                    .push(d.attribute("process.executable.build_id.gnu", string(build_id)));
            }
            let i = d.push_mapping(otlp::Mapping {
                filename_strindex: m.filename as i32,
                attribute_indices,
                ..Default::default()
            });
            (m.id, i)
        })
        .collect();
    let functions: HashMap<u64, i32> = p
        .function
        .iter()
        .map(|f| {
            let i = d.push_function(otlp::Function {
                name_strindex: f.name as i32,
                system_name_strindex: f.system_name as i32,
                ..Default::default()
            });
            (f.id, i)
        })
        .collect();
    let locations: HashMap<u64, i32> = p
        .location
        .iter()
        .map(|l| {
            let i = d.push_location(otlp::Location {
                mapping_index: mappings.get(&l.mapping_id).copied().unwrap_or(0),
                lines: l
                    .line
                    .iter()
                    .map(|line| otlp::Line {
                        function_index: functions.get(&line.function_id).copied().unwrap_or(0),
                        line: line.line,
                        column: 0,
                    })
                    .collect(),
                ..Default::default()
            });
            (l.id, i)
        })
        .collect();
    let samples = p
        .sample
        .iter()
        .map(|s| {
            let stack = s
                .location_id
                .iter()
                .map(|l| locations.get(l).copied().unwrap_or(0))
                .collect();
            let attribute_indices = s
                .label
                .iter()
                .map(|l| {
                    let key = attribute_key(&d.text(l.key)).to_owned();
                    let value = if l.str != 0 {
                        string(d.text(l.str))
                    } else {
                        any_value::Value::IntValue(l.num)
                    };
                    d.attribute(&key, value)
                })
                .collect();
            otlp::Sample {
                stack_index: d.stack(stack),
                attribute_indices,
                values: s.value.first().copied().into_iter().collect(),
                ..Default::default()
            }
        })
        .collect();
    let value_type = |v: &pprof::ValueType| otlp::ValueType {
        type_strindex: v.r#type as i32,
        unit_strindex: v.unit as i32,
    };
    let profile = otlp::Profile {
        sample_type: p.sample_type.first().map(value_type),
        samples,
        time_unix_nano: p.time_nanos.max(0) as u64,
        duration_nano: p.duration_nanos.max(0) as u64,
        period_type: p.period_type.as_ref().map(value_type),
        period: p.period,
        profile_id: id,
        ..Default::default()
    };
    let text = |k: &str, v: &str| KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(string(v.to_owned())),
        }),
        ..Default::default()
    };
    ExportProfilesServiceRequest {
        resource_profiles: vec![otlp::ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![
                    text("k8s.namespace.name", &pod.namespace),
                    text("k8s.pod.name", &pod.pod),
                    text("k8s.node.name", &pod.node),
                ],
                ..Default::default()
            }),
            scope_profiles: vec![otlp::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "resourcewatch".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                profiles: vec![profile],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(d.finish()),
    }
}

fn string(s: String) -> any_value::Value {
    any_value::Value::StringValue(s)
}

/// The dictionary being built, its strings starting as pprof's.
struct Dictionary {
    d: otlp::ProfilesDictionary,
    strings: HashMap<String, i32>,
    attributes: HashMap<(i32, String), i32>,
    stacks: HashMap<Vec<i32>, i32>,
}

impl Dictionary {
    fn new(p: &pprof::Profile) -> Self {
        let mut string_table = p.string_table.clone();
        if string_table.first().is_none_or(|s| !s.is_empty()) {
            string_table.insert(0, String::new());
        }
        let strings = string_table
            .iter()
            .enumerate()
            .map(|(i, s)| (s.clone(), i as i32))
            .collect();
        Self {
            d: otlp::ProfilesDictionary {
                mapping_table: vec![otlp::Mapping::default()],
                location_table: vec![otlp::Location::default()],
                function_table: vec![otlp::Function::default()],
                link_table: vec![otlp::Link::default()],
                string_table,
                attribute_table: vec![otlp::KeyValueAndUnit::default()],
                stack_table: vec![otlp::Stack::default()],
            },
            strings,
            attributes: HashMap::new(),
            stacks: HashMap::new(),
        }
    }

    fn text(&self, i: i64) -> String {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.d.string_table.get(i))
            .cloned()
            .unwrap_or_default()
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.d.string_table.len() as i32;
        self.d.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn attribute(&mut self, key: &str, value: any_value::Value) -> i32 {
        let key_strindex = self.string(key);
        let id = (key_strindex, format!("{value:?}"));
        if let Some(&i) = self.attributes.get(&id) {
            return i;
        }
        let i = self.d.attribute_table.len() as i32;
        self.d.attribute_table.push(otlp::KeyValueAndUnit {
            key_strindex,
            value: Some(AnyValue { value: Some(value) }),
            unit_strindex: 0,
        });
        self.attributes.insert(id, i);
        i
    }

    fn stack(&mut self, location_indices: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&location_indices) {
            return i;
        }
        let i = self.d.stack_table.len() as i32;
        self.stacks.insert(location_indices.clone(), i);
        self.d.stack_table.push(otlp::Stack { location_indices });
        i
    }

    fn push_mapping(&mut self, m: otlp::Mapping) -> i32 {
        self.d.mapping_table.push(m);
        self.d.mapping_table.len() as i32 - 1
    }

    fn push_function(&mut self, f: otlp::Function) -> i32 {
        self.d.function_table.push(f);
        self.d.function_table.len() as i32 - 1
    }

    fn push_location(&mut self, l: otlp::Location) -> i32 {
        self.d.location_table.push(l);
        self.d.location_table.len() as i32 - 1
    }

    fn finish(self) -> otlp::ProfilesDictionary {
        self.d
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    use opentelemetry::proto::collector::profiles::v1development::{
        ExportProfilesPartialSuccess,
        profiles_service_server::{ProfilesService, ProfilesServiceServer},
    };
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A collector that answers UNAVAILABLE `fail` times (a restart), then takes the
    /// profile, keeping `reject` of it; it counts calls, connections and gzipped requests.
    #[derive(Clone, Default)]
    struct Collector {
        fail: usize,
        reject: i64,
        code: Option<tonic::Code>,
        calls: Arc<AtomicUsize>,
        gzipped: Arc<AtomicUsize>,
        connections: Arc<AtomicUsize>,
    }

    #[tonic::async_trait]
    impl ProfilesService for Collector {
        async fn export(
            &self,
            req: tonic::Request<ExportProfilesServiceRequest>,
        ) -> Result<tonic::Response<ExportProfilesServiceResponse>, tonic::Status> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            if req
                .metadata()
                .get("grpc-encoding")
                .is_some_and(|v| v == "gzip")
            {
                self.gzipped.fetch_add(1, Ordering::SeqCst);
            }
            if n < self.fail {
                let code = self.code.unwrap_or(tonic::Code::Unavailable);
                return Err(tonic::Status::new(code, "restarting"));
            }
            Ok(tonic::Response::new(ExportProfilesServiceResponse {
                partial_success: (self.reject > 0).then(|| ExportProfilesPartialSuccess {
                    rejected_profiles: self.reject,
                    error_message: "too many samples".into(),
                }),
            }))
        }
    }

    async fn serve(c: Collector) -> Config {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = c.connections.clone();
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            move |conn| {
                connections.fetch_add(1, Ordering::SeqCst);
                conn
            },
        );
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(
                    ProfilesServiceServer::new(c)
                        .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
                )
                .serve_with_incoming(incoming),
        );
        let secret = Secret {
            data: Some(
                [(
                    "endpoint".to_owned(),
                    k8s_openapi::ByteString(format!("http://{addr}").into_bytes()),
                )]
                .into(),
            ),
            ..Default::default()
        };
        Config::of(&secret).unwrap()
    }

    /// A collector restarting (two UNAVAILABLE answers) loses nothing: the export is tried
    /// again, gzipped each time, over the one connection kept while the Secret is
    /// unchanged; a second export reuses it.
    #[tokio::test]
    async fn an_export_outlives_a_collector_restart_over_one_kept_connection() {
        tokio::time::pause();
        let c = Collector {
            fail: 2,
            ..Default::default()
        };
        let config = serve(c.clone()).await;
        let sender = Sender::default();
        let req = ExportProfilesServiceRequest::default();
        assert_eq!(
            sender.deliver(&config, "1", req.clone()).await.unwrap(),
            Delivered::All
        );
        assert_eq!(c.calls.load(Ordering::SeqCst), 3);
        assert_eq!(c.gzipped.load(Ordering::SeqCst), 3, "every request gzipped");
        assert_eq!(
            sender.deliver(&config, "1", req.clone()).await.unwrap(),
            Delivered::All
        );
        assert_eq!(
            c.connections.load(Ordering::SeqCst),
            1,
            "one connection kept"
        );
        // A changed Secret (another resourceVersion): a new connection.
        assert_eq!(
            sender.deliver(&config, "2", req).await.unwrap(),
            Delivered::All
        );
        assert_eq!(c.connections.load(Ordering::SeqCst), 2);
    }

    /// A collector keeping part of a profile says so (its partial_success); one refusing
    /// it for good (INVALID_ARGUMENT) is not asked again; one never back is given up on
    /// after the retries.
    #[tokio::test]
    async fn partial_success_and_refusals_are_told_apart() {
        tokio::time::pause();
        let partial = Collector {
            reject: 3,
            ..Default::default()
        };
        let config = serve(partial.clone()).await;
        let req = ExportProfilesServiceRequest::default();
        assert_eq!(
            Sender::default()
                .deliver(&config, "1", req.clone())
                .await
                .unwrap(),
            Delivered::Part {
                rejected: 3,
                message: "too many samples".into()
            }
        );
        let invalid = Collector {
            fail: usize::MAX,
            code: Some(tonic::Code::InvalidArgument),
            ..Default::default()
        };
        let config = serve(invalid.clone()).await;
        let err = Sender::default()
            .deliver(&config, "1", req.clone())
            .await
            .unwrap_err();
        assert_eq!(err.result(), "refused");
        assert_eq!(invalid.calls.load(Ordering::SeqCst), 1, "not retried");
        let down = Collector {
            fail: usize::MAX,
            ..Default::default()
        };
        let config = serve(down.clone()).await;
        let err = Sender::default()
            .deliver(&config, "1", req)
            .await
            .unwrap_err();
        assert_eq!(err.result(), "refused");
        assert_eq!(
            down.calls.load(Ordering::SeqCst),
            RETRY_AFTER.len() + 1,
            "tried once and after each wait"
        );
    }

    /// A pprof as the agent makes it (two stacks, a file with its build ID, labels) read
    /// back from OTLP's tables: the same stacks, leaf first, the same functions and files,
    /// the labels under their semantic-convention names.
    #[test]
    fn a_pprof_translates_to_the_same_stacks_and_attributes() {
        let mut b = pprof::Builder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
        let app = Some(pprof::File {
            path: "/app",
            build_id: Some("0badc0de"),
        });
        b.sample(
            [("burn_here", app), ("main", app), ("app", None)],
            vec![90, 909],
            vec![
                pprof::Tag::Number("pid", 42),
                pprof::Tag::Text("container", "main".into()),
            ],
        );
        b.sample(
            [("idle", app), ("main", app), ("app", None)],
            vec![10, 101],
            vec![pprof::Tag::Number("pid", 42)],
        );
        let p = b.finish(
            Duration::from_secs(5),
            Some((("cpu", "nanoseconds"), 10_101_010)),
        );
        let pod = PodRef {
            namespace: "team-a".into(),
            pod: "api-1".into(),
            node: "n1".into(),
        };
        let r = translate(&p, &pod, vec![7; 16]);
        let d = r.dictionary.as_ref().unwrap();
        let s = |i: i32| d.string_table[i as usize].as_str();
        for t in [&d.mapping_table[0], &otlp::Mapping::default()] {
            assert_eq!(t, &otlp::Mapping::default());
        }
        assert_eq!(d.string_table[0], "");
        let rp = &r.resource_profiles[0];
        let resource: Vec<(String, String)> = rp
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .map(|kv| {
                let Some(any_value::Value::StringValue(v)) =
                    kv.value.as_ref().and_then(|v| v.value.clone())
                else {
                    panic!("{kv:?}")
                };
                (kv.key.clone(), v)
            })
            .collect();
        assert_eq!(
            resource,
            [
                ("k8s.namespace.name".into(), "team-a".into()),
                ("k8s.pod.name".into(), "api-1".into()),
                ("k8s.node.name".into(), "n1".into())
            ]
        );
        let profile = &rp.scope_profiles[0].profiles[0];
        assert_eq!(s(profile.sample_type.unwrap().type_strindex), "samples");
        assert_eq!(s(profile.period_type.unwrap().unit_strindex), "nanoseconds");
        assert_eq!(profile.period, 10_101_010);
        assert_eq!(profile.profile_id, vec![7; 16]);
        let frames = |sample: &otlp::Sample| -> Vec<(String, String)> {
            d.stack_table[sample.stack_index as usize]
                .location_indices
                .iter()
                .map(|&l| {
                    let loc = &d.location_table[l as usize];
                    let f = &d.function_table[loc.lines[0].function_index as usize];
                    let file = s(d.mapping_table[loc.mapping_index as usize].filename_strindex);
                    (s(f.name_strindex).to_owned(), file.to_owned())
                })
                .collect()
        };
        let first = &profile.samples[0];
        assert_eq!(
            frames(first),
            [
                ("burn_here".into(), "/app".into()),
                ("main".into(), "/app".into()),
                ("app".into(), String::new())
            ]
        );
        assert_eq!(first.values, [90]);
        let attrs: Vec<(String, String)> = first
            .attribute_indices
            .iter()
            .map(|&i| {
                let a = &d.attribute_table[i as usize];
                (
                    s(a.key_strindex).to_owned(),
                    format!("{:?}", a.value.as_ref().unwrap().value.as_ref().unwrap()),
                )
            })
            .collect();
        assert_eq!(
            attrs,
            [
                ("process.pid".into(), "IntValue(42)".into()),
                ("k8s.container.name".into(), "StringValue(\"main\")".into())
            ]
        );
        // The file's build ID is an attribute of its mapping.
        let app = d
            .mapping_table
            .iter()
            .find(|m| s(m.filename_strindex) == "/app")
            .unwrap();
        let a = &d.attribute_table[app.attribute_indices[0] as usize];
        assert_eq!(s(a.key_strindex), "process.executable.build_id.gnu");
        // The shared stack prefix is not the same stack: two stacks, plus the zero one.
        assert_eq!(d.stack_table.len(), 3);
        assert_ne!(
            profile.samples[0].stack_index,
            profile.samples[1].stack_index
        );
    }

    #[test]
    fn the_secret_gives_endpoint_tls_and_headers_and_a_bad_one_says_why() {
        let secret = |pairs: &[(&str, &str)]| Secret {
            data: Some(
                pairs
                    .iter()
                    .map(|(k, v)| {
                        (
                            (*k).to_owned(),
                            k8s_openapi::ByteString(v.as_bytes().to_vec()),
                        )
                    })
                    .collect(),
            ),
            ..Default::default()
        };
        let c = Config::of(&secret(&[
            ("endpoint", " http://collector:4317\n"),
            (
                "headers",
                "Authorization: Bearer s3cret\n\nx-scope-orgid: team-a",
            ),
        ]))
        .unwrap();
        assert_eq!(c.endpoint, "http://collector:4317");
        assert_eq!(c.headers.len(), 2);
        assert_eq!(c.headers[0].0.as_str(), "authorization");
        assert!(c.endpoint().is_ok());
        assert!(matches!(
            Config::of(&secret(&[])),
            Err(ExportError::NoEndpoint)
        ));
        let Err(ExportError::BadSecret(why)) = Config::of(&secret(&[
            ("endpoint", "http://c:4317"),
            ("headers", "Bearer s3cret-token-no-colon"),
        ])) else {
            panic!("accepted")
        };
        assert!(!why.contains("s3cret-token"), "{why}");
        let Err(ExportError::BadSecret(why)) =
            Config::of(&secret(&[("endpoint", "https://c:4317"), ("tls.crt", "x")]))
        else {
            panic!("accepted")
        };
        assert!(why.contains("together"), "{why}");
    }
}
