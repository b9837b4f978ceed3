//! PKCS12 keystores and truststores (`ssl.keystore.type=PKCS12`) as
//! OpenSSL 3 and Java's keytool (JDK 12 and later) write them: bags
//! encrypted with PBES2 (PBKDF2 and AES), the whole checked with an HMAC
//! (SHA-256, -384 or -512) keyed from the store's password. The format's
//! structures come from the `pkcs12` and `cms` crates and the decryption
//! from `pkcs8`'s PBES2; this module walks the bags.
//!
//! Stores in the legacy algorithms (RC2, triple DES, a SHA-1 MAC: OpenSSL
//! 1.1's and old JDKs' defaults) are refused with how to write them again.

use cms::encrypted_data::EncryptedData;
use hmac::{Mac, SimpleHmac};
use pkcs12::authenticated_safe::AuthenticatedSafe;
use pkcs12::cert_type::CertBag;
use pkcs12::kdf::{derive_key_utf8, Pkcs12KeyType};
use pkcs12::pfx::Pfx;
use pkcs12::safe_bag::{SafeBag, SafeContents};
use pkcs8::der::asn1::{AnyRef, ContextSpecific, OctetString};
use pkcs8::der::{Decode, Encode};
use pkcs8::pkcs5::EncryptionScheme;
use pkcs8::{EncryptedPrivateKeyInfo, ObjectIdentifier};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

const ID_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.1");
const ID_ENCRYPTED_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.6");
const ID_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");
const ID_SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.2");
const ID_SHA512: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.3");
/// The attribute tying a certificate to its private key.
const LOCAL_KEY_ID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.21");
/// Java's mark of a trusted-certificate entry (keytool -importcert).
const JAVA_TRUSTED: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.113894.746875.1.1");
/// The most key-derivation iterations read (Java and OpenSSL write
/// 2,048-10,000): the counts come from the file, and each costs time.
const MAX_ITERATIONS: u32 = 1_000_000;

/// How to write a store Keel cannot read again, in algorithms it reads.
const REWRITE: &str = "write it again with OpenSSL 3 (openssl pkcs12 -in old.p12 -nodes | openssl pkcs12 \
                       -export -out new.p12, whose defaults are AES-256 and SHA-256) or a JDK 12+ keytool \
                       -importkeystore";

/// What a store holds: its certificates (a keystore's own first), those
/// a truststore trusts, and its private keys.
pub struct Store {
    pub certs: Vec<CertificateDer<'static>>,
    /// Java's trusted-certificate entries if the store marks any (as
    /// keytool does); else (OpenSSL has no such mark) every certificate
    /// not tied to a private key.
    pub trusted: Vec<CertificateDer<'static>>,
    pub keys: Vec<PrivateKeyDer<'static>>,
}

/// Reads the store `der` (`what` names it in errors: `ssl.keystore`).
/// `password` checks its integrity and decrypts its bags; an empty one
/// skips the check (as Java does) and reads only unencrypted bags.
/// Shrouded keys are decrypted with `key_password`, or `password` if it
/// is empty.
pub fn read(der: &[u8], what: &str, password: &str, key_password: &str) -> Result<Store, String> {
    let fail = |e: String| format!("{what}: {e}");
    let key_password = if key_password.is_empty() {
        password
    } else {
        key_password
    };
    let mut certs = Vec::new();
    let mut keys = Vec::new();
    for bag in &bags(der, password).map_err(fail)? {
        match bag.bag_id {
            pkcs12::PKCS_12_CERT_BAG_OID => certs.extend(cert_entry(bag).map_err(fail)?),
            pkcs12::PKCS_12_PKCS8_KEY_BAG_OID => keys.push(Entry {
                der: shrouded_key(bag, key_password).map_err(fail)?,
                key_id: local_key_id(bag),
            }),
            pkcs12::PKCS_12_KEY_BAG_OID => {
                let plain = ContextSpecific::<AnyRef<'_>>::from_der(&bag.bag_value)
                    .and_then(|k| k.value.to_der())
                    .map_err(|e| fail(format!("a malformed private key ({e})")))?;
                keys.push(Entry {
                    der: PrivateKeyDer::Pkcs8(plain.into()),
                    key_id: local_key_id(bag),
                });
            }
            _ => {}
        }
    }
    Ok(Store::new(certs, keys))
}

/// A certificate or key of the store, with the localKeyId tying them.
struct Entry<T> {
    der: T,
    key_id: Option<Vec<u8>>,
}

