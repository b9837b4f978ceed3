//! The authenticator against rsasl's client mechanisms: every exchange a
//! Kafka client runs, and the ways one fails.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rsasl::mechanisms::scram::tools::hash_password;
use rsasl::mechname::Mechname;
use rsasl::prelude::{SASLClient, SASLConfig};
use sha2::{Sha256, Sha512};

use super::credentials::{plan, Alteration, ScramCredentials, ScramMechanism};
use super::*;

const JAAS: &str = r#"org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret" user_bob="bob-secret";"#;

/// A listener's view of the broker's settings, as the broker gives it:
/// `listener.name.<listener>.<key>` over `<key>` over Kafka's default.
struct ListenerConfig {
    listener: String,
    set: BTreeMap<String, String>,
}

impl Settings for ListenerConfig {
    fn value(&self, key: &str) -> String {
        let scoped = format!("listener.name.{}.{key}", self.listener.to_ascii_lowercase());
        let default = match key {
            "sasl.enabled.mechanisms" => "GSSAPI",
            "connections.max.reauth.ms" => "0",
            "sasl.server.max.receive.size" => "524288",
            _ => "",
        };
        self.set_value(&scoped)
            .or_else(|| self.set_value(key))
            .unwrap_or_else(|| default.to_string())
            .trim()
            .to_string()
    }

    fn set_value(&self, key: &str) -> Option<String> {
        self.set.get(key).cloned()
    }
}

fn listener_config(pairs: &[(&str, &str)], listener: &str) -> ListenerConfig {
    ListenerConfig {
        listener: listener.to_string(),
        set: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    scram: Arc<ScramCredentials>,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let scram = Arc::new(
            ScramCredentials::open_with(keel_log::DiskStorage::shared(), &dir.path().join("scram")).unwrap(),
        );
        Fixture { _dir: dir, scram }
    }

    /// Sets `user`'s password for `mechanism`, salted and hashed as the
    /// Kafka admin client does before AlterUserScramCredentials.
    fn add_scram(&self, user: &str, password: &str, mechanism: ScramMechanism) {
        let salt = b"a salt of sixteen".to_vec();
        let salted = match mechanism {
            ScramMechanism::Sha256 => {
                let mut out = Default::default();
                hash_password::<Sha256>(password.as_bytes(), 4096, &salt, &mut out);
                out.to_vec()
            }
            ScramMechanism::Sha512 => {
                let mut out = Default::default();
                hash_password::<Sha512>(password.as_bytes(), 4096, &salt, &mut out);
                out.to_vec()
            }
        };
        let planned = self.scram.with_table(|t| {
            plan(
                t,
                &[Alteration::Upsert {
                    user: user.into(),
                    mechanism: mechanism.id(),
                    iterations: 4096,
                    salt: Bytes::from(salt),
                    salted_password: Bytes::from(salted),
                }],
            )
        });
        let records = planned.into_iter().next().unwrap().1.unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(self.scram.write(records)).unwrap();
    }

    fn listener(&self, pairs: &[(&str, &str)]) -> Arc<SaslListener> {
        let config = listener_config(pairs, "SASL_PLAINTEXT");
        let settings = settings(&config, "SASL_PLAINTEXT").unwrap();
        Arc::new(SaslListener::new(settings, Arc::clone(&self.scram)).unwrap())
    }

    fn all_mechanisms(&self) -> Arc<SaslListener> {
        self.listener(&[
            ("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"),
            ("listener.name.sasl_plaintext.plain.sasl.jaas.config", JAAS),
        ])
    }
}

/// Runs a client exchange against `auth` after a handshake of `version`,
/// and returns the last answer.
fn login(
    auth: &mut Authenticator,
    mechanism: &str,
    authzid: Option<&str>,
    user: &str,
    password: &str,
    version: i16,
) -> TokenAnswer {
    let hs = auth.handshake(mechanism, version);
    assert_eq!(hs.error, None, "{mechanism}");
    exchange(auth, mechanism, authzid, user, password, version == 0)
}

