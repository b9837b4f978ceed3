//! The client side of the wire, for the requests a broker sends another
//! broker (transaction markers, a transaction's partitions): a request
//! frame out, its response frame in. No I/O: the caller owns the socket.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
/// A request type and its response type.
pub use kafka_protocol::protocol::Request as ApiRequest;
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};

use crate::frame::FRAME_PREFIX_BYTES;
use crate::response::EncodeError;

/// Encodes a whole request frame, size prefix included.
pub fn encode_request<R: ApiRequest>(
    correlation_id: i32,
    client_id: &str,
    version: i16,
    body: &R,
) -> Result<Bytes, EncodeError> {
    let header_version = R::header_version(version);
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_string(client_id.to_string())));
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    header
        .encode(&mut buf, header_version)
        .map_err(|e| EncodeError(format!("request header: {e}")))?;
    body.encode(&mut buf, version)
        .map_err(|e| EncodeError(format!("api key {} v{version}: {e}", R::KEY)))?;
    let size = i32::try_from(buf.len() - FRAME_PREFIX_BYTES)
        .map_err(|_| EncodeError(format!("api key {} request exceeds 2 GiB", R::KEY)))?;
    buf[..FRAME_PREFIX_BYTES].copy_from_slice(&size.to_be_bytes());
    Ok(buf.freeze())
}

/// Decodes a response frame (without its size prefix) to request `R` at
/// `version`: its correlation id and body.
pub fn decode_response<R: ApiRequest>(mut frame: Bytes, version: i16) -> anyhow::Result<(i32, R::Response)> {
    let header = ResponseHeader::decode(&mut frame, R::Response::header_version(version))?;
    let body = R::Response::decode(&mut frame, version)?;
    if frame.has_remaining() {
        anyhow::bail!(
            "api key {} v{version}: {} bytes left after the response",
            R::KEY,
            frame.remaining()
        );
    }
    Ok((header.correlation_id, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{decode, Request as Decoded, RequestFrame};
    use kafka_protocol::messages::{ApiKey, WriteTxnMarkersRequest, WriteTxnMarkersResponse};

    #[test]
    fn a_request_frame_decodes_as_the_broker_reads_it_and_its_response_back() {
        let req = WriteTxnMarkersRequest::default();
        let frame = encode_request(7, "keel-broker-1", 1, &req).unwrap();
        let size = i32::from_be_bytes(frame[..4].try_into().unwrap());
        assert_eq!(size as usize, frame.len() - 4);
        let decoded = decode(&RequestFrame::parse(frame.slice(4..)).unwrap()).unwrap();
        assert_eq!(decoded.header.correlation_id, 7);
        assert_eq!(decoded.header.client_id.as_deref(), Some("keel-broker-1"));
        assert!(matches!(decoded.body, Decoded::WriteTxnMarkers(_)));

        let response = WriteTxnMarkersResponse::default();
        let bytes = crate::response::encode(ApiKey::WriteTxnMarkers, 1, 7, &response).unwrap();
        let (correlation, back) = decode_response::<WriteTxnMarkersRequest>(bytes.slice(4..), 1).unwrap();
        assert_eq!(correlation, 7);
        assert_eq!(back, response);
        assert!(decode_response::<WriteTxnMarkersRequest>(bytes.slice(4..6), 1).is_err());
    }
}
