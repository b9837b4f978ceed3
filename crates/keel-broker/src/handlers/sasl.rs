//! SaslHandshake and SaslAuthenticate: the connection's authenticator
//! (`keel_auth::sasl`) answers; on a listener without SASL both are
//! ILLEGAL_SASL_STATE, as in Kafka.

use std::time::Instant;

use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::str_bytes;
use crate::ClientInfo;
use keel_auth::sasl::Next;

pub fn handshake(
    client: &ClientInfo,
    req: &SaslHandshakeRequest,
    version: i16,
) -> (SaslHandshakeResponse, Next) {
    let Some(auth) = &client.sasl else {
        let resp = SaslHandshakeResponse::default().with_error_code(ResponseError::IllegalSaslState.code());
        return (resp, Next::Continue);
    };
    let answer = auth.lock().handshake(req.mechanism.as_str(), version);
    let resp = SaslHandshakeResponse::default()
        .with_error_code(answer.error.map_or(0, |e| e.code()))
        .with_mechanisms(
            answer
                .mechanisms
                .iter()
                .map(|m| str_bytes(m.to_string()))
                .collect(),
        );
    (resp, answer.next)
}

pub fn authenticate(client: &ClientInfo, req: &SaslAuthenticateRequest) -> (SaslAuthenticateResponse, Next) {
    let Some(auth) = &client.sasl else {
        let resp = SaslAuthenticateResponse::default()
            .with_error_code(ResponseError::IllegalSaslState.code())
            .with_error_message(Some(str_bytes(
                "SaslAuthenticate request received after successful authentication".to_string(),
            )));
        return (resp, Next::Continue);
    };
    let answer = auth.lock().token(&req.auth_bytes, false, Instant::now());
    let mut resp = SaslAuthenticateResponse::default()
        .with_auth_bytes(answer.bytes.into())
        .with_session_lifetime_ms(answer.session_lifetime_ms);
    if let Some((error, message)) = answer.error {
        resp = resp
            .with_error_code(error.code())
            .with_error_message(Some(str_bytes(message)));
    }
    (resp, answer.next)
}