/// Runs a client exchange against `auth` after its handshake, and returns
/// the last answer.
fn exchange(
    auth: &mut Authenticator,
    mechanism: &str,
    authzid: Option<&str>,
    user: &str,
    password: &str,
    raw: bool,
) -> TokenAnswer {
    let config =
        SASLConfig::with_credentials(authzid.map(String::from), user.into(), password.into()).unwrap();
    let name = Mechname::parse(mechanism.as_bytes()).unwrap();
    let mut client = SASLClient::new(config).start_suggested(&[name]).unwrap();
    let mut out = Vec::new();
    client.step(None, &mut out).unwrap();
    loop {
        let answer = auth.token(&out, raw, Instant::now());
        if answer.error.is_some() || matches!(auth.exchange, Exchange::Done) {
            if answer.error.is_none() && !answer.bytes.is_empty() {
                // The client checks the server's signature (SCRAM).
                let mut none = Vec::new();
                client.step(Some(&answer.bytes), &mut none).unwrap();
            }
            return answer;
        }
        out.clear();
        client.step(Some(&answer.bytes), &mut out).unwrap();
    }
}

#[test]
fn every_mechanism_authenticates_with_both_framings() {
    let f = Fixture::new();
    f.add_scram("carol", "carol-secret", ScramMechanism::Sha256);
    f.add_scram("carol", "carol-512", ScramMechanism::Sha512);
    let listener = f.all_mechanisms();
    for version in [0, 1] {
        for (mechanism, user, password) in [
            ("PLAIN", "alice", "alice-secret"),
            ("SCRAM-SHA-256", "carol", "carol-secret"),
            ("SCRAM-SHA-512", "carol", "carol-512"),
        ] {
            let mut auth = Authenticator::new(Arc::clone(&listener));
            let answer = login(&mut auth, mechanism, None, user, password, version);
            assert_eq!(answer.error, None, "{mechanism} v{version}");
            assert_eq!(answer.next, Next::Authenticated);
            let session = auth.session().unwrap();
            assert_eq!(&*session.user, user);
            assert_eq!(session.mechanism, mechanism);
            assert_eq!(session.expires, None);
            assert!(!auth.expects_raw_token());
            // A SaslAuthenticate after authentication is answered, as in
            // Kafka, and the connection goes on.
            let again = auth.token(b"\0alice\0alice-secret", false, Instant::now());
            assert_eq!(again.error.map(|e| e.0), Some(ResponseError::IllegalSaslState));
            assert_eq!(again.next, Next::Continue);
        }
    }
}

#[test]
fn wrong_passwords_and_unknown_users_fail_without_saying_which() {
    let f = Fixture::new();
    f.add_scram("carol", "carol-secret", ScramMechanism::Sha512);
    let listener = f.all_mechanisms();
    for (mechanism, user, password) in [
        ("PLAIN", "alice", "wrong"),
        ("PLAIN", "mallory", "alice-secret"),
        ("PLAIN", "alice", "alice-secre"),
        ("SCRAM-SHA-512", "carol", "wrong"),
        ("SCRAM-SHA-512", "mallory", "carol-secret"),
        // A SHA-256 login for a user with only a SHA-512 credential.
        ("SCRAM-SHA-256", "carol", "carol-secret"),
    ] {
        let mut auth = Authenticator::new(Arc::clone(&listener));
        let answer = login(&mut auth, mechanism, None, user, password, 1);
        let (error, message) = answer.error.clone().unwrap();
        assert_eq!(
            error,
            ResponseError::SaslAuthenticationFailed,
            "{mechanism} {user}"
        );
        assert!(matches!(answer.next, Next::Fail(_)));
        assert!(
            !message.contains(user) && !message.contains(password),
            "{message}"
        );
        if let Next::Fail(reason) = &answer.next {
            assert!(!reason.contains(password), "{reason}");
        }
        assert!(auth.session().is_none());
    }
}

#[test]
fn an_authorization_id_must_be_the_user() {
    let f = Fixture::new();
    let listener = f.all_mechanisms();
    let mut auth = Authenticator::new(Arc::clone(&listener));
    let answer = login(&mut auth, "PLAIN", Some("bob"), "alice", "alice-secret", 1);
    assert_eq!(answer.error.unwrap().0, ResponseError::SaslAuthenticationFailed);
    let mut auth = Authenticator::new(listener);
    let answer = login(&mut auth, "PLAIN", Some("alice"), "alice", "alice-secret", 1);
    assert_eq!(answer.error, None);
}

