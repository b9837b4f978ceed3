//! What one ACL check costs with many ACLs: a scan of every ACL (how Keel
//! decided before `acl::AclIndex`) against the index. A Metadata listing
//! makes one such check per topic, and more for its operation masks.
//!
//! ```sh
//! cargo bench -p keel-auth --bench acl_checks
//! ```
//!
//! The ACLs: READ grants on topics of 100 teams for 50 users, literal, and
//! one in ten on a team's prefix (`team<k>-`). The checks: 1,000 topic
//! names of those teams, for `User:user10`, whose grants (from 100 ACLs
//! on) are the prefixes `team10-` and `team60-`. Prints a Markdown table.

use std::hint::black_box;
use std::time::Instant;

use keel_auth::acl::{
    authorize, Acl, AclIndex, AuthorizerSettings, Operation, PatternType, Permission, Requester, ResourceType,
};

fn acls(n: usize) -> Vec<Acl> {
    (0..n)
        .map(|i| {
            let prefixed = i % 10 == 0;
            Acl {
                resource_type: ResourceType::Topic,
                resource_name: if prefixed {
                    format!("team{}-", i % 100)
                } else {
                    format!("team{}-topic{i}", i % 100)
                },
                pattern_type: if prefixed {
                    PatternType::Prefixed
                } else {
                    PatternType::Literal
                },
                principal: format!("User:user{}", i % 50),
                host: "*".into(),
                operation: Operation::Read,
                permission: Permission::Allow,
            }
        })
        .collect()
}

fn main() {
    let settings = AuthorizerSettings {
        enabled: true,
        ..AuthorizerSettings::default()
    };
    let who = Requester {
        principal: "User:user10",
        host: "127.0.0.1",
    };
    let names: Vec<String> = (0..1000)
        .map(|i| format!("team{}-topic{}", i % 100, i * 7))
        .collect();
    let check = |acls: &mut dyn FnMut(&str) -> bool, checks: usize| -> (f64, usize) {
        let started = Instant::now();
        let mut allowed = 0;
        for i in 0..checks {
            allowed += usize::from(acls(black_box(&names[i % names.len()])));
        }
        (started.elapsed().as_nanos() as f64 / checks as f64, allowed)
    };
    println!("| ACLs | scan ns/check | index ns/check | scan / index | allowed (of the checks) |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for n in [10, 100, 1_000, 10_000] {
        let all = acls(n);
        let mut index = AclIndex::default();
        for a in &all {
            index.insert(a.clone());
        }
        let checks = (20_000_000 / n).clamp(10_000, 2_000_000);
        let read = |acls: &mut dyn Iterator<Item = &Acl>, name: &str| {
            authorize(&settings, acls, who, Operation::Read, ResourceType::Topic, name)
        };
        let (scan, scan_allowed) = check(&mut |name| read(&mut all.iter(), name), checks);
        let (indexed, index_allowed) = check(
            &mut |name| read(&mut index.matching(ResourceType::Topic, name), name),
            checks,
        );
        assert_eq!(scan_allowed, index_allowed, "the index decides as the scan does");
        println!(
            "| {n} | {scan:.0} | {indexed:.0} | {:.1} | {index_allowed} of {checks} |",
            scan / indexed
        );
    }
}
