//! TLS for the listeners whose security protocol is SSL (rustls, with the
//! `ring` provider), from Kafka's keys:
//!
//! * `ssl.keystore.type=PEM` with `ssl.keystore.location` (a file with the
//!   private key and the certificate chain) or the inline
//!   `ssl.keystore.key` and `ssl.keystore.certificate.chain`;
//! * `ssl.truststore.type=PEM` with `ssl.truststore.location` or the inline
//!   `ssl.truststore.certificates`, for `ssl.client.auth` `requested` or
//!   `required`;
//! * `ssl.enabled.protocols` (TLSv1.2, TLSv1.3) and `ssl.cipher.suites`
//!   (IANA names), within what rustls supports.
//!
//! * `ssl.keystore.type=PKCS12` / `ssl.truststore.type=PKCS12` with
//!   `ssl.keystore.password` / `ssl.truststore.password` ([`pkcs12`]).
//!
//! Connections to another broker's SSL inter-broker listener are
//! [`client`]'s.
//!
//! An encrypted PKCS #8 key (`ENCRYPTED PRIVATE KEY`, PBES2) is decrypted
//! with `ssl.key.password`. JKS stores are refused with how to convert
//! them.
//!
//! Replaced key, certificate or truststore files are picked up without a
//! restart ([`Reloading`]): new connections get the new configuration,
//! and a file that does not load is logged and leaves the old one in use.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub mod client;
mod pkcs12;

use parking_lot::{Mutex, RwLock};
use tokio_rustls::TlsAcceptor;

