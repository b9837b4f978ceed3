//! Kafka's listeners: `listeners` (Keel's `listen` takes either form),
//! `advertised.listeners` (Keel's `advertised`),
//! `listener.security.protocol.map`, and the `ssl.*` settings of each
//! listener, where `listener.name.<name>.ssl.*` overrides `ssl.*` as in
//! Kafka.
//!
//! A value is Kafka's list, `NAME://HOST:PORT,...` (an empty host binds
//! every interface), or a single `HOST:PORT`, which is a PLAINTEXT
//! listener named PLAINTEXT.

use std::collections::BTreeMap;

use crate::{BrokerConfig, ConfigError};
use keel_auth::principal::PrincipalMapper;

/// Kafka's security protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn parse(name: &str) -> Option<SecurityProtocol> {
        match name {
            "PLAINTEXT" => Some(SecurityProtocol::Plaintext),
            "SSL" => Some(SecurityProtocol::Ssl),
            "SASL_PLAINTEXT" => Some(SecurityProtocol::SaslPlaintext),
            "SASL_SSL" => Some(SecurityProtocol::SaslSsl),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    /// TLS wraps the connection.
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }
}

/// One listener: where it binds, and how its connections are secured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub name: String,
    /// Empty: every interface.
    pub host: String,
    pub port: u16,
    pub protocol: SecurityProtocol,
}

impl Listener {
    /// The address to bind.
    pub fn bind_address(&self) -> String {
        let host = if self.host.is_empty() {
            "0.0.0.0"
        } else {
            &self.host
        };
        if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{}", self.port)
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

/// Where clients are told to connect, for those that came in on a
/// listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub listener: String,
    pub host: String,
    pub port: i32,
}

impl Endpoint {
    /// The PLAINTEXT listener's.
    pub fn plaintext(host: &str, port: i32) -> Endpoint {
        Endpoint {
            listener: "PLAINTEXT".into(),
            host: host.into(),
            port,
        }
    }
}

fn error(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// `NAME://HOST:PORT,...` or `HOST:PORT` -> (name, host, port) triples.
fn parse_list(key: &str, value: &str) -> Result<Vec<(String, String, u16)>, ConfigError> {
    if !value.contains("://") {
        let (host, port) = split_host_port(key, value)?;
        return Ok(vec![("PLAINTEXT".to_string(), host, port)]);
    }
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, address) = item
            .split_once("://")
            .ok_or_else(|| error(key, format!("`{item}`: expected NAME://HOST:PORT")))?;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(error(
                key,
                format!("`{item}`: a listener name is letters, digits and _"),
            ));
        }
        let (host, port) = split_host_port(key, address)?;
        if out.iter().any(|(n, _, _): &(String, String, u16)| n == name) {
            return Err(error(key, format!("listener name {name} appears twice")));
        }
        out.push((name.to_string(), host, port));
    }
    if out.is_empty() {
        return Err(error(key, "no listener"));
    }
    Ok(out)
}