/// A certificate, and whether Java marked it a trusted entry.
type CertEntry = (Entry<CertificateDer<'static>>, bool);

impl Store {
    fn new(mut certs: Vec<CertEntry>, keys: Vec<Entry<PrivateKeyDer<'static>>>) -> Store {
        // The certificate of the (one) key goes first: rustls serves the
        // chain in the order given.
        if let [Entry { key_id: Some(id), .. }] = keys.as_slice() {
            if let Some(at) = certs.iter().position(|(c, _)| c.key_id.as_ref() == Some(id)) {
                let own = certs.remove(at);
                certs.insert(0, own);
            }
        }
        let marked = certs.iter().any(|(_, java_trusted)| *java_trusted);
        let trusted = certs
            .iter()
            .filter(|(c, java_trusted)| if marked { *java_trusted } else { c.key_id.is_none() })
            .map(|(c, _)| c.der.clone())
            .collect();
        Store {
            certs: certs.into_iter().map(|(c, _)| c.der).collect(),
            trusted,
            keys: keys.into_iter().map(|k| k.der).collect(),
        }
    }
}

/// The store's bags: its integrity checked with `password` (if given),
/// encrypted bags of bags decrypted with it.
fn bags(der: &[u8], password: &str) -> Result<Vec<SafeBag>, String> {
    let pfx = Pfx::from_der(der).map_err(|e| format!("not a PKCS12 store ({e})"))?;
    if pfx.auth_safe.content_type != ID_DATA {
        return Err("a public-key-protected PKCS12 store is not supported".into());
    }
    let content = octets(&pfx.auth_safe.content.to_der().map_err(|e| e.to_string())?)?;
    if !password.is_empty() {
        if let Some(mac) = &pfx.mac_data {
            check_mac(mac, password, &content)?;
        }
    }
    let safes = AuthenticatedSafe::from_der(&content).map_err(|e| format!("malformed ({e})"))?;
    let mut bags = Vec::new();
    for safe in &safes {
        let der = safe.content.to_der().map_err(|e| e.to_string())?;
        let contents = match safe.content_type {
            ID_DATA => octets(&der)?,
            ID_ENCRYPTED_DATA => decrypt_safe(&der, password)?,
            other => return Err(format!("holds content of type {other}, which Keel does not read")),
        };
        bags.extend(SafeContents::from_der(&contents).map_err(|e| format!("malformed bags ({e})"))?);
    }
    Ok(bags)
}

/// A certificate bag's X.509 certificate (others are skipped).
fn cert_entry(bag: &SafeBag) -> Result<Option<CertEntry>, String> {
    let cert = ContextSpecific::<CertBag>::from_der(&bag.bag_value)
        .map_err(|e| format!("a malformed certificate ({e})"))?;
    if cert.value.cert_id != pkcs12::PKCS_12_X509_CERT_OID {
        return Ok(None);
    }
    let entry = Entry {
        der: CertificateDer::from(cert.value.cert_value.as_bytes().to_vec()),
        key_id: local_key_id(bag),
    };
    Ok(Some((entry, attribute(bag, JAVA_TRUSTED).is_some())))
}

/// A shrouded key bag's key, decrypted with `password`.
fn shrouded_key(bag: &SafeBag, password: &str) -> Result<PrivateKeyDer<'static>, String> {
    let shrouded = ContextSpecific::<EncryptedPrivateKeyInfo<'_>>::from_der(&bag.bag_value)
        .map_err(|_| format!("its private key is encrypted in a way Keel does not read: {REWRITE}"))?;
    if password.is_empty() {
        check_scheme(&shrouded.value.encryption_algorithm)?;
        return Err("its private key is encrypted: set the password".into());
    }
    decrypt_pkcs8(&shrouded.value, password).map_err(|e| match e {
        KeyError::Scheme(e) => e,
        KeyError::Password => {
            format!("cannot decrypt the private key with the password ({REWRITE} if it is right)")
        }
    })
}

/// Why an encrypted PKCS #8 key was not decrypted.
pub enum KeyError {
    /// Its encryption is one Keel does not read ([`check_scheme`]).
    Scheme(String),
    /// The password does not open it.
    Password,
}

/// An encrypted PKCS #8 key (a PKCS12 shrouded key, or PEM's `ENCRYPTED
/// PRIVATE KEY`), decrypted once its scheme is checked.
pub fn decrypt_pkcs8(
    info: &EncryptedPrivateKeyInfo<'_>,
    password: &str,
) -> Result<PrivateKeyDer<'static>, KeyError> {
    check_scheme(&info.encryption_algorithm).map_err(KeyError::Scheme)?;
    let plain = info.decrypt(password).map_err(|_| KeyError::Password)?;
    Ok(PrivateKeyDer::Pkcs8(plain.as_bytes().to_vec().into()))
}

