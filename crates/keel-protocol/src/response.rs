//! Response framing: size prefix, response header of the version the API
//! and request version call for, then the body.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse, ResponseHeader};
use kafka_protocol::protocol::Encodable;

use crate::frame::FRAME_PREFIX_BYTES;
use crate::versions::SUPPORTED;

/// Why a response could not be encoded: a broken invariant in the handler
/// (a field value the chosen version cannot carry), never bad client input.
#[derive(Debug)]
pub struct EncodeError(pub String);

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "response encoding failed: {}", self.0)
    }
}

impl std::error::Error for EncodeError {}

/// Encodes a whole response frame, size prefix included.
pub fn encode<R: Encodable>(
    key: ApiKey,
    api_version: i16,
    correlation_id: i32,
    body: &R,
) -> Result<Bytes, EncodeError> {
    // ApiVersions responses always use header v0 so that a client that sent
    // a version the broker does not know can still read the reply (KIP-511).
    let header_version = match key {
        ApiKey::ApiVersions => 0,
        _ => key.response_header_version(api_version),
    };
    // ShareFetchResponse v2 is laid out as v1, the codec's last version
    // (see `crate::share`).
    let api_version = match key {
        ApiKey::ShareFetch => api_version.min(1),
        _ => api_version,
    };
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    // Sized up front: a large response is copied once, not regrown.
    let size = header
        .compute_size(header_version)
        .and_then(|h| Ok(h + body.compute_size(api_version)?))
        .unwrap_or(0);
    let mut buf = BytesMut::with_capacity(FRAME_PREFIX_BYTES + size);
    buf.put_i32(0);
    header
        .encode(&mut buf, header_version)
        .map_err(|e| EncodeError(e.to_string()))?;
    body.encode(&mut buf, api_version)
        .map_err(|e| EncodeError(format!("{key:?} v{api_version}: {e}")))?;
    let size = i32::try_from(buf.len() - FRAME_PREFIX_BYTES)
        .map_err(|_| EncodeError(format!("{key:?} response exceeds 2 GiB")))?;
    buf[..FRAME_PREFIX_BYTES].copy_from_slice(&size.to_be_bytes());
    Ok(buf.freeze())
}

/// The ApiVersions response listing [`SUPPORTED`], with `error_code` set.
pub fn api_versions(error_code: i16) -> ApiVersionsResponse {
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    let api_keys = SUPPORTED
        .iter()
        .map(|a| {
            ApiVersion::default()
                .with_api_key(a.key as i16)
                .with_min_version(a.advertised_min)
                .with_max_version(a.max)
        })
        .collect();
    ApiVersionsResponse::default()
        .with_error_code(error_code)
        .with_api_keys(api_keys)
}

/// The reply to an ApiVersions request of a version newer than Keel knows:
/// a v0 body with UNSUPPORTED_VERSION and the supported list, so the client
/// can retry with a version both sides speak (KIP-511).
pub fn api_versions_unsupported(correlation_id: i32) -> Result<Bytes, EncodeError> {
    let body = api_versions(kafka_protocol::error::ResponseError::UnsupportedVersion.code());
    encode(ApiKey::ApiVersions, 0, correlation_id, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Buf;
    use kafka_protocol::protocol::Decodable;

    #[test]
    fn unsupported_api_versions_reply_is_v0() {
        let frame = api_versions_unsupported(42).expect("encodes");
        let mut b = frame.clone();
        let size = b.get_i32() as usize;
        assert_eq!(size, frame.len() - 4);
        assert_eq!(b.get_i32(), 42);
        let body = ApiVersionsResponse::decode(&mut b, 0).expect("v0 body");
        assert_eq!(body.error_code, 35);
        assert!(body
            .api_keys
            .iter()
            .any(|k| k.api_key == ApiKey::ApiVersions as i16 && k.max_version == 4));
        assert!(body.api_keys.iter().any(|k| k.api_key == 0 && k.min_version == 0));
    }
}
