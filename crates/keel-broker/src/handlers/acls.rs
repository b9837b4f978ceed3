//! CreateAcls, DescribeAcls and DeleteAcls (`kafka-acls`), and the checks
//! every other handler asks of the authorizer (`keel_auth::acl`).

use keel_protocol::messages::create_acls_response::AclCreationResult;
use keel_protocol::messages::delete_acls_response::{DeleteAclsFilterResult, DeleteAclsMatchingAcl};
use keel_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use keel_protocol::messages::*;
use keel_protocol::{ResponseError, StrBytes};

use super::str_bytes;
use crate::{Broker, ClientInfo};
use keel_auth::acl::store::AclRecord;
use keel_auth::acl::{self, Acl, AclFilter, Operation, Requester, ResourceType, CLUSTER_NAME};

impl Broker {
    /// Whether `client` may perform `operation` on a resource; the decision
    /// is logged (`keel::authorizer`). Always true without an authorizer.
    pub fn authorized(
        &self,
        client: &ClientInfo,
        operation: Operation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool {
        self.decide(client, operation, resource_type, name, true)
    }

    /// The same decision for filtering a listing (Metadata of every topic,
    /// ListGroups): as in Kafka, what is left out is logged at debug only,
    /// so a listing does not log a line per hidden resource at info.
    pub fn authorized_to_list(
        &self,
        client: &ClientInfo,
        operation: Operation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool {
        self.decide(client, operation, resource_type, name, false)
    }

    fn decide(
        &self,
        client: &ClientInfo,
        operation: Operation,
        resource_type: ResourceType,
        name: &str,
        log_denied: bool,
    ) -> bool {
        if !self.authorizer.enabled {
            return true;
        }
        as_requester(client, |who| {
            let allowed = self.acls.with_table(|t| {
                acl::authorize(
                    &self.authorizer,
                    t.matching(resource_type, name),
                    who,
                    operation,
                    resource_type,
                    name,
                )
            });
            if allowed || log_denied {
                acl::audit(who, operation, resource_type, name, allowed);
            } else {
                tracing::debug!(target: "keel::authorizer", principal = who.principal, operation = operation.name(), resource = %format!("{}:LITERAL:{name}", resource_type.name()), "left out of a listing");
            }
            allowed
        })
    }

    /// Whether `client` is one of `super.users`.
    pub fn is_super_user(&self, client: &ClientInfo) -> bool {
        self.authorizer.super_users.contains(&principal(client))
    }

    /// Whether an ACL lets `client` WRITE to some topic (Kafka's check for
    /// an idempotent producer without IDEMPOTENT_WRITE on the cluster).
    /// (Super users are allowed before this is asked.)
    pub fn may_write_some_topic(&self, client: &ClientInfo) -> bool {
        as_requester(client, |who| {
            self.acls
                .with_table(|t| acl::allows_some(t.acls.iter(), who, Operation::Write, ResourceType::Topic))
        })
    }

    /// Whether `client` may perform `operation` on the cluster.
    pub fn authorized_cluster(&self, client: &ClientInfo, operation: Operation) -> bool {
        self.authorized(client, operation, ResourceType::Cluster, CLUSTER_NAME)
    }

    /// Kafka's authorized-operations mask of a resource for `client`:
    /// every operation of its type without an authorizer.
    pub fn authorized_operations(&self, client: &ClientInfo, resource_type: ResourceType, name: &str) -> i32 {
        as_requester(client, |who| {
            self.acls.with_table(|t| {
                let on_resource: Vec<&Acl> = t.matching(resource_type, name).collect();
                acl::operations_mask(&self.authorizer, &on_resource, who, resource_type, name)
            })
        })
    }
}

/// Runs `f` with the client as the authorizer sees it: `User:<name>` of
/// its authenticated user (`ANONYMOUS` without) from its address.
fn as_requester<R>(client: &ClientInfo, f: impl FnOnce(Requester) -> R) -> R {
    let principal = principal(client);
    f(Requester {
        principal: &principal,
        host: host(client),
    })
}

/// `User:<name>` of the client's authenticated user (`ANONYMOUS` without).
fn principal(client: &ClientInfo) -> String {
    let user = client.principal();
    format!("User:{}", user.as_deref().unwrap_or(crate::quotas::ANONYMOUS))
}

/// The client's address as ACLs name hosts.
fn host(client: &ClientInfo) -> &str {
    client.host.strip_prefix('/').unwrap_or(&client.host)
}

/// Why an ACL API is refused: no authorizer, or no `operation` on the
/// cluster for the client.
fn refusal(broker: &Broker, client: &ClientInfo, operation: Operation) -> Option<(ResponseError, String)> {
    if !broker.authorizer.enabled {
        Some(security_disabled())
    } else if !broker.authorized_cluster(client, operation) {
        Some(cluster_denied())
    } else {
        None
    }
}

fn security_disabled() -> (ResponseError, String) {
    (
        ResponseError::SecurityDisabled,
        "No Authorizer is configured (authorizer.class.name)".to_string(),
    )
}

fn cluster_denied() -> (ResponseError, String) {
    (
        ResponseError::ClusterAuthorizationFailed,
        "Cluster authorization failed.".to_string(),
    )
}

pub async fn create_acls(broker: &Broker, client: &ClientInfo, req: CreateAclsRequest) -> CreateAclsResponse {
    let refusal = refusal(broker, client, Operation::Alter);
    let parsed: Vec<Result<Acl, String>> = req
        .creations
        .iter()
        .map(|c| {
            acl::acl_from_wire(
                c.resource_type,
                &c.resource_name,
                c.resource_pattern_type,
                &c.principal,
                &c.host,
                c.operation,
                c.permission_type,
            )
        })
        .collect();
    let written = match &refusal {
        Some(_) => Ok(()),
        None => {
            let records: Vec<AclRecord> = parsed
                .iter()
                .filter_map(|r| r.as_ref().ok())
                .map(|acl| AclRecord {
                    acl: acl.clone(),
                    present: true,
                })
                .collect();
            if records.is_empty() {
                Ok(())
            } else {
                broker.acls.write(records).await
            }
        }
    };
    let results = parsed
        .into_iter()
        .map(|r| {
            let (error, message) = match (&refusal, r, &written) {
                (Some((e, m)), _, _) => (*e, Some(m.clone())),
                (None, Err(m), _) => (ResponseError::InvalidRequest, Some(m)),
                (None, Ok(_), Err(e)) => (
                    ResponseError::UnknownServerError,
                    Some(format!("cannot write the ACL log: {e}")),
                ),
                (None, Ok(acl), Ok(())) => {
                    tracing::info!(?acl, "ACL created");
                    return AclCreationResult::default();
                }
            };
            AclCreationResult::default()
                .with_error_code(error.code())
                .with_error_message(message.map(str_bytes))
        })
        .collect();
    CreateAclsResponse::default().with_results(results)
}

fn filter_of(
    resource_type: i8,
    resource_name: &Option<StrBytes>,
    pattern_type: i8,
    principal: &Option<StrBytes>,
    host: &Option<StrBytes>,
    operation: i8,
    permission: i8,
) -> AclFilter {
    AclFilter {
        resource_type,
        resource_name: resource_name.as_ref().map(|s| s.to_string()),
        pattern_type,
        principal: principal.as_ref().map(|s| s.to_string()),
        host: host.as_ref().map(|s| s.to_string()),
        operation,
        permission,
    }
}

pub fn describe_acls(broker: &Broker, client: &ClientInfo, req: DescribeAclsRequest) -> DescribeAclsResponse {
    let refused = |(e, m): (ResponseError, String)| {
        DescribeAclsResponse::default()
            .with_error_code(e.code())
            .with_error_message(Some(str_bytes(m)))
    };
    if let Some(r) = refusal(broker, client, Operation::Describe) {
        return refused(r);
    }
    let filter = filter_of(
        req.resource_type_filter,
        &req.resource_name_filter,
        req.pattern_type_filter,
        &req.principal_filter,
        &req.host_filter,
        req.operation,
        req.permission_type,
    );
    if let Err(m) = filter.check() {
        return refused((ResponseError::InvalidRequest, m));
    }
    let matching: Vec<Acl> = broker
        .acls
        .with_table(|t| t.acls.iter().filter(|a| filter.matches(a)).cloned().collect());
    // One entry per resource pattern, in the table's order (grouped).
    let mut resources: Vec<DescribeAclsResource> = Vec::new();
    for acl in matching {
        let description = AclDescription::default()
            .with_principal(str_bytes(acl.principal.clone()))
            .with_host(str_bytes(acl.host.clone()))
            .with_operation(acl.operation as i8)
            .with_permission_type(acl.permission as i8);
        match resources.last_mut() {
            Some(r)
                if r.resource_type == acl.resource_type as i8
                    && r.resource_name.as_str() == acl.resource_name
                    && r.pattern_type == acl.pattern_type as i8 =>
            {
                r.acls.push(description)
            }
            _ => resources.push(
                DescribeAclsResource::default()
                    .with_resource_type(acl.resource_type as i8)
                    .with_resource_name(str_bytes(acl.resource_name.clone()))
                    .with_pattern_type(acl.pattern_type as i8)
                    .with_acls(vec![description]),
            ),
        }
    }
    DescribeAclsResponse::default().with_resources(resources)
}

pub async fn delete_acls(broker: &Broker, client: &ClientInfo, req: DeleteAclsRequest) -> DeleteAclsResponse {
    let refusal = refusal(broker, client, Operation::Alter);
    let filters: Vec<AclFilter> = req
        .filters
        .iter()
        .map(|f| {
            filter_of(
                f.resource_type_filter,
                &f.resource_name_filter,
                f.pattern_type_filter,
                &f.principal_filter,
                &f.host_filter,
                f.operation,
                f.permission_type,
            )
        })
        .collect();
    let failed = |(e, m): &(ResponseError, String)| {
        DeleteAclsFilterResult::default()
            .with_error_code(e.code())
            .with_error_message(Some(str_bytes(m.clone())))
    };
    if let Some(r) = &refusal {
        return DeleteAclsResponse::default()
            .with_filter_results(filters.iter().map(|_| failed(r)).collect());
    }
    // Matched and deleted under the admin lock, so two deletions (or a
    // creation) do not interleave between the match and the write.
    let _admin = broker.admin.lock().await;
    let matched: Vec<Result<Vec<Acl>, String>> = broker.acls.with_table(|t| {
        filters
            .iter()
            .map(|f| {
                f.check()
                    .map(|()| t.acls.iter().filter(|a| f.matches(a)).cloned().collect())
            })
            .collect()
    });
    let mut records: Vec<AclRecord> = matched
        .iter()
        .filter_map(|m| m.as_ref().ok())
        .flatten()
        .map(|acl| AclRecord {
            acl: acl.clone(),
            present: false,
        })
        .collect();
    records.dedup();
    let written = if records.is_empty() {
        Ok(())
    } else {
        broker.acls.write(records).await
    };
    let results = matched
        .into_iter()
        .map(|m| match (m, &written) {
            (Err(message), _) => failed(&(ResponseError::InvalidRequest, message)),
            (Ok(_), Err(e)) => failed(&(
                ResponseError::UnknownServerError,
                format!("cannot write the ACL log: {e}"),
            )),
            (Ok(acls), Ok(())) => DeleteAclsFilterResult::default().with_matching_acls(
                acls.into_iter()
                    .map(|acl| {
                        tracing::info!(?acl, "ACL deleted");
                        DeleteAclsMatchingAcl::default()
                            .with_resource_type(acl.resource_type as i8)
                            .with_resource_name(str_bytes(acl.resource_name))
                            .with_pattern_type(acl.pattern_type as i8)
                            .with_principal(str_bytes(acl.principal))
                            .with_host(str_bytes(acl.host))
                            .with_operation(acl.operation as i8)
                            .with_permission_type(acl.permission as i8)
                    })
                    .collect(),
            ),
        })
        .collect();
    DeleteAclsResponse::default().with_filter_results(results)
}