#[test]
fn handshakes_outside_the_rules_are_refused() {
    let f = Fixture::new();
    let listener = f.listener(&[
        ("sasl.enabled.mechanisms", "PLAIN"),
        ("listener.name.sasl_plaintext.plain.sasl.jaas.config", JAAS),
    ]);
    let mut auth = Authenticator::new(Arc::clone(&listener));
    let hs = auth.handshake("SCRAM-SHA-256", 1);
    assert_eq!(hs.error, Some(ResponseError::UnsupportedSaslMechanism));
    assert_eq!(hs.mechanisms, vec!["PLAIN"]);
    assert!(matches!(hs.next, Next::Close(_)));
    // A token before any handshake.
    let mut auth = Authenticator::new(Arc::clone(&listener));
    let t = auth.token(b"\0alice\0alice-secret", false, Instant::now());
    assert_eq!(t.error.unwrap().0, ResponseError::IllegalSaslState);
    // A second handshake mid-exchange, and a token in the wrong framing.
    let mut auth = Authenticator::new(Arc::clone(&listener));
    assert_eq!(auth.handshake("PLAIN", 1).error, None);
    assert_eq!(
        auth.handshake("PLAIN", 1).error,
        Some(ResponseError::IllegalSaslState)
    );
    let mut auth = Authenticator::new(Arc::clone(&listener));
    auth.handshake("PLAIN", 0);
    assert!(auth.expects_raw_token());
    let t = auth.token(b"\0alice\0alice-secret", false, Instant::now());
    assert_eq!(t.error.unwrap().0, ResponseError::IllegalSaslState);
    // Malformed tokens fail the exchange, not the broker.
    for token in [&b""[..], b"\0", b"alice", b"\0\0\0\0", &[0xff; 600]] {
        let mut auth = Authenticator::new(Arc::clone(&listener));
        auth.handshake("PLAIN", 1);
        let t = auth.token(token, false, Instant::now());
        assert_eq!(t.error.unwrap().0, ResponseError::SaslAuthenticationFailed);
    }
}

#[test]
fn malformed_scram_messages_fail_the_exchange() {
    let f = Fixture::new();
    f.add_scram("carol", "carol-secret", ScramMechanism::Sha256);
    let listener = f.all_mechanisms();
    for first in [
        &b""[..],
        b"n,,",
        b"y,,n=carol,r=abc",
        b"n,,n=carol",
        b"p=tls-unique,,n=carol,r=x",
        &[0x80; 64],
    ] {
        let mut auth = Authenticator::new(Arc::clone(&listener));
        auth.handshake("SCRAM-SHA-256", 1);
        let t = auth.token(first, false, Instant::now());
        let failed = t
            .error
            .is_some_and(|(e, _)| e == ResponseError::SaslAuthenticationFailed);
        // A first message the mechanism accepts must still not authenticate.
        assert!(failed || auth.session().is_none(), "{first:?}");
        assert_not_past_the_library(&t.next, first);
    }
    // Malformed final messages after a real first one.
    for last in [
        &b""[..],
        b"c",
        b"c=biws",
        b"c=biws,r=",
        b"c=,r=x,p=",
        b"c=biws,r=x,p=!!!",
        b",,,,",
        &[0xc3; 9],
    ] {
        let mut auth = Authenticator::new(Arc::clone(&listener));
        auth.handshake("SCRAM-SHA-256", 1);
        let config = SASLConfig::with_credentials(None, "carol".into(), "carol-secret".into()).unwrap();
        let name = Mechname::parse(b"SCRAM-SHA-256").unwrap();
        let mut client = SASLClient::new(config).start_suggested(&[name]).unwrap();
        let mut first = Vec::new();
        client.step(None, &mut first).unwrap();
        let server_first = auth.token(&first, false, Instant::now());
        assert_eq!(server_first.error, None);
        let t = auth.token(last, false, Instant::now());
        assert_eq!(
            t.error.map(|e| e.0),
            Some(ResponseError::SaslAuthenticationFailed),
            "{last:?}"
        );
        assert!(auth.session().is_none());
        assert_not_past_the_library(&t.next, last);
    }
}

/// A malformed message fails its exchange before rsasl's parser, which
/// panics on attributes shorter than `X=` (the panic is caught, but it is
/// still a panic reachable from the network).
fn assert_not_past_the_library(next: &Next, message: &[u8]) {
    if let Next::Fail(reason) = next {
        assert!(!reason.contains("library"), "{message:?}: {reason}");
    }
}