fn split_host_port(key: &str, address: &str) -> Result<(String, u16), ConfigError> {
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| error(key, format!("`{address}`: expected HOST:PORT")))?;
    let port = port
        .parse::<u16>()
        .map_err(|_| error(key, format!("`{address}`: bad port")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok((host.to_string(), port))
}

/// `listener.security.protocol.map`: listener name -> protocol.
pub fn protocol_map(config: &BrokerConfig) -> Result<BTreeMap<String, SecurityProtocol>, ConfigError> {
    let key = "listener.security.protocol.map";
    let mut out = BTreeMap::new();
    for item in config
        .get(key)
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let (name, protocol) = item
            .split_once(':')
            .ok_or_else(|| error(key, format!("`{item}`: expected NAME:PROTOCOL")))?;
        let protocol = SecurityProtocol::parse(protocol).ok_or_else(|| {
            error(
                key,
                format!("`{item}`: the protocol is one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
            )
        })?;
        out.insert(name.to_string(), protocol);
    }
    Ok(out)
}

/// The listeners, checked: each name mapped to a protocol, each port once.
pub fn listeners(config: &BrokerConfig) -> Result<Vec<Listener>, ConfigError> {
    let map = protocol_map(config)?;
    let mut out: Vec<Listener> = Vec::new();
    for (name, host, port) in parse_list("listeners", config.get("listen"))? {
        let protocol = map.get(&name).copied().ok_or_else(|| {
            error(
                "listeners",
                format!("listener {name} is not in listener.security.protocol.map"),
            )
        })?;
        if port != 0 && out.iter().any(|l| l.port == port) {
            return Err(error(
                "listeners",
                format!("port {port} is used by two listeners"),
            ));
        }
        out.push(Listener {
            name,
            host,
            port,
            protocol,
        });
    }
    Ok(out)
}

/// The inter-broker listener a copied Kafka config names, checked as Kafka
/// checks it: `inter.broker.listener.name` or `security.inter.broker.protocol`
/// (not both) names one of the listeners, and a SASL one enables
/// `sasl.mechanism.inter.broker.protocol`. A config that names none
/// needs no PLAINTEXT listener (see [`inter_broker_listener`]).
pub fn inter_broker(config: &BrokerConfig, listeners: &[Listener]) -> Result<(), ConfigError> {
    const NAME: &str = "inter.broker.listener.name";
    const PROTOCOL: &str = "security.inter.broker.protocol";
    const MECHANISM: &str = "sasl.mechanism.inter.broker.protocol";
    let (key, name) = match (config.is_explicit(NAME), config.is_explicit(PROTOCOL)) {
        (true, true) => {
            return Err(error(
                NAME,
                format!("only one of {NAME} and {PROTOCOL} should be set"),
            ))
        }
        (true, false) => (NAME, config.get(NAME).to_string()),
        (false, true) => {
            let protocol = config.get(PROTOCOL);
            SecurityProtocol::parse(&protocol.to_ascii_uppercase()).ok_or_else(|| {
                error(
                    PROTOCOL,
                    format!("{protocol}: one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
                )
            })?;
            (PROTOCOL, protocol.to_string())
        }
        // Kafka's default, PLAINTEXT, needs no listener here: one Keel
        // sends no inter-broker traffic, and a cluster's brokers find one
        // (`inter_broker_listener`).
        (false, false) => return Ok(()),
    };
    // Listener names compare as Kafka normalises them (upper case).
    let Some(listener) = listeners.iter().find(|l| l.name.eq_ignore_ascii_case(&name)) else {
        let names: Vec<&str> = listeners.iter().map(|l| l.name.as_str()).collect();
        return Err(error(
            key,
            format!(
                "{name} must be a listener name defined in listeners; the listeners are {}",
                names.join(", ")
            ),
        ));
    };
    if listener.protocol.sasl() {
        let mechanism = config.get(MECHANISM);
        let enabled = scoped_value(config, &listener.name, "sasl.enabled.mechanisms");
        if !enabled.split(',').any(|m| m.trim() == mechanism) {
            return Err(error(
                MECHANISM,
                format!(
                    "{mechanism} must be included in sasl.enabled.mechanisms ({enabled}) of the inter-broker listener {name}"
                ),
            ));
        }
    }
    Ok(())
}

/// The listener the brokers of a cluster reach each other on:
/// `inter.broker.listener.name`, else the listener named after
/// `security.inter.broker.protocol` (PLAINTEXT by default, as Kafka
/// names it), else the first PLAINTEXT listener. `None`: no listener
/// fits (checked already by [`inter_broker`] when either key is set).
pub fn inter_broker_listener(config: &BrokerConfig, listeners: &[Listener]) -> Option<Listener> {
    let named = |name: &str| {
        listeners
            .iter()
            .find(|l| l.name.eq_ignore_ascii_case(name))
            .cloned()
    };
    if config.is_explicit("inter.broker.listener.name") {
        return named(config.get("inter.broker.listener.name"));
    }
    named(config.get("security.inter.broker.protocol")).or_else(|| {
        listeners
            .iter()
            .find(|l| l.protocol == SecurityProtocol::Plaintext)
            .cloned()
    })
}

/// `advertised.listeners` for the listeners bound at `bound` (their real
/// ports): each listener not named there is advertised at its bound
/// address, as Kafka defaults them to `listeners`. Keel's single
/// `HOST:PORT` form applies to the first listener.
pub fn advertised(
    config: &BrokerConfig,
    bound: &[(Listener, std::net::SocketAddr)],
) -> Result<Vec<Endpoint>, ConfigError> {
    let value = config.get("advertised");
    let named: Vec<(String, String, u16)> = if value.is_empty() {
        Vec::new()
    } else if value.contains("://") {
        parse_list("advertised.listeners", value)?
    } else {
        let (host, port) = split_host_port("advertised.listeners", value)?;
        let first = bound
            .first()
            .map_or("PLAINTEXT".to_string(), |(l, _)| l.name.clone());
        vec![(first, host, port)]
    };
    for (name, _, _) in &named {
        if !bound.iter().any(|(l, _)| l.name == *name) {
            return Err(error(
                "advertised.listeners",
                format!("{name} is not a listener in `listeners`"),
            ));
        }
    }
    Ok(bound
        .iter()
        .map(|(l, local)| match named.iter().find(|(n, _, _)| *n == l.name) {
            Some((_, host, port)) => Endpoint {
                listener: l.name.clone(),
                host: host.clone(),
                port: i32::from(*port),
            },
            None => Endpoint {
                listener: l.name.clone(),
                host: local.ip().to_string(),
                port: i32::from(local.port()),
            },
        })
        .collect())
}

/// `ssl.client.auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    Requested,
    Required,
}

/// A listener's TLS settings (Kafka's `ssl.*` keys, after its
/// `listener.name.<name>.` overrides).
#[derive(Debug, Clone)]
pub struct SslSettings {
    pub keystore_type: String,
    pub keystore_location: String,
    pub keystore_key: String,
    pub keystore_certificate_chain: String,
    pub key_password: String,
    /// A PKCS12 keystore's password (its integrity check and encryption).
    pub keystore_password: String,
    pub truststore_type: String,
    pub truststore_location: String,
    pub truststore_certificates: String,
    /// A PKCS12 truststore's password.
    pub truststore_password: String,
    pub client_auth: ClientAuth,
    pub enabled_protocols: Vec<String>,
    pub cipher_suites: Vec<String>,
    /// `ssl.principal.mapping.rules`: a client certificate's name -> user.
    pub principal_mapper: PrincipalMapper,
    /// `ssl.endpoint.identification.algorithm=https`: a broker connecting
    /// to this listener on another broker checks that the certificate
    /// names the host it connected to.
    pub verify_hostname: bool,
}

/// The keys a listener may override (`listener.name.<name>.<key>`); a
/// JAAS config is also scoped by mechanism
/// (`listener.name.<name>.<mechanism>.sasl.jaas.config`).
pub const LISTENER_SCOPED: &[&str] = &[
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.keystore.key",
    "ssl.keystore.certificate.chain",
    "ssl.key.password",
    "ssl.truststore.type",
    "ssl.truststore.location",
    "ssl.truststore.password",
    "ssl.truststore.certificates",
    "ssl.client.auth",
    "ssl.enabled.protocols",
    "ssl.cipher.suites",
    "ssl.principal.mapping.rules",
    "ssl.endpoint.identification.algorithm",
    "sasl.enabled.mechanisms",
    "connections.max.reauth.ms",
    "sasl.server.max.receive.size",
];

/// The key a `listener.name.<name>.<key>` override names, if it is one.
pub fn scoped_key(key: &str) -> Option<&'static str> {
    let rest = key.strip_prefix("listener.name.")?;
    let (_, suffix) = rest.split_once('.')?;
    if let Some(mechanism) = suffix.strip_suffix(".sasl.jaas.config") {
        return (!mechanism.is_empty() && !mechanism.contains('.')).then_some("sasl.jaas.config");
    }
    LISTENER_SCOPED.iter().copied().find(|k| *k == suffix)
}

