//! The ACLs by the resource names they can match, so that a check looks
//! up a few keys instead of scanning every ACL: literal ACLs by name (`*`
//! among them), prefixed ones by prefix, and the prefix lengths in use
//! per resource type. A check of `name` then reads the ACLs on `name`, on
//! `*`, and on `name`'s first n characters for each prefix length n in use.
//! (Kafka's StandardAuthorizer walks a sorted set for the same reason.)

use std::collections::{BTreeMap, HashMap};

use super::{Acl, PatternType, ResourceType, WILDCARD};

type ByName = HashMap<String, Vec<Acl>>;

#[derive(Debug, Default)]
pub struct AclIndex {
    literal: HashMap<ResourceType, ByName>,
    prefixed: HashMap<ResourceType, ByName>,
    /// Per resource type: prefix length -> how many prefixes of it have
    /// ACLs.
    prefix_lengths: HashMap<ResourceType, BTreeMap<usize, usize>>,
}

impl AclIndex {
    pub fn insert(&mut self, acl: Acl) {
        let (t, name) = (acl.resource_type, acl.resource_name.clone());
        let prefixed = acl.pattern_type == PatternType::Prefixed;
        let by_name = self.by_name(acl.pattern_type).entry(t).or_default();
        let acls = by_name.entry(name.clone()).or_default();
        if acls.contains(&acl) {
            return;
        }
        acls.push(acl);
        if prefixed && acls.len() == 1 {
            *self
                .prefix_lengths
                .entry(t)
                .or_default()
                .entry(name.len())
                .or_default() += 1;
        }
    }

    pub fn remove(&mut self, acl: &Acl) {
        let t = acl.resource_type;
        let Some(by_name) = self.by_name(acl.pattern_type).get_mut(&t) else {
            return;
        };
        let Some(acls) = by_name.get_mut(&acl.resource_name) else {
            return;
        };
        acls.retain(|a| a != acl);
        if !acls.is_empty() {
            return;
        }
        by_name.remove(&acl.resource_name);
        if acl.pattern_type == PatternType::Prefixed {
            if let Some(lengths) = self.prefix_lengths.get_mut(&t) {
                let len = acl.resource_name.len();
                match lengths.get_mut(&len) {
                    Some(n) if *n > 1 => *n -= 1,
                    _ => {
                        lengths.remove(&len);
                    }
                }
            }
        }
    }

    /// Whether no ACL is indexed (nor any prefix length left behind).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.literal.values().all(HashMap::is_empty)
            && self.prefixed.values().all(HashMap::is_empty)
            && self.prefix_lengths.values().all(BTreeMap::is_empty)
    }

    fn by_name(&mut self, pattern: PatternType) -> &mut HashMap<ResourceType, ByName> {
        match pattern {
            PatternType::Literal => &mut self.literal,
            PatternType::Prefixed => &mut self.prefixed,
        }
    }

    /// Every ACL that can match the resource `name` of type `t` (exactly
    /// the ACLs a check of it must weigh).
    pub fn matching<'a>(&'a self, t: ResourceType, name: &'a str) -> impl Iterator<Item = &'a Acl> + 'a {
        let literal = self.literal.get(&t);
        let exact = literal.and_then(|m| m.get(name));
        let every = literal.filter(|_| name != WILDCARD).and_then(|m| m.get(WILDCARD));
        let prefixed = self.prefixed.get(&t);
        let prefixes = self
            .prefix_lengths
            .get(&t)
            .into_iter()
            .flat_map(|lengths| lengths.keys())
            .take_while(move |len| **len <= name.len())
            .filter(move |len| name.is_char_boundary(**len))
            .filter_map(move |len| prefixed.and_then(|m| m.get(&name[..*len])));
        exact.into_iter().chain(every).chain(prefixes).flatten()
    }
}
