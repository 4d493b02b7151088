//! mTLS between the operator and its agents without cert-manager: a self-signed CA is
//! generated once into a Secret; the operator issues its own serving certificate from it
//! at every start, the agents' certificate into a second Secret that the agent DaemonSet
//! mounts (so agents need no API access at all), and a client certificate for scrapers of
//! the agents' `/metrics` into a third.

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::{Error, Result};

pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";

/// A CA certificate and its key, PEM.
#[derive(Clone, Debug)]
pub struct Pki {
    pub ca_cert: String,
    pub ca_key: String,
}

/// A leaf certificate and key, PEM.
#[derive(Clone, Debug)]
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl Pki {
    pub fn generate() -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.distinguished_name
            .push(DnType::CommonName, "resourcewatch CA");
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p.not_before = rcgen::date_time_ymd(2024, 1, 1);
        p.not_after = rcgen::date_time_ymd(2036, 1, 1);
        let cert = p.self_signed(&key)?;
        Ok(Self {
            ca_cert: cert.pem(),
            ca_key: key.serialize_pem(),
        })
    }

    /// A serving certificate for these DNS names (the agents verify one of them).
    pub fn server(&self, dns_names: &[String]) -> Result<Leaf> {
        self.issue(
            dns_names
                .first()
                .map(String::as_str)
                .unwrap_or("resourcewatch-operator"),
            dns_names.to_vec(),
            &[ExtendedKeyUsagePurpose::ServerAuth],
        )
    }

    /// The agents' certificate: their client certificate towards the operator, and the
    /// serving certificate of their own `/metrics` listener (scrapers verify the name
    /// [`resourcewatch_proto::AGENT_CERT_NAME`]).
    pub fn agent(&self) -> Result<Leaf> {
        self.issue(
            resourcewatch_proto::AGENT_CERT_NAME,
            vec![resourcewatch_proto::AGENT_CERT_NAME.to_owned()],
            &[
                ExtendedKeyUsagePurpose::ClientAuth,
                ExtendedKeyUsagePurpose::ServerAuth,
            ],
        )
    }

    /// The client certificate a scraper presents to the agents' `/metrics`.
    pub fn metrics_client(&self) -> Result<Leaf> {
        self.issue(
            resourcewatch_proto::METRICS_CLIENT_CERT_NAME,
            vec![resourcewatch_proto::METRICS_CLIENT_CERT_NAME.to_owned()],
            &[ExtendedKeyUsagePurpose::ClientAuth],
        )
    }

    fn issue(
        &self,
        cn: &str,
        sans: Vec<String>,
        usages: &[ExtendedKeyUsagePurpose],
    ) -> Result<Leaf> {
        let ca_key = KeyPair::from_pem(&self.ca_key)?;
        let issuer = Issuer::from_ca_cert_pem(&self.ca_cert, ca_key)?;
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(sans)?;
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = usages.to_vec();
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.not_before = rcgen::date_time_ymd(2024, 1, 1);
        p.not_after = rcgen::date_time_ymd(2036, 1, 1);
        let cert = p.signed_by(&key, &issuer)?;
        Ok(Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

fn get(s: &Secret, k: &str) -> Option<String> {
    s.data
        .as_ref()?
        .get(k)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

fn secret(ns: &str, name: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/part-of".to_string(),
                    "resourcewatch".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// The CA from its Secret, created on first start. Two replicas starting at once both try
/// to create it; the loser reads the winner's.
pub async fn ensure_ca(client: &Client, ns: &str, name: &str) -> Result<Pki> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    for _ in 0..3 {
        if let Some(s) = api.get_opt(name).await? {
            let (Some(ca_cert), Some(ca_key)) = (get(&s, CA_CERT), get(&s, CA_KEY)) else {
                return Err(Error::BrokenCa(format!("{ns}/{name}")));
            };
            return Ok(Pki { ca_cert, ca_key });
        }
        let pki = Pki::generate()?;
        let s = secret(ns, name, &[(CA_CERT, &pki.ca_cert), (CA_KEY, &pki.ca_key)]);
        match api.create(&PostParams::default(), &s).await {
            Ok(_) => return Ok(pki),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Contended(format!("Secret {ns}/{name}")))
}

/// Which certificate a leaf Secret holds; written on the Secret as
/// [`ISSUED_AS_ANNOTATION`], so a Secret of an older profile (the agents' certificate
/// before it also served their `/metrics`) is issued again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafKind {
    /// Client towards the operator, server of the agent's `/metrics`.
    Agent,
    /// A scraper of the agents' `/metrics`.
    MetricsClient,
}

impl LeafKind {
    fn profile(self) -> &'static str {
        match self {
            LeafKind::Agent => "agent/client+server/v2",
            LeafKind::MetricsClient => "metrics-client/v1",
        }
    }
}

pub const ISSUED_AS_ANNOTATION: &str = "resourcewatch.io/issued-as";

/// A leaf certificate Secret (`ca.crt`, `tls.crt`, `tls.key`): created when missing,
/// issued again when another CA or another profile issued it.
pub async fn ensure_leaf_secret(
    client: &Client,
    ns: &str,
    name: &str,
    pki: &Pki,
    kind: LeafKind,
) -> Result<()> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    // Read, check, write; a conflict (another replica, an older operator, a person)
    // means read again and check again.
    for _ in 0..3 {
        let existing = api.get_opt(name).await?;
        if let Some(s) = &existing
            && get(s, CA_CERT).as_deref() == Some(pki.ca_cert.as_str())
            && get(s, TLS_CERT).is_some()
            && get(s, TLS_KEY).is_some()
            && s.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ISSUED_AS_ANNOTATION))
                .map(String::as_str)
                == Some(kind.profile())
        {
            return Ok(());
        }
        let leaf = match kind {
            LeafKind::Agent => pki.agent()?,
            LeafKind::MetricsClient => pki.metrics_client()?,
        };
        let mut s = secret(
            ns,
            name,
            &[
                (CA_CERT, &pki.ca_cert),
                (TLS_CERT, &leaf.cert),
                (TLS_KEY, &leaf.key),
            ],
        );
        let result = match existing {
            Some(old) => {
                // Others' labels and annotations stay; ours are set.
                let mut meta = old.metadata;
                meta.annotations
                    .get_or_insert_with(Default::default)
                    .insert(ISSUED_AS_ANNOTATION.to_string(), kind.profile().to_string());
                meta.labels
                    .get_or_insert_with(Default::default)
                    .extend(s.metadata.labels.take().unwrap_or_default());
                s.metadata = meta;
                api.replace(name, &PostParams::default(), &s).await
            }
            None => {
                s.metadata.annotations =
                    Some([(ISSUED_AS_ANNOTATION.to_string(), kind.profile().to_string())].into());
                api.create(&PostParams::default(), &s).await
            }
        };
        match result {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Contended(format!("Secret {ns}/{name}")))
}

/// Creates or updates the ConfigMap `name` in `ns` with `ca.crt`: it publishes the CA
/// certificate (never its key), for clients that verify the operator's serving
/// certificate (Prometheus scraping /metrics, `helm test`).
pub async fn ensure_ca_bundle(client: &Client, ns: &str, name: &str, ca_pem: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let mut cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/part-of".to_string(),
                    "resourcewatch".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        data: Some([(CA_CERT.to_string(), ca_pem.to_string())].into()),
        ..Default::default()
    };
    for _ in 0..3 {
        let result = match api.get_opt(name).await? {
            None => api.create(&PostParams::default(), &cm).await,
            Some(old) if old.data == cm.data => return Ok(()),
            Some(old) => {
                cm.metadata.resource_version = old.metadata.resource_version;
                api.replace(name, &PostParams::default(), &cm).await
            }
        };
        match result {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Contended(format!("ConfigMap {ns}/{name}")))
}