#[test]
fn scram_messages_are_checked_for_rfc_5802_shape() {
    for (message, first, ok) in [
        (&b"n,,n=carol,r=abc"[..], true, true),
        (b"y,,n=carol,r=abc", true, true),
        (b"p=tls-unique,a=carol,n=carol,r=abc", true, true),
        // Kafka's delegation-token extension has a longer name.
        (b"n,,n=carol,r=abc,tokenauth=true", true, true),
        (b"n,,", true, false),
        (b"n,,n=carol,", true, false),
        (b"n,carol,n=carol,r=abc", true, false),
        (b"x,,n=carol,r=abc", true, false),
        (b"p=,,n=carol,r=abc", true, false),
        (b"n,,=carol,r=abc", true, false),
        (b"", true, false),
        (b"c=biws,r=abc,p=cHJvb2Y=", false, true),
        (b"c=biws,r=,p=", false, true),
        (b"c", false, false),
        (b"", false, false),
        (b",,,,", false, false),
        (b"c=biws,r=abc,p=x,", false, false),
        (&[0xc3; 9], false, false),
    ] {
        assert_eq!(
            super::scram_shape(message, first).is_ok(),
            ok,
            "{:?} (first: {first})",
            String::from_utf8_lossy(message)
        );
    }
}

#[test]
fn sessions_expire_and_re_authenticate_as_the_same_user() {
    let f = Fixture::new();
    f.add_scram("carol", "carol-secret", ScramMechanism::Sha512);
    let listener = f.listener(&[
        ("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-512"),
        ("listener.name.sasl_plaintext.plain.sasl.jaas.config", JAAS),
        ("listener.name.sasl_plaintext.connections.max.reauth.ms", "60000"),
    ]);
    let mut auth = Authenticator::new(Arc::clone(&listener));
    let answer = login(&mut auth, "SCRAM-SHA-512", None, "carol", "carol-secret", 1);
    assert_eq!(answer.session_lifetime_ms, 60_000);
    let expires = auth.session().unwrap().expires.unwrap();
    assert!(!auth.expired(expires - Duration::from_millis(1)));
    assert!(auth.expired(expires));
    // Re-authenticating as the same user renews the session.
    let answer = login(&mut auth, "SCRAM-SHA-512", None, "carol", "carol-secret", 1);
    assert_eq!(answer.error, None);
    assert!(auth.session().unwrap().expires.unwrap() >= expires);
    // Another mechanism, v0, or another user is refused.
    assert_eq!(
        auth.handshake("PLAIN", 1).error,
        Some(ResponseError::IllegalSaslState)
    );
    assert_eq!(
        auth.handshake("SCRAM-SHA-512", 0).error,
        Some(ResponseError::IllegalSaslState)
    );
    let mut auth = Authenticator::new(listener);
    login(&mut auth, "PLAIN", None, "alice", "alice-secret", 1);
    let answer = login(&mut auth, "PLAIN", None, "bob", "bob-secret", 1);
    let (error, message) = answer.error.unwrap();
    assert_eq!(error, ResponseError::SaslAuthenticationFailed);
    assert!(message.contains("Cannot change principals"), "{message}");
}

const METADATA: i16 = ApiKey::Metadata as i16;
const SASL_HANDSHAKE: i16 = ApiKey::SaslHandshake as i16;
const SASL_AUTHENTICATE: i16 = ApiKey::SaslAuthenticate as i16;

/// A connection logged in as carol (SCRAM-SHA-512) on a listener whose
/// sessions last a minute, and when its session ends.
fn minute_session(f: &Fixture) -> (ConnectionAuth, Instant) {
    f.add_scram("carol", "carol-secret", ScramMechanism::Sha512);
    let listener = f.listener(&[
        ("sasl.enabled.mechanisms", "SCRAM-SHA-512"),
        ("listener.name.sasl_plaintext.connections.max.reauth.ms", "60000"),
    ]);
    let auth = ConnectionAuth::new(listener);
    let answer = login(
        &mut auth.lock(),
        "SCRAM-SHA-512",
        None,
        "carol",
        "carol-secret",
        1,
    );
    assert_eq!(answer.next, Next::Authenticated);
    let expires = auth.lock().session().unwrap().expires.unwrap();
    (auth, expires)
}