use keel_config::listeners::{ClientAuth, SslSettings};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, SupportedCipherSuite};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The listener's rustls configuration, or what is wrong with its keys.
pub fn server_config(listener: &str, s: &SslSettings) -> Result<Arc<ServerConfig>, String> {
    let fail = |what: String| format!("listener {listener}: {what}");
    let (certs, key) = keystore(s).map_err(fail)?;
    let provider = provider(s).map_err(fail)?;
    let versions = versions(s).map_err(fail)?;
    let builder = ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&versions)
        .map_err(|e| fail(format!("ssl.enabled.protocols with ssl.cipher.suites: {e}")))?;
    let builder = match s.client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        auth => {
            let roots = truststore(s, "ssl.client.auth requested or required").map_err(fail)?;
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots));
            let verifier = if auth == ClientAuth::Requested {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| fail(format!("ssl.truststore: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| fail(format!("ssl.keystore: the key does not fit the certificate: {e}")))?;
    Ok(Arc::new(config))
}

/// How often an SSL listener's files are looked at for changes.
pub const RELOAD_CHECK: Duration = Duration::from_secs(2);

/// An SSL listener's TLS configuration, built again when its keystore or
/// truststore file changes (modification time or size).
pub struct Reloading {
    listener: String,
    settings: SslSettings,
    current: RwLock<TlsAcceptor>,
    stamps: Mutex<Vec<Option<(SystemTime, u64)>>>,
}

impl Reloading {
    /// Builds the configuration once (an error fails start-up).
    pub fn new(listener: &str, settings: SslSettings) -> Result<Arc<Reloading>, String> {
        let config = server_config(listener, &settings)?;
        let r = Reloading {
            listener: listener.to_string(),
            current: RwLock::new(TlsAcceptor::from(config)),
            stamps: Mutex::new(Vec::new()),
            settings,
        };
        *r.stamps.lock() = r.stamps_now();
        Ok(Arc::new(r))
    }

    /// The configuration new connections get.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.current.read().clone()
    }

    fn stamps_now(&self) -> Vec<Option<(SystemTime, u64)>> {
        stamps(&self.settings)
    }

    /// Builds the configuration again if a file changed. Blocking (reads
    /// the files). -> whether it was replaced.
    pub fn check(&self) -> bool {
        let now = self.stamps_now();
        if *self.stamps.lock() == now {
            return false;
        }
        *self.stamps.lock() = now;
        match server_config(&self.listener, &self.settings) {
            Ok(config) => {
                *self.current.write() = TlsAcceptor::from(config);
                tracing::info!(listener = %self.listener, "TLS keys reloaded: new connections use them");
                true
            }
            Err(e) => {
                tracing::error!(listener = %self.listener, error = %e, "cannot reload TLS keys; the previous ones stay in use");
                false
            }
        }
    }

    /// Looks at the files every [`RELOAD_CHECK`] until the runtime stops.
    pub fn spawn_watch(self: &Arc<Self>) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RELOAD_CHECK).await;
                let r = Arc::clone(&me);
                if tokio::task::spawn_blocking(move || r.check()).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// The modification time and size of the keystore and truststore files.
fn stamps(s: &SslSettings) -> Vec<Option<(SystemTime, u64)>> {
    [&s.keystore_location, &s.truststore_location]
        .into_iter()
        .filter(|path| !path.is_empty())
        .map(|path| {
            let meta = std::fs::metadata(path).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        })
        .collect()
}

/// Short names of attributes in a distinguished name (RFC 2253, as
/// Java's `X500Principal` writes them); others are written as their OID.
const ATTRIBUTE_NAMES: &[(&str, &str)] = &[
    ("2.5.4.3", "CN"),
    ("2.5.4.6", "C"),
    ("2.5.4.7", "L"),
    ("2.5.4.8", "ST"),
    ("2.5.4.9", "STREET"),
    ("2.5.4.10", "O"),
    ("2.5.4.11", "OU"),
    ("0.9.2342.19200300.100.1.1", "UID"),
    ("0.9.2342.19200300.100.1.25", "DC"),
];

fn escape_rfc2253(value: &str) -> String {
    let mut out = String::new();
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The subject of a client certificate as an RFC 2253 name (most specific
/// attribute first, as Kafka's principal builder sees it).
pub fn subject_name(der: &[u8]) -> Result<String, String> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| format!("client certificate: {e}"))?;
    let rdns: Vec<String> = cert
        .subject()
        .iter()
        .map(|rdn| {
            let parts: Vec<String> = rdn
                .iter()
                .map(|attr| {
                    let oid = attr.attr_type().to_id_string();
                    let name = ATTRIBUTE_NAMES
                        .iter()
                        .find(|(o, _)| *o == oid)
                        .map_or(oid.clone(), |(_, n)| (*n).to_string());
                    let value = match attr.as_str() {
                        Ok(v) => escape_rfc2253(v),
                        Err(_) => {
                            let hex: String = attr.as_slice().iter().map(|b| format!("{b:02x}")).collect();
                            format!("#{hex}")
                        }
                    };
                    format!("{name}={value}")
                })
                .collect();
            parts.join("+")
        })
        .collect();
    Ok(rdns.into_iter().rev().collect::<Vec<_>>().join(","))
}

impl Reloading {
    /// The user a client of this listener authenticated as: its
    /// certificate's name through `ssl.principal.mapping.rules`; `None`
    /// without a certificate (ANONYMOUS). `Err` when no rule maps it.
    pub fn user(&self, certificates: Option<&[CertificateDer<'_>]>) -> Result<Option<String>, String> {
        let Some(first) = certificates.and_then(|c| c.first()) else {
            return Ok(None);
        };
        let name = subject_name(first)?;
        match self.settings.principal_mapper.map(&name) {
            Some(user) => Ok(Some(user)),
            None => Err(format!("no ssl.principal.mapping.rules rule maps {name}")),
        }
    }
}

/// The store formats Keel reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreType {
    Pem,
    Pkcs12,
}

fn store_type(key: &str, value: &str) -> Result<StoreType, String> {
    match value.to_ascii_uppercase().as_str() {
        "PEM" => Ok(StoreType::Pem),
        "PKCS12" => Ok(StoreType::Pkcs12),
        "JKS" => Err(format!(
            "{key} is JKS, which Keel does not read: convert it (keytool -importkeystore -deststoretype PKCS12) \
             and set {key}=PKCS12"
        )),
        other => Err(format!("{key}={other}: must be PEM or PKCS12")),
    }
}

/// The certificate chain and private key.
fn keystore(s: &SslSettings) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    if s.keystore_location.is_empty()
        && (s.keystore_key.is_empty() || s.keystore_certificate_chain.is_empty())
    {
        return Err(
            "an SSL listener needs ssl.keystore.location (or ssl.keystore.key and \
                    ssl.keystore.certificate.chain)"
                .into(),
        );
    }
    if store_type("ssl.keystore.type", &s.keystore_type)? == StoreType::Pkcs12 {
        return pkcs12_keystore(s);
    }
    let pem: Vec<u8> = if !s.keystore_location.is_empty() {
        std::fs::read(&s.keystore_location)
            .map_err(|e| format!("ssl.keystore.location {}: {e}", s.keystore_location))?
    } else {
        format!("{}\n{}", s.keystore_key, s.keystore_certificate_chain).into_bytes()
    };
    let encrypted = contains(&pem, b"ENCRYPTED PRIVATE KEY");
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("ssl.keystore: {e}"))?;
    if certs.is_empty() {
        return Err("ssl.keystore holds no certificate".into());
    }
    let key = if encrypted {
        decrypt_key(&pem, &s.key_password)?
    } else if !s.key_password.is_empty() {
        return Err("ssl.key.password is set but the key in ssl.keystore is not encrypted".into());
    } else {
        PrivateKeyDer::from_pem_slice(&pem).map_err(|e| format!("ssl.keystore: no private key ({e})"))?
    };
    Ok((certs, key))
}

