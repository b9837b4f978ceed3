//! SCRAM credentials, ACLs and the SASL exchange.
//!
//! One function per API: its ACL checks (`handlers::authz`), its handler,
//! the denials merged into the answer, its quota accounting, the answer.

use super::*;

pub(super) async fn describe_user_scram_credentials(
    b: &Arc<Broker>,
    r: DescribeUserScramCredentialsRequest,
    call: Call<'_>,
) -> Reply {
    let mut resp = if handlers::authz::cluster_refused(b, call.client, Operation::Describe) {
        handlers::authz::describe_user_scram_refused()
    } else {
        handlers::scram::describe_user_scram_credentials(b, r)
    };
    call.answer(b, ApiKey::DescribeUserScramCredentials, &mut resp)
}

pub(super) async fn alter_user_scram_credentials(
    b: &Arc<Broker>,
    r: AlterUserScramCredentialsRequest,
    call: Call<'_>,
) -> Reply {
    let mut resp = if handlers::authz::cluster_refused(b, call.client, Operation::Alter) {
        handlers::authz::alter_user_scram_refused(&r)
    } else {
        handlers::scram::alter_user_scram_credentials(b, r).await
    };
    call.answer(b, ApiKey::AlterUserScramCredentials, &mut resp)
}

pub(super) async fn create_acls(b: &Arc<Broker>, r: CreateAclsRequest, call: Call<'_>) -> Reply {
    call.answer(
        b,
        ApiKey::CreateAcls,
        &mut handlers::acls::create_acls(b, call.client, r).await,
    )
}

pub(super) async fn describe_acls(b: &Arc<Broker>, r: DescribeAclsRequest, call: Call<'_>) -> Reply {
    call.answer(
        b,
        ApiKey::DescribeAcls,
        &mut handlers::acls::describe_acls(b, call.client, r),
    )
}

pub(super) async fn delete_acls(b: &Arc<Broker>, r: DeleteAclsRequest, call: Call<'_>) -> Reply {
    call.answer(
        b,
        ApiKey::DeleteAcls,
        &mut handlers::acls::delete_acls(b, call.client, r).await,
    )
}

/// Kafka neither throttles nor counts the SASL exchange against
/// quotas: its answers go out as they are.
pub(super) async fn sasl_handshake(b: &Arc<Broker>, r: SaslHandshakeRequest, call: Call<'_>) -> Reply {
    let (resp, next) = handlers::sasl::handshake(call.client, &r, call.version);
    b.sasl_reply(
        ApiKey::SaslHandshake,
        call.version,
        call.id,
        &resp,
        next,
        call.client,
    )
}

pub(super) async fn sasl_authenticate(b: &Arc<Broker>, r: SaslAuthenticateRequest, call: Call<'_>) -> Reply {
    let (resp, next) = handlers::sasl::authenticate(call.client, &r);
    b.sasl_reply(
        ApiKey::SaslAuthenticate,
        call.version,
        call.id,
        &resp,
        next,
        call.client,
    )
}