#[test]
fn an_unfinished_re_authentication_does_not_extend_an_expired_session() {
    let f = Fixture::new();
    let (auth, expires) = minute_session(&f);
    assert_eq!(
        auth.gate(METADATA, expires - Duration::from_millis(1)),
        Gate::Pass
    );
    assert_eq!(auth.gate(METADATA, expires), Gate::Expired);
    // After the session's end a handshake still begins a
    // re-authentication (Kafka's clients wait for their requests in
    // flight before they start one)...
    assert_eq!(auth.gate(SASL_HANDSHAKE, expires), Gate::Pass);
    assert_eq!(auth.lock().handshake("SCRAM-SHA-512", 1).error, None);
    // ...but only its tokens are served until it succeeds, however long
    // the client takes.
    for later in [expires, expires + Duration::from_secs(3600)] {
        assert_eq!(
            auth.gate(METADATA, later),
            Gate::Expired,
            "a request after the session's end"
        );
        assert_eq!(auth.gate(SASL_AUTHENTICATE, later), Gate::Pass);
    }
    let answer = exchange(
        &mut auth.lock(),
        "SCRAM-SHA-512",
        None,
        "carol",
        "carol-secret",
        false,
    );
    assert_eq!(answer.next, Next::Authenticated);
    let renewed = auth.lock().session().unwrap().expires.unwrap();
    assert_eq!(
        auth.gate(METADATA, renewed - Duration::from_millis(1)),
        Gate::Pass
    );
    assert_eq!(auth.gate(METADATA, renewed), Gate::Expired);
}

#[test]
fn a_re_authentication_in_progress_admits_only_its_tokens() {
    let f = Fixture::new();
    let (auth, expires) = minute_session(&f);
    let now = expires - Duration::from_secs(30);
    let max_receive_bytes = auth.lock().settings().max_receive_bytes;
    assert_eq!(auth.max_frame_bytes(usize::MAX), usize::MAX);
    assert_eq!(auth.lock().handshake("SCRAM-SHA-512", 1).error, None);
    // As in Kafka, whose channel hands every frame to the authenticator
    // until the exchange ends.
    for api in [METADATA, ApiKey::Produce as i16, ApiKey::ApiVersions as i16] {
        let gate = auth.gate(api, now);
        assert!(
            matches!(gate, Gate::Close(_)),
            "API {api} during a re-authentication: {gate:?}"
        );
    }
    assert_eq!(auth.gate(SASL_AUTHENTICATE, now), Gate::Pass);
    assert_eq!(auth.max_frame_bytes(usize::MAX), max_receive_bytes);
}

#[test]
fn a_failed_re_authentication_serves_nothing_more() {
    let f = Fixture::new();
    let (auth, expires) = minute_session(&f);
    let now = expires - Duration::from_secs(30);
    let answer = login(&mut auth.lock(), "SCRAM-SHA-512", None, "carol", "wrong", 1);
    assert!(matches!(answer.next, Next::Fail(_)), "{:?}", answer.next);
    // The connection closes after the failure's delay; should another
    // frame be read meanwhile, the old session does not serve it.
    for api in [METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE] {
        let gate = auth.gate(api, now);
        assert!(
            matches!(gate, Gate::Close(_)),
            "API {api} after a failed re-authentication: {gate:?}"
        );
    }
}