/// A PKCS12 keystore's one private key and its certificate chain.
fn pkcs12_keystore(
    s: &SslSettings,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    if s.keystore_location.is_empty() {
        return Err(
            "ssl.keystore.type=PKCS12 needs ssl.keystore.location (ssl.keystore.key is for PEM)".into(),
        );
    }
    if s.keystore_password.is_empty() {
        return Err("a PKCS12 keystore needs ssl.keystore.password".into());
    }
    let der = std::fs::read(&s.keystore_location)
        .map_err(|e| format!("ssl.keystore.location {}: {e}", s.keystore_location))?;
    let mut store = pkcs12::read(&der, "ssl.keystore", &s.keystore_password, &s.key_password)?;
    if store.certs.is_empty() {
        return Err("ssl.keystore holds no certificate".into());
    }
    match store.keys.len() {
        1 => Ok((store.certs, store.keys.remove(0))),
        0 => Err("ssl.keystore holds no private key".into()),
        n => Err(format!(
            "ssl.keystore holds {n} private keys; a listener serves one"
        )),
    }
}

/// The `ENCRYPTED PRIVATE KEY` section of `pem`, decrypted with `password`.
fn decrypt_key(pem: &[u8], password: &str) -> Result<PrivateKeyDer<'static>, String> {
    if password.is_empty() {
        return Err("the key in ssl.keystore is encrypted: set ssl.key.password".into());
    }
    let text = std::str::from_utf8(pem).map_err(|_| "ssl.keystore is not PEM text".to_string())?;
    let begin = "-----BEGIN ENCRYPTED PRIVATE KEY-----";
    let end = "-----END ENCRYPTED PRIVATE KEY-----";
    let start = text.find(begin).ok_or("ssl.keystore: no encrypted key")?;
    let stop = text[start..]
        .find(end)
        .ok_or("ssl.keystore: the encrypted key is cut short")?
        + start
        + end.len();
    let (_, der) = pkcs8::der::pem::decode_vec(&text.as_bytes()[start..stop])
        .map_err(|e| format!("ssl.keystore: the encrypted key: {e}"))?;
    let info = pkcs8::EncryptedPrivateKeyInfo::try_from(der.as_slice())
        .map_err(|e| format!("ssl.keystore: the encrypted key: {e}"))?;
    pkcs12::decrypt_pkcs8(&info, password).map_err(|e| match e {
        pkcs12::KeyError::Scheme(e) => format!("ssl.keystore: the key is {e}"),
        pkcs12::KeyError::Password => {
            "ssl.keystore: cannot decrypt the key with ssl.key.password".to_string()
        }
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The CAs certificates are checked against; `needed_by` says what needs
/// them, for the error when none are set.
fn truststore(s: &SslSettings, needed_by: &str) -> Result<RootCertStore, String> {
    if s.truststore_location.is_empty() && s.truststore_certificates.is_empty() {
        return Err(format!(
            "{needed_by} needs ssl.truststore.location (or ssl.truststore.certificates)"
        ));
    }
    let mut roots = RootCertStore::empty();
    if store_type("ssl.truststore.type", &s.truststore_type)? == StoreType::Pkcs12 {
        if s.truststore_location.is_empty() {
            return Err("ssl.truststore.type=PKCS12 needs ssl.truststore.location".into());
        }
        let der = std::fs::read(&s.truststore_location)
            .map_err(|e| format!("ssl.truststore.location {}: {e}", s.truststore_location))?;
        for cert in pkcs12::read(&der, "ssl.truststore", &s.truststore_password, "")?.trusted {
            roots.add(cert).map_err(|e| format!("ssl.truststore: {e}"))?;
        }
        if roots.is_empty() {
            return Err("ssl.truststore holds no certificate".into());
        }
        return Ok(roots);
    }
    let pem: Vec<u8> = if !s.truststore_location.is_empty() {
        std::fs::read(&s.truststore_location)
            .map_err(|e| format!("ssl.truststore.location {}: {e}", s.truststore_location))?
    } else {
        s.truststore_certificates.clone().into_bytes()
    };
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("ssl.truststore: {e}"))?;
        roots.add(cert).map_err(|e| format!("ssl.truststore: {e}"))?;
    }
    if roots.is_empty() {
        return Err("ssl.truststore holds no certificate".into());
    }
    Ok(roots)
}

