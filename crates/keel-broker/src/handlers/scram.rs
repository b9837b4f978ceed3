//! DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554):
//! what `kafka-configs --entity-type users` shows and sets as
//! `SCRAM-SHA-256=[iterations=8192,password=...]`. The credentials are
//! `keel_auth::sasl::credentials`'.

use std::collections::HashSet;

use keel_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use keel_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::str_bytes;
use crate::Broker;
use keel_auth::sasl::credentials::{plan, Alteration, ScramCredential, ScramMechanism};

pub fn describe_user_scram_credentials(
    broker: &Broker,
    req: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let infos = |creds: &std::collections::BTreeMap<ScramMechanism, ScramCredential>| -> Vec<CredentialInfo> {
        creds
            .iter()
            .map(|(m, c)| {
                CredentialInfo::default()
                    .with_mechanism(m.id())
                    .with_iterations(c.iterations)
            })
            .collect()
    };
    let results = broker.scram.with_table(|table| {
        let Some(users) = req.users.as_ref().filter(|u| !u.is_empty()) else {
            // All users with a credential.
            return table
                .users
                .iter()
                .map(|(user, creds)| {
                    DescribeUserScramCredentialsResult::default()
                        .with_user(str_bytes(user.clone()))
                        .with_credential_infos(infos(creds))
                })
                .collect();
        };
        let mut seen = HashSet::new();
        let duplicated: HashSet<&str> = users
            .iter()
            .map(|u| u.name.as_str())
            .filter(|n| !seen.insert(*n))
            .collect();
        let mut answered = HashSet::new();
        users
            .iter()
            .filter(|u| answered.insert(u.name.as_str()))
            .map(|u| {
                let name = u.name.as_str();
                let result = DescribeUserScramCredentialsResult::default().with_user(u.name.clone());
                let failed = |error: ResponseError, message: String| {
                    result
                        .clone()
                        .with_error_code(error.code())
                        .with_error_message(Some(str_bytes(message)))
                };
                if duplicated.contains(name) {
                    return failed(
                        ResponseError::DuplicateResource,
                        format!("Cannot describe SCRAM credentials for the same user twice in a single request: {name}"),
                    );
                }
                match table.users.get(name) {
                    Some(creds) => result.clone().with_credential_infos(infos(creds)),
                    None => failed(
                        ResponseError::ResourceNotFound,
                        format!("Attempt to describe a user credential that does not exist: {name}"),
                    ),
                }
            })
            .collect()
    });
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

pub async fn alter_user_scram_credentials(
    broker: &Broker,
    req: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let alterations: Vec<Alteration> = req
        .deletions
        .iter()
        .map(|d| Alteration::Delete {
            user: d.name.to_string(),
            mechanism: d.mechanism,
        })
        .chain(req.upsertions.iter().map(|u| Alteration::Upsert {
            user: u.name.to_string(),
            mechanism: u.mechanism,
            iterations: u.iterations,
            salt: u.salt.clone(),
            salted_password: u.salted_password.clone(),
        }))
        .collect();
    // Checked against the table and written in one step per request, so
    // two requests for the same user cannot both pass the check.
    let _admin = broker.admin.lock().await;
    let planned = broker.scram.with_table(|t| plan(t, &alterations));
    let records: Vec<_> = planned
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .flatten()
        .cloned()
        .collect();
    let written = if records.is_empty() {
        Ok(())
    } else {
        broker.scram.write(records).await
    };
    let results = planned
        .into_iter()
        .map(|(user, outcome)| {
            let result = AlterUserScramCredentialsResult::default().with_user(str_bytes(user.clone()));
            match (outcome, &written) {
                (Err(refusal), _) => result
                    .with_error_code(refusal.error.code())
                    .with_error_message(Some(str_bytes(refusal.message))),
                (Ok(_), Err(e)) => result
                    .with_error_code(ResponseError::UnknownServerError.code())
                    .with_error_message(Some(str_bytes(format!(
                        "cannot write the SCRAM credential log: {e}"
                    )))),
                (Ok(_), Ok(())) => {
                    tracing::info!(%user, "SCRAM credentials altered");
                    result
                }
            }
        })
        .collect();
    AlterUserScramCredentialsResponse::default().with_results(results)
}