#[test]
fn settings_refuse_what_keel_cannot_do() {
    for (pairs, needle) in [
        (vec![], "GSSAPI"),
        (vec![("sasl.enabled.mechanisms", "OAUTHBEARER")], "OAUTHBEARER"),
        (vec![("sasl.enabled.mechanisms", "PLAIN")], "no users"),
        (
            vec![
                ("sasl.enabled.mechanisms", "PLAIN"),
                ("listener.name.sasl_plaintext.plain.sasl.jaas.config", "com.example.Other required user_a=\"b\";"),
            ],
            "login module",
        ),
        (
            vec![
                ("sasl.enabled.mechanisms", "PLAIN"),
                (
                    "listener.name.sasl_plaintext.plain.sasl.jaas.config",
                    "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"a\" password=\"s3cret\";",
                ),
            ],
            "no user_",
        ),
    ] {
        let e = settings(&listener_config(&pairs, "SASL_PLAINTEXT"), "SASL_PLAINTEXT").unwrap_err();
        assert!(e.to_string().contains(needle), "{pairs:?}: {e}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }
    // A listener's own keys win over the broker's.
    let s = settings(
        &listener_config(
            &[
                ("sasl.enabled.mechanisms", "GSSAPI"),
                ("listener.name.sasl_ssl.sasl.enabled.mechanisms", "SCRAM-SHA-256"),
                ("connections.max.reauth.ms", "1000"),
            ],
            "SASL_SSL",
        ),
        "SASL_SSL",
    )
    .unwrap();
    assert_eq!(s.mechanisms, vec!["SCRAM-SHA-256"]);
    assert_eq!(s.reauth, Some(Duration::from_secs(1)));
}

/// Runs `login`'s client exchange against `auth` after a v1 handshake: the
/// server's last answer, and what the client made of it.
fn broker_login(auth: &mut Authenticator, login: &client::Login) -> (TokenAnswer, Result<(), String>) {
    assert_eq!(auth.handshake(login.mechanism, 1).error, None);
    let (mut exchange, mut token) = login.start().unwrap();
    loop {
        let answer = auth.token(&token, false, Instant::now());
        if answer.error.is_some() {
            return (answer, Ok(()));
        }
        match exchange.step(&answer.bytes) {
            Ok(client::Step::Send(next)) => token = next,
            Ok(client::Step::Done) => return (answer, Ok(())),
            Err(e) => return (answer, Err(e)),
        }
    }
}

#[test]
fn a_broker_logs_in_with_its_jaas_credentials_for_each_mechanism() {
    let f = Fixture::new();
    f.add_scram("broker", "broker-256", ScramMechanism::Sha256);
    f.add_scram("broker", "broker-512", ScramMechanism::Sha512);
    let listener = f.all_mechanisms();
    let scram = |password: &str| {
        format!(
            r#"{} required username="broker" password="{password}";"#,
            client::SCRAM_LOGIN_MODULE
        )
    };
    let plain = r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="alice-secret" user_alice="alice-secret";"#;
    let config = listener_config(
        &[
            ("listener.name.internal.plain.sasl.jaas.config", plain),
            (
                "listener.name.internal.scram-sha-256.sasl.jaas.config",
                &scram("broker-256"),
            ),
            (
                "listener.name.internal.scram-sha-512.sasl.jaas.config",
                &scram("broker-512"),
            ),
        ],
        "INTERNAL",
    );
    for (mechanism, user) in [
        ("PLAIN", "alice"),
        ("SCRAM-SHA-256", "broker"),
        ("SCRAM-SHA-512", "broker"),
    ] {
        let login = client::login(&config, "INTERNAL", mechanism).unwrap();
        assert_eq!(login.user, user);
        assert!(!format!("{login:?}").contains("secret"), "{login:?}");
        let mut auth = Authenticator::new(Arc::clone(&listener));
        let (answer, client) = broker_login(&mut auth, &login);
        assert_eq!(answer.error, None, "{mechanism}");
        assert_eq!(client, Ok(()), "{mechanism}");
        assert_eq!(answer.next, Next::Authenticated);
        assert_eq!(&*auth.session().unwrap().user, user);
    }

    // A wrong password: the server refuses it.
    let wrong = listener_config(
        &[(
            "listener.name.internal.scram-sha-512.sasl.jaas.config",
            &scram("nope"),
        )],
        "INTERNAL",
    );
    let login = client::login(&wrong, "INTERNAL", "SCRAM-SHA-512").unwrap();
    let (answer, _) = broker_login(&mut Authenticator::new(Arc::clone(&listener)), &login);
    assert_eq!(
        answer.error.map(|e| e.0),
        Some(ResponseError::SaslAuthenticationFailed)
    );
}

#[test]
fn a_brokers_missing_or_wrong_credentials_are_refused_with_the_key() {
    let scram = client::SCRAM_LOGIN_MODULE;
    for (pairs, mechanism, needle) in [
        (
            vec![],
            "SCRAM-SHA-512",
            "listener.name.internal.scram-sha-512.sasl.jaas.config",
        ),
        (vec![], "GSSAPI", "does not offer GSSAPI"),
        (
            vec![(
                "listener.name.internal.plain.sasl.jaas.config",
                format!(r#"{scram} required username="b" password="s3cret";"#),
            )],
            "PLAIN",
            "PLAIN's login module",
        ),
        (
            vec![(
                "listener.name.internal.scram-sha-256.sasl.jaas.config",
                format!(r#"{scram} required password="s3cret";"#),
            )],
            "SCRAM-SHA-256",
            "username is not set",
        ),
    ] {
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let e = client::login(&listener_config(&pairs, "INTERNAL"), "INTERNAL", mechanism).unwrap_err();
        assert!(e.to_string().contains(needle), "{mechanism}: {e}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }
}