/// The contents of a DER OCTET STRING.
fn octets(der: &[u8]) -> Result<Vec<u8>, String> {
    OctetString::from_der(der)
        .map(|o| o.as_bytes().to_vec())
        .map_err(|e| format!("malformed ({e})"))
}

/// Checks the store's HMAC, keyed from `password` by PKCS12's KDF.
fn check_mac(mac: &pkcs12::mac_data::MacData, password: &str, content: &[u8]) -> Result<(), String> {
    fn verify<D>(mac: &pkcs12::mac_data::MacData, password: &str, content: &[u8]) -> Result<bool, String>
    where
        D: sha2::Digest + sha2::digest::FixedOutputReset + sha2::digest::core_api::BlockSizeUser,
    {
        let key = derive_key_utf8::<D>(
            password,
            mac.mac_salt.as_bytes(),
            Pkcs12KeyType::Mac,
            mac.iterations,
            <D as sha2::Digest>::output_size(),
        )
        .map_err(|e| format!("the password: {e}"))?;
        let mut hmac =
            <SimpleHmac<D> as hmac::digest::KeyInit>::new_from_slice(&key).map_err(|e| e.to_string())?;
        hmac.update(content);
        Ok(hmac.verify_slice(mac.mac.digest.as_bytes()).is_ok())
    }
    let iterations = u32::try_from(mac.iterations).unwrap_or(0);
    if !(1..=MAX_ITERATIONS).contains(&iterations) {
        return Err(format!(
            "its integrity check asks for {} iterations (Keel reads 1 to {MAX_ITERATIONS})",
            mac.iterations
        ));
    }
    let ok = match mac.mac.algorithm.oid {
        ID_SHA256 => verify::<sha2::Sha256>(mac, password, content)?,
        ID_SHA384 => verify::<sha2::Sha384>(mac, password, content)?,
        ID_SHA512 => verify::<sha2::Sha512>(mac, password, content)?,
        other => {
            return Err(format!(
                "its integrity check uses digest {other}, which Keel does not read: {REWRITE}"
            ))
        }
    };
    if ok {
        Ok(())
    } else {
        Err("the integrity check fails: wrong password, or the file is damaged".into())
    }
}

/// An encrypted bag of bags (EncryptedData, PBES2), decrypted.
fn decrypt_safe(der: &[u8], password: &str) -> Result<Vec<u8>, String> {
    let data = EncryptedData::from_der(der).map_err(|e| format!("malformed encrypted bags ({e})"))?;
    let info = data.enc_content_info;
    let legacy = || format!("its certificates are encrypted in a way Keel does not read: {REWRITE}");
    let algorithm = info.content_enc_alg.to_der().map_err(|e| e.to_string())?;
    let scheme = EncryptionScheme::from_der(&algorithm).map_err(|_| legacy())?;
    check_scheme(&scheme)?;
    if password.is_empty() {
        return Err("its certificates are encrypted: set the password".into());
    }
    let mut buffer = info
        .encrypted_content
        .map(|c| c.as_bytes().to_vec())
        .unwrap_or_default();
    let plain = scheme
        .decrypt_in_place(password, &mut buffer)
        .map_err(|_| "cannot decrypt its certificates with the password".to_string())?;
    Ok(plain.to_vec())
}

/// Whether Keel reads data encrypted with `scheme`: PBES2 with PBKDF2 and
/// at most [`MAX_ITERATIONS`] (scrypt's cost parameters, also from the
/// file, could ask for any amount of memory).
pub fn check_scheme(scheme: &EncryptionScheme<'_>) -> Result<(), String> {
    let Some(pbes2) = scheme.pbes2() else {
        return Err(format!(
            "encrypted with PBES1, which Keel does not read: {REWRITE}"
        ));
    };
    let Some(pbkdf2) = pbes2.kdf.pbkdf2() else {
        return Err("encrypted with a key derivation other than PBKDF2, which Keel does not read".into());
    };
    if !(1..=MAX_ITERATIONS).contains(&pbkdf2.iteration_count) {
        return Err(format!(
            "encrypted with {} PBKDF2 iterations (Keel reads 1 to {MAX_ITERATIONS})",
            pbkdf2.iteration_count
        ));
    }
    Ok(())
}

/// A bag's localKeyId attribute, which ties a key to its certificate.
fn local_key_id(bag: &SafeBag) -> Option<Vec<u8>> {
    attribute(bag, LOCAL_KEY_ID)
}

/// The first value of a bag's attribute `oid`.
fn attribute(bag: &SafeBag, oid: ObjectIdentifier) -> Option<Vec<u8>> {
    bag.bag_attributes
        .as_ref()?
        .iter()
        .find(|a| a.oid == oid)?
        .values
        .iter()
        .next()
        .map(|v| v.value().to_vec())
}