/// `key` as `listener` sees it: its `listener.name.<listener>.<key>`
/// override, else the broker's value; trimmed.
pub fn scoped_value(config: &BrokerConfig, listener: &str, key: &str) -> String {
    let scoped = format!("listener.name.{}.{key}", listener.to_ascii_lowercase());
    config
        .get_override(&scoped)
        .unwrap_or_else(|| config.get(key))
        .trim()
        .to_string()
}

/// The broker's settings as `listener` sees them (see [`scoped_value`]),
/// for SASL's settings.
pub struct ListenerSettings<'a> {
    config: &'a BrokerConfig,
    listener: &'a str,
}

impl<'a> ListenerSettings<'a> {
    pub fn new(config: &'a BrokerConfig, listener: &'a str) -> ListenerSettings<'a> {
        ListenerSettings { config, listener }
    }
}

impl keel_auth::Settings for ListenerSettings<'_> {
    fn value(&self, key: &str) -> String {
        scoped_value(self.config, self.listener, key)
    }

    fn set_value(&self, key: &str) -> Option<String> {
        self.config.get_override(key).map(str::to_string)
    }
}

/// The TLS settings of `listener`.
pub fn ssl_settings(config: &BrokerConfig, listener: &str) -> Result<SslSettings, ConfigError> {
    let get = |key: &str| scoped_value(config, listener, key);
    let list = |key: &str| -> Vec<String> {
        get(key)
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    };
    let client_auth = match get("ssl.client.auth").as_str() {
        "none" => ClientAuth::None,
        "requested" => ClientAuth::Requested,
        "required" => ClientAuth::Required,
        other => {
            return Err(error(
                "ssl.client.auth",
                format!("{other}: must be one of none, requested, required"),
            ))
        }
    };
    Ok(SslSettings {
        keystore_type: get("ssl.keystore.type"),
        keystore_location: get("ssl.keystore.location"),
        keystore_key: get("ssl.keystore.key"),
        keystore_certificate_chain: get("ssl.keystore.certificate.chain"),
        key_password: get("ssl.key.password"),
        keystore_password: get("ssl.keystore.password"),
        truststore_type: get("ssl.truststore.type"),
        truststore_location: get("ssl.truststore.location"),
        truststore_certificates: get("ssl.truststore.certificates"),
        truststore_password: get("ssl.truststore.password"),
        client_auth,
        enabled_protocols: list("ssl.enabled.protocols"),
        cipher_suites: list("ssl.cipher.suites"),
        principal_mapper: PrincipalMapper::parse(&get("ssl.principal.mapping.rules"))?,
        verify_hostname: match get("ssl.endpoint.identification.algorithm")
            .to_ascii_lowercase()
            .as_str()
        {
            "https" => true,
            "" => false,
            other => {
                return Err(error(
                    "ssl.endpoint.identification.algorithm",
                    format!("{other}: must be https, or empty to not check the host name"),
                ))
            }
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> BrokerConfig {
        let map = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        BrokerConfig::from_map(&map).unwrap()
    }

    #[test]
    fn both_forms_parse() {
        let c = config(&[("listen", "127.0.0.1:9092")]);
        let l = listeners(&c).unwrap();
        assert_eq!(
            (l[0].name.as_str(), l[0].port, l[0].protocol),
            ("PLAINTEXT", 9092, SecurityProtocol::Plaintext)
        );
        let c = config(&[
            (
                "listeners",
                "PLAINTEXT://127.0.0.1:9092,SSL://:9093,INTERNAL://[::1]:9094",
            ),
            (
                "listener.security.protocol.map",
                "PLAINTEXT:PLAINTEXT,SSL:SSL,INTERNAL:SSL",
            ),
        ]);
        let l = listeners(&c).unwrap();
        assert_eq!(l.len(), 3);
        assert_eq!(
            (l[1].bind_address(), l[1].protocol),
            ("0.0.0.0:9093".to_string(), SecurityProtocol::Ssl)
        );
        assert_eq!(l[2].bind_address(), "[::1]:9094");
    }

    #[test]
    fn bad_listeners_are_refused_with_the_reason() {
        for (value, reason) in [
            ("PLAINTEXT://:9092,PLAINTEXT://:9093", "appears twice"),
            ("PLAINTEXT://:9092,SSL://:9092", "used by two listeners"),
            ("OTHER://:9092", "not in listener.security.protocol.map"),
            ("PLAINTEXT://nowhere", "expected HOST:PORT"),
        ] {
            let map = [("listeners".to_string(), value.to_string())].into();
            let e = BrokerConfig::from_map(&map).unwrap_err();
            assert!(e.reason.contains(reason), "{value}: {e}");
        }
    }

    #[test]
    fn the_inter_broker_listener_is_the_named_one_else_a_plaintext_one() {
        let listeners_of = |c: &BrokerConfig| listeners(c).unwrap();
        let chosen = |pairs: &[(&str, &str)]| {
            let c = config(pairs);
            inter_broker_listener(&c, &listeners_of(&c)).map(|l| l.name)
        };
        let two = ("listeners", "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0");
        let map = ("listener.security.protocol.map", "CLIENT:SSL,INTERNAL:PLAINTEXT");
        let tls = [
            ("listener.name.client.ssl.keystore.type", "PEM"),
            ("listener.name.client.ssl.keystore.key", "k"),
            ("listener.name.client.ssl.keystore.certificate.chain", "c"),
        ];
        let mut pairs = vec![two, map];
        pairs.extend(tls);
        // No key set: the first PLAINTEXT listener.
        assert_eq!(chosen(&pairs).as_deref(), Some("INTERNAL"));
        pairs.push(("inter.broker.listener.name", "client"));
        assert_eq!(chosen(&pairs).as_deref(), Some("CLIENT"));
        // The default protocol names the listener called PLAINTEXT.
        let ssl_first = [
            ("listeners", "SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0"),
            ("listener.name.ssl.ssl.keystore.type", "PEM"),
            ("listener.name.ssl.ssl.keystore.key", "k"),
            ("listener.name.ssl.ssl.keystore.certificate.chain", "c"),
        ];
        assert_eq!(chosen(&ssl_first).as_deref(), Some("PLAINTEXT"));
        assert_eq!(chosen(&[("listen", "127.0.0.1:0")]).as_deref(), Some("PLAINTEXT"));
    }

    #[test]
    fn inter_broker_keys_name_a_listener() {
        let listeners = (
            "listeners",
            "PLAINTEXT://127.0.0.1:0,BROKER://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        );
        let map = (
            "listener.security.protocol.map",
            "PLAINTEXT:PLAINTEXT,BROKER:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
        );
        let tls = [
            ("listener.name.sasl_ssl.ssl.keystore.type", "PEM"),
            ("listener.name.sasl_ssl.ssl.keystore.key", "k"),
            ("listener.name.sasl_ssl.ssl.keystore.certificate.chain", "c"),
        ];
        let jaas = (
            "listener.name.broker.plain.sasl.jaas.config",
            "org.apache.kafka.common.security.plain.PlainLoginModule required user_a=\"b\";",
        );
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = vec![
                listeners,
                map,
                jaas,
                ("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-512"),
            ];
            pairs.extend(tls);
            pairs.extend_from_slice(extra);
            let map: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            BrokerConfig::from_map(&map)
        };
        for ok in [
            vec![],
            vec![
                ("inter.broker.listener.name", "BROKER"),
                ("sasl.mechanism.inter.broker.protocol", "PLAIN"),
            ],
            vec![("security.inter.broker.protocol", "plaintext")],
            vec![
                ("inter.broker.listener.name", "broker"),
                ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512"),
            ],
            // Kafka ignores the mechanism without a SASL inter-broker listener.
            vec![("sasl.mechanism.inter.broker.protocol", "PLAIN")],
        ] {
            with(&ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
        for (extra, key, reason) in [
            (
                vec![
                    ("inter.broker.listener.name", "BROKER"),
                    ("security.inter.broker.protocol", "PLAINTEXT"),
                ],
                "inter.broker.listener.name",
                "only one of",
            ),
            (
                vec![("inter.broker.listener.name", "INTERNAL")],
                "inter.broker.listener.name",
                "must be a listener name defined in listeners",
            ),
            (
                vec![("security.inter.broker.protocol", "SSL")],
                "security.inter.broker.protocol",
                "must be a listener name",
            ),
            (
                vec![("security.inter.broker.protocol", "TLS")],
                "security.inter.broker.protocol",
                "one of PLAINTEXT",
            ),
            // Kafka's default mechanism, GSSAPI, is not enabled.
            (
                vec![("inter.broker.listener.name", "BROKER")],
                "sasl.mechanism.inter.broker.protocol",
                "must be included in sasl.enabled.mechanisms",
            ),
        ] {
            let e = with(&extra).unwrap_err();
            assert_eq!(e.key, key, "{extra:?}: {e}");
            assert!(e.reason.contains(reason), "{extra:?}: {e}");
        }
    }

    #[test]
    fn advertised_defaults_to_the_bound_address_and_overrides_by_name() {
        let c = config(&[
            ("listeners", "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0"),
            ("advertised.listeners", "SSL://broker.example:19093"),
        ]);
        let l = listeners(&c).unwrap();
        let bound = vec![
            (l[0].clone(), "127.0.0.1:40001".parse().unwrap()),
            (l[1].clone(), "127.0.0.1:40002".parse().unwrap()),
        ];
        let a = advertised(&c, &bound).unwrap();
        assert_eq!((a[0].host.as_str(), a[0].port), ("127.0.0.1", 40001));
        assert_eq!((a[1].host.as_str(), a[1].port), ("broker.example", 19093));
        let bad = config(&[("advertised.listeners", "SSL://x:1")]);
        let l = listeners(&bad).unwrap();
        let bound = vec![(l[0].clone(), "127.0.0.1:1".parse().unwrap())];
        assert!(advertised(&bad, &bound).is_err());
    }

    #[test]
    fn sasl_reads_a_listeners_own_keys_over_the_brokers() {
        let c = config(&[
            ("sasl.enabled.mechanisms", "GSSAPI"),
            ("listener.name.sasl_ssl.sasl.enabled.mechanisms", "SCRAM-SHA-256"),
            ("connections.max.reauth.ms", "1000"),
        ]);
        let s = keel_auth::sasl::settings(&ListenerSettings::new(&c, "SASL_SSL"), "SASL_SSL").unwrap();
        assert_eq!(s.mechanisms, vec!["SCRAM-SHA-256"]);
        assert_eq!(s.reauth, Some(std::time::Duration::from_secs(1)));
        assert_eq!(s.max_receive_bytes, 524_288, "Kafka's default");
        let e = keel_auth::sasl::settings(&ListenerSettings::new(&c, "SASL_PLAINTEXT"), "SASL_PLAINTEXT")
            .unwrap_err();
        assert!(e.reason.contains("GSSAPI"), "{e}");
    }

    #[test]
    fn a_listener_overrides_ssl_keys_by_its_lower_case_name() {
        let c = config(&[
            ("ssl.keystore.location", "/etc/keel/broker.pem"),
            (
                "listener.name.internal.ssl.keystore.location",
                "/etc/keel/internal.pem",
            ),
            ("listener.name.internal.ssl.client.auth", "required"),
        ]);
        assert_eq!(
            ssl_settings(&c, "SSL").unwrap().keystore_location,
            "/etc/keel/broker.pem"
        );
        let internal = ssl_settings(&c, "INTERNAL").unwrap();
        assert_eq!(internal.keystore_location, "/etc/keel/internal.pem");
        assert_eq!(internal.client_auth, ClientAuth::Required);
        assert_eq!(internal.enabled_protocols, vec!["TLSv1.2", "TLSv1.3"]);
        assert!(internal.verify_hostname, "Kafka's default, https");
    }

    #[test]
    fn the_host_name_check_is_https_or_nothing() {
        let c = config(&[
            ("listener.name.internal.ssl.endpoint.identification.algorithm", ""),
            (
                "listener.name.other.ssl.endpoint.identification.algorithm",
                "ldap",
            ),
        ]);
        assert!(ssl_settings(&c, "SSL").unwrap().verify_hostname);
        assert!(!ssl_settings(&c, "INTERNAL").unwrap().verify_hostname);
        let e = ssl_settings(&c, "OTHER").unwrap_err();
        assert!(e.reason.contains("must be https"), "{e}");
    }
}
