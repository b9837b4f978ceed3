//! TLS for a broker's connections to another broker's SSL (or SASL_SSL)
//! inter-broker listener, from that listener's own keys, as Kafka's
//! brokers use them: its truststore verifies the other broker's
//! certificate, and the name in it unless
//! `ssl.endpoint.identification.algorithm` is empty; its keystore is this
//! broker's certificate when the other asks for one (`ssl.client.auth`).
//! Replaced files are picked up for new connections.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use keel_config::listeners::SslSettings;
use parking_lot::Mutex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio_rustls::TlsConnector;

use super::{keystore, provider, truststore, versions, RELOAD_CHECK};

/// The rustls configuration of connections to `listener` on other brokers.
pub fn client_config(listener: &str, s: &SslSettings) -> Result<Arc<ClientConfig>, String> {
    let fail = |what: String| format!("inter-broker listener {listener}: {what}");
    let provider = Arc::new(provider(s).map_err(fail)?);
    let roots = truststore(s, "a broker connecting to another's SSL listener").map_err(fail)?;
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
        .build()
        .map_err(|e| fail(format!("ssl.truststore: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = if s.verify_hostname {
        webpki
    } else {
        Arc::new(AnyName(webpki))
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions(s).map_err(fail)?)
        .map_err(|e| fail(format!("ssl.enabled.protocols with ssl.cipher.suites: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let has_keystore = !s.keystore_location.is_empty() || !s.keystore_key.is_empty();
    let config = if has_keystore {
        let (certs, key) = keystore(s).map_err(fail)?;
        builder
            .with_client_auth_cert(certs, key)
            .map_err(|e| fail(format!("ssl.keystore: {e}")))?
    } else {
        builder.with_no_client_auth()
    };
    Ok(Arc::new(config))
}

/// The truststore's verdict on a certificate with any name in it
/// (`ssl.endpoint.identification.algorithm` empty): the chain, dates and
/// signatures are checked all the same.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The connector of an inter-broker listener, built again when its
/// keystore or truststore file changes (looked at no more often than
/// [`RELOAD_CHECK`], when a connection opens).
pub struct Connector {
    listener: String,
    settings: SslSettings,
    state: Mutex<State>,
}

struct State {
    current: TlsConnector,
    stamps: Vec<Option<(SystemTime, u64)>>,
    checked: Instant,
}

impl Connector {
    /// Builds the configuration once (an error fails start-up).
    pub fn new(listener: &str, settings: SslSettings) -> Result<Connector, String> {
        let config = client_config(listener, &settings)?;
        let stamps = super::stamps(&settings);
        Ok(Connector {
            listener: listener.to_string(),
            settings,
            state: Mutex::new(State {
                current: TlsConnector::from(config),
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The connector a new connection uses. Reads the files' metadata
    /// when they are due a look, and the files when they changed.
    pub fn connector(&self) -> TlsConnector {
        let mut state = self.state.lock();
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let now = super::stamps(&self.settings);
            if now != state.stamps {
                state.stamps = now;
                match client_config(&self.listener, &self.settings) {
                    Ok(config) => {
                        state.current = TlsConnector::from(config);
                        tracing::info!(listener = %self.listener, "TLS keys reloaded for connections to other brokers");
                    }
                    Err(e) => {
                        tracing::error!(listener = %self.listener, error = %e, "cannot reload TLS keys for connections to other brokers; the previous ones stay in use");
                    }
                }
            }
        }
        state.current.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::super::server_config;
    use super::super::tests::{fixture, settings};
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::TlsAcceptor;

    /// The fixture's keys: the leaf names localhost and 127.0.0.1.
    fn fixture_settings(verify_hostname: bool) -> SslSettings {
        let mut s = settings();
        s.keystore_type = "PKCS12".into();
        s.keystore_location = fixture("openssl3.p12");
        s.keystore_password = "keel-pass".into();
        s.truststore_type = "PKCS12".into();
        s.truststore_location = fixture("truststore.p12");
        s.truststore_password = "keel-pass".into();
        s.verify_hostname = verify_hostname;
        s
    }

    /// A handshake with the fixture's server as `host`, and a byte through.
    async fn handshake(s: &SslSettings, host: &str) -> Result<(), String> {
        let acceptor = TlsAcceptor::from(server_config("INTERNAL", s).unwrap());
        let connector = TlsConnector::from(client_config("INTERNAL", s)?);
        let (near, far) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move {
            let mut tls = acceptor.accept(far).await.map_err(|e| e.to_string())?;
            let mut byte = [0u8; 1];
            tls.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
            Ok::<u8, String>(byte[0])
        });
        let name = ServerName::try_from(host.to_string()).unwrap();
        // The client's end stays open until the server has read (TLS 1.3
        // servers write their tickets after the handshake).
        let mut tls = connector.connect(name, near).await.map_err(|e| e.to_string())?;
        tls.write_all(&[42]).await.map_err(|e| e.to_string())?;
        tls.flush().await.map_err(|e| e.to_string())?;
        let received = server.await.unwrap();
        assert_eq!(received.map_err(|e| format!("the server: {e}"))?, 42);
        Ok(())
    }

    #[tokio::test]
    async fn a_peer_is_checked_against_the_truststore_and_by_name_unless_told_not_to() {
        let checked = fixture_settings(true);
        handshake(&checked, "localhost").await.unwrap();
        handshake(&checked, "127.0.0.1").await.unwrap();
        let e = handshake(&checked, "broker-2.example").await.unwrap_err();
        assert!(e.contains("not valid for name"), "{e}");
        handshake(&fixture_settings(false), "broker-2.example")
            .await
            .unwrap();

        // A truststore without the CA refuses it, name check or not.
        let mut other = fixture_settings(false);
        other.truststore_type = "PEM".into();
        other.truststore_location = String::new();
        other.truststore_certificates = OTHER_CA.into();
        let e = handshake(&other, "localhost").await.unwrap_err();
        assert!(e.contains("UnknownIssuer"), "{e}");

        // No truststore at all is refused up front.
        let mut none = fixture_settings(true);
        none.truststore_location = String::new();
        let e = client_config("INTERNAL", &none).unwrap_err();
        assert!(
            e.contains("inter-broker listener INTERNAL") && e.contains("ssl.truststore.location"),
            "{e}"
        );
    }

    /// A CA that signed nothing here.
    const OTHER_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBfjCCASOgAwIBAgIUNkFqVGAQUDgxly7LkX/QJweyRVUwCgYIKoZIzj0EAwIw
EzERMA8GA1UEAwwIb3RoZXItY2EwIBcNMjYxMTI5MDAxMTQ0WhgPMjEyNjExMDUw
MDExNDRaMBMxETAPBgNVBAMMCG90aGVyLWNhMFkwEwYHKoZIzj0CAQYIKoZIzj0D
AQcDQgAESm+1FI4EISICi78hR7ob+FSzwNFztzuIar0RdMGwzHdId/3i/oO7mvyA
FAV7mBCaQ7894DmogH3LrvavcoMaRaNTMFEwHQYDVR0OBBYEFJ3wcrHezITTQZni
SCtmmprHeIpIMB8GA1UdIwQYMBaAFJ3wcrHezITTQZniSCtmmprHeIpIMA8GA1Ud
EwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIhAMbfShjxRFshm4ebMFKuHnJM
ofixBjW7Wvdq3AAwhaTFAiEAhvL3yL+McAgOJy9W3xgIaqqr/9WDS+LiFsh4+C/w
ebs=
-----END CERTIFICATE-----
";
}
