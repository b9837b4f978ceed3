//! The stores that answer only once fsynced (ACLs, SCRAM credentials,
//! client quotas) across power cuts on the simulated storage.
//!
//! Replay a failure with `KEEL_TEST_SEED=<seed>`.

use std::path::Path;
use std::sync::Arc;

use keel_log::sim::SimStorage;
use keel_log::testing::test_seed;
use keel_log::Storage;

/// ACLs, SCRAM credentials and client quotas are answered only once their
/// change is fsynced: a power cut right after the answer keeps it, and so
/// a revoked ACL or a deleted credential never comes back.
#[test]
fn acls_credentials_and_quotas_survive_a_power_cut_once_answered() {
    use keel_auth::acl::store::{AclRecord, AclStore};
    use keel_auth::acl::{Acl, Operation, PatternType, Permission, ResourceType};
    use keel_auth::sasl::credentials::{ScramCredential, ScramCredentials, ScramMechanism, ScramRecord};
    use keel_broker::quotas::table::{QuotaRecord, PRODUCER_BYTE_RATE, USER};
    use keel_broker::quotas::ClientQuotas;

    let sim = SimStorage::new();
    sim.create_dir_all(Path::new("/data/__keel_meta")).unwrap();
    sim.sync_dir(Path::new("/")).unwrap();
    sim.sync_dir(Path::new("/data")).unwrap();
    let storage = || -> Arc<dyn Storage> { Arc::new(sim.clone()) };
    let meta = Path::new("/data/__keel_meta");
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let acl = Acl {
        resource_type: ResourceType::Topic,
        resource_name: "orders".into(),
        pattern_type: PatternType::Literal,
        principal: "User:alice".into(),
        host: "*".into(),
        operation: Operation::Read,
        permission: Permission::Allow,
    };
    let credential = ScramCredential::from_salted(ScramMechanism::Sha256, b"salt", &[7; 32], 4096);
    let entity: keel_broker::quotas::table::Entity = [(USER.to_string(), Some("alice".to_string()))].into();
    // Each change is written, then the power goes: nothing was closed.
    // Power losses keep a random share of what was not fsynced, so a few
    // rounds.
    let seed = test_seed();
    for round in 0..16u64 {
        let present = round % 2 == 0;
        let acls = AclStore::open_with(storage(), &meta.join("acls")).unwrap();
        let scram = ScramCredentials::open_with(storage(), &meta.join("scram")).unwrap();
        let quotas = ClientQuotas::open_with(storage(), &meta.join("quotas"), Default::default()).unwrap();
        runtime.block_on(async {
            let acl = AclRecord {
                acl: acl.clone(),
                present,
            };
            acls.write(vec![acl]).await.unwrap();
            let user = ScramRecord {
                user: "alice".into(),
                mechanism: ScramMechanism::Sha256,
                credential: present.then(|| credential.clone()),
            };
            scram.write(vec![user]).await.unwrap();
            let quota = QuotaRecord {
                entity: entity.clone(),
                key: PRODUCER_BYTE_RATE.into(),
                value: present.then_some(1024.0),
            };
            quotas.write(vec![quota]).await.unwrap();
        });
        sim.power_loss(seed.wrapping_add(round));
        drop((acls, scram, quotas));
        let acls = AclStore::open_with(storage(), &meta.join("acls")).unwrap();
        let scram = ScramCredentials::open_with(storage(), &meta.join("scram")).unwrap();
        let quotas = ClientQuotas::open_with(storage(), &meta.join("quotas"), Default::default()).unwrap();
        let has_acl = acls.with_table(|t| t.acls.contains(&acl));
        assert_eq!(has_acl, present, "the ACL after a power cut (round {round})");
        let has_user = scram.get("alice", ScramMechanism::Sha256).is_some();
        assert_eq!(
            has_user, present,
            "the SCRAM credential after a power cut (round {round})"
        );
        let has_quota = quotas
            .all()
            .get(&entity)
            .is_some_and(|q| q.contains_key(PRODUCER_BYTE_RATE));
        assert_eq!(has_quota, present, "the quota after a power cut (round {round})");
    }
}
