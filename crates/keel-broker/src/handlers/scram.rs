//! DescribeUserScramCredentials, which `kafka-configs --describe
//! --entity-type users` sends beside DescribeClientQuotas. Keel has no SCRAM
//! credentials yet (SASL is not there): describing all finds none, and a
//! named user's are not found, with Kafka's errors.

use std::collections::HashSet;

use keel_protocol::messages::describe_user_scram_credentials_response::DescribeUserScramCredentialsResult;
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::str_bytes;

pub fn describe_user_scram_credentials(
    req: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let users = req.users.unwrap_or_default();
    let mut seen = HashSet::new();
    let duplicated: HashSet<&str> = users
        .iter()
        .map(|u| u.name.as_str())
        .filter(|n| !seen.insert(*n))
        .collect();
    let results = users
        .iter()
        .map(|u| {
            let name = u.name.as_str();
            let (error, message) = if duplicated.contains(name) {
                (
                    ResponseError::DuplicateResource,
                    format!("Cannot describe SCRAM credentials for the same user twice in a single request: {name}"),
                )
            } else {
                (
                    ResponseError::ResourceNotFound,
                    format!("Attempt to describe a user credential that does not exist: {name}"),
                )
            };
            DescribeUserScramCredentialsResult::default()
                .with_user(u.name.clone())
                .with_error_code(error.code())
                .with_error_message(Some(str_bytes(message)))
        })
        .collect();
    DescribeUserScramCredentialsResponse::default().with_results(results)
}