/// Kafka's `ssl.enabled.protocols`.
fn versions(s: &SslSettings) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, String> {
    let mut out = Vec::new();
    for name in &s.enabled_protocols {
        match name.as_str() {
            "TLSv1.3" => out.push(&rustls::version::TLS13),
            "TLSv1.2" => out.push(&rustls::version::TLS12),
            other => {
                return Err(format!(
                    "ssl.enabled.protocols: {other} is not supported (rustls speaks TLSv1.2 and TLSv1.3)"
                ))
            }
        }
    }
    if out.is_empty() {
        return Err("ssl.enabled.protocols is empty".into());
    }
    Ok(out)
}

/// The IANA name of a suite (rustls names TLS 1.3 suites `TLS13_*`).
fn suite_name(suite: &SupportedCipherSuite) -> String {
    format!("{:?}", suite.suite()).replace("TLS13_", "TLS_")
}

/// The `ring` provider with `ssl.cipher.suites` (all of rustls' when empty).
fn provider(s: &SslSettings) -> Result<rustls::crypto::CryptoProvider, String> {
    let mut provider = rustls::crypto::ring::default_provider();
    if s.cipher_suites.is_empty() {
        return Ok(provider);
    }
    let mut chosen = Vec::new();
    for name in &s.cipher_suites {
        let suite = provider
            .cipher_suites
            .iter()
            .find(|suite| suite_name(suite) == *name)
            .ok_or_else(|| {
                let known: Vec<String> = provider.cipher_suites.iter().map(suite_name).collect();
                format!(
                    "ssl.cipher.suites: {name} is not one rustls offers ({})",
                    known.join(", ")
                )
            })?;
        chosen.push(*suite);
    }
    provider.cipher_suites = chosen;
    Ok(provider)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn settings() -> SslSettings {
        SslSettings {
            keystore_type: "PEM".into(),
            keystore_location: String::new(),
            keystore_key: String::new(),
            keystore_certificate_chain: String::new(),
            key_password: String::new(),
            keystore_password: String::new(),
            truststore_type: "PEM".into(),
            truststore_location: String::new(),
            truststore_certificates: String::new(),
            truststore_password: String::new(),
            client_auth: ClientAuth::None,
            enabled_protocols: vec!["TLSv1.2".into(), "TLSv1.3".into()],
            cipher_suites: vec![],
            principal_mapper: keel_auth::principal::PrincipalMapper::parse("DEFAULT").unwrap(),
            verify_hostname: true,
        }
    }

    #[test]
    fn unreadable_stores_are_refused_with_what_to_do() {
        for (change, expected) in [
            (("JKS", "/etc/keel/broker.jks"), "keytool -importkeystore"),
            (("PKCS12", "/etc/keel/broker.p12"), "needs ssl.keystore.password"),
            (("PKCS12", ""), "needs ssl.keystore.location"),
            (("JKS", ""), "needs ssl.keystore.location"),
            (("PEM", "/nonexistent/broker.pem"), "/nonexistent/broker.pem"),
        ] {
            let mut s = settings();
            s.keystore_type = change.0.into();
            s.keystore_location = change.1.into();
            let e = server_config("SSL", &s).unwrap_err();
            assert!(e.starts_with("listener SSL: ") && e.contains(expected), "{e}");
        }
        let mut s = settings();
        s.keystore_key =
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----".into();
        s.keystore_certificate_chain = CHAIN.into();
        assert!(server_config("SSL", &s)
            .unwrap_err()
            .contains("set ssl.key.password"));
        s.key_password = "pw".into();
        assert!(server_config("SSL", &s)
            .unwrap_err()
            .contains("the encrypted key"));
    }

    pub(super) fn fixture(name: &str) -> String {
        format!("{}/src/tls/testdata/{name}", env!("CARGO_MANIFEST_DIR"))
    }

    fn pkcs12_settings(name: &str, password: &str) -> SslSettings {
        let mut s = settings();
        s.keystore_type = "PKCS12".into();
        s.keystore_location = fixture(name);
        s.keystore_password = password.into();
        s
    }

    #[test]
    fn pkcs12_keystores_from_openssl_3_and_keytool_serve() {
        for name in ["openssl3.p12", "keytool.p12"] {
            let s = pkcs12_settings(name, "keel-pass");
            let (certs, _) = keystore(&s).unwrap_or_else(|e| panic!("{name}: {e}"));
            // The leaf first, then its CA.
            let names: Vec<String> = certs.iter().map(|c| subject_name(c).unwrap()).collect();
            assert_eq!(names, ["CN=localhost", "CN=keel-fixture-ca"], "{name}");
            server_config("SSL", &s).unwrap_or_else(|e| panic!("{name}: {e}"));
            // A separate ssl.key.password is used for the key: a wrong one
            // fails.
            let mut s = s;
            s.key_password = "other".into();
            let e = keystore(&s).err().unwrap();
            assert!(e.contains("cannot decrypt the private key"), "{name}: {e}");
        }
    }

    #[test]
    fn pkcs12_stores_refuse_wrong_passwords_and_legacy_algorithms() {
        let e = keystore(&pkcs12_settings("openssl3.p12", "wrong")).err().unwrap();
        assert!(e.contains("integrity check fails: wrong password"), "{e}");
        let e = keystore(&pkcs12_settings("legacy.p12", "keel-pass"))
            .err()
            .unwrap();
        assert!(e.contains("openssl pkcs12 -in old.p12 -nodes"), "{e}");
        // A truststore is not a keystore.
        let e = keystore(&pkcs12_settings("truststore.p12", "keel-pass"))
            .err()
            .unwrap();
        assert!(e.contains("no private key"), "{e}");
        // Damage anywhere fails the integrity check or the parse, never
        // panics.
        let good = std::fs::read(fixture("openssl3.p12")).unwrap();
        for at in (0..good.len()).step_by(7) {
            let mut bad = good.clone();
            bad[at] ^= 0x5a;
            assert!(
                pkcs12::read(&bad, "ssl.keystore", "keel-pass", "").is_err(),
                "byte {at}"
            );
        }
    }

    #[test]
    fn pkcs12_stores_trust_marked_entries_or_certificates_without_a_key() {
        let read = |name: &str| {
            let der = std::fs::read(fixture(name)).unwrap();
            pkcs12::read(&der, "ssl.truststore", "keel-pass", "").unwrap()
        };
        let names = |certs: &[CertificateDer<'_>]| -> Vec<String> {
            certs.iter().map(|c| subject_name(c).unwrap()).collect()
        };
        // keytool marks its trusted entries; OpenSSL marks none, and its
        // key's own certificate is not trusted.
        assert_eq!(names(&read("truststore.p12").trusted), ["CN=keel-fixture-ca"]);
        assert_eq!(names(&read("openssl3.p12").trusted), ["CN=keel-fixture-ca"]);
    }

    #[test]
    fn key_derivations_a_store_asks_for_are_bounded() {
        use pkcs8::pkcs5::{pbes2, scrypt, EncryptionScheme};
        let (salt, iv) = ([7u8; 16], [9u8; 16]);
        let pbkdf2 =
            |n| EncryptionScheme::from(pbes2::Parameters::pbkdf2_sha256_aes256cbc(n, &salt, &iv).unwrap());
        assert!(pkcs12::check_scheme(&pbkdf2(10_000)).is_ok());
        assert!(pkcs12::check_scheme(&pbkdf2(100_000_000))
            .unwrap_err()
            .contains("100000000 PBKDF2 iterations"));
        assert!(pkcs12::check_scheme(&pbkdf2(0)).is_err());
        let params = scrypt::Params::new(20, 8, 1, 32).unwrap();
        let costly = EncryptionScheme::from(pbes2::Parameters::scrypt_aes256cbc(params, &salt, &iv).unwrap());
        assert!(pkcs12::check_scheme(&costly)
            .unwrap_err()
            .contains("other than PBKDF2"));
    }

    #[test]
    fn pkcs12_truststores_from_keytool_are_read() {
        let mut s = settings();
        s.truststore_type = "PKCS12".into();
        s.truststore_location = fixture("truststore.p12");
        s.truststore_password = "keel-pass".into();
        assert_eq!(truststore(&s, "a test").unwrap().len(), 1);
        s.truststore_password = String::new();
        let e = truststore(&s, "a test").err().unwrap();
        assert!(e.contains("encrypted: set the password"), "{e}");
        s.truststore_password = "wrong".into();
        assert!(truststore(&s, "a test")
            .err()
            .unwrap()
            .contains("integrity check fails"));
    }

    /// A certificate section: the key is looked at after the chain is
    /// found, before it is used.
    const CHAIN: &str = "-----BEGIN CERTIFICATE-----\nMIIBAA==\n-----END CERTIFICATE-----\n";

    #[test]
    fn names_are_escaped_as_rfc_2253_says() {
        assert_eq!(escape_rfc2253("Sun, Inc."), "Sun\\, Inc.");
        assert_eq!(escape_rfc2253(" #a+b "), "\\ #a\\+b\\ ");
        assert_eq!(escape_rfc2253("#x"), "\\#x");
        assert_eq!(escape_rfc2253("plain"), "plain");
    }

    #[test]
    fn protocols_and_suites_are_checked_by_name() {
        let mut s = settings();
        s.enabled_protocols = vec!["TLSv1.1".into()];
        assert!(versions(&s).unwrap_err().contains("TLSv1.1"));
        s.cipher_suites = vec![
            "TLS_AES_128_GCM_SHA256".into(),
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384".into(),
        ];
        assert_eq!(provider(&s).unwrap().cipher_suites.len(), 2);
        s.cipher_suites = vec!["TLS_RSA_WITH_RC4_128_MD5".into()];
        assert!(provider(&s).unwrap_err().contains("TLS_AES_128_GCM_SHA256"));
    }
}
