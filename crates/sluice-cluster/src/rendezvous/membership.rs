//! The member set: who is in the cluster and with which id.
//!
//! The leader is id 0; the other workers follow in the byte order of their exchange
//! addresses (as written), with ids 1..N. [`Membership::settle`] is a pure function of the
//! registered set (not of the order of arrival), so any worker computing it from the same
//! registrations gets the same ids, and with them the same placement. A joiner does not
//! trust the leader's welcome: [`Membership::from_welcome`] checks that it is exactly what
//! `settle` makes of its own members, and that it names the joiner.

use crate::rendezvous::WorkerInfo;
use crate::wire::{Member, Welcome};

/// The settled cluster, seen from one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// Every worker, indexed by id (the leader first).
    pub members: Vec<Member>,
    /// This worker's id.
    pub me: u32,
    /// The topology fingerprint every member runs.
    pub fingerprint: String,
}

impl Membership {
    /// The members of a cluster of the leader (`leader`: exchange address, threads and
    /// admin address) and `others`: the leader id 0, then the others by exchange address,
    /// ids 1..N.
    pub fn settle(leader: (&str, u32, &str), others: &[(String, u32, String)]) -> Vec<Member> {
        let mut sorted: Vec<&(String, u32, String)> = others.iter().collect();
        sorted.sort();
        let first =
            Member { id: 0, exchange_addr: leader.0.to_string(), threads: leader.1, admin_addr: leader.2.to_string() };
        let rest = sorted.into_iter().zip(1u32..).map(|((exchange_addr, threads, admin_addr), id)| Member {
            id,
            exchange_addr: exchange_addr.clone(),
            threads: *threads,
            admin_addr: admin_addr.clone(),
        });
        std::iter::once(first).chain(rest).collect()
    }

    /// A cluster of one: this worker leads alone.
    pub fn solo(me: &WorkerInfo) -> Membership {
        Membership {
            members: Membership::settle((&me.exchange_addr, me.threads, &me.admin_addr), &[]),
            me: 0,
            fingerprint: me.fingerprint.clone(),
        }
    }

    /// The number of workers.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Never true (there is always the leader); for symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The member with `id`.
    pub fn member(&self, id: u32) -> Option<&Member> {
        self.members.get(id as usize)
    }

    /// Whether this worker leads.
    pub fn is_leader(&self) -> bool {
        self.me == 0
    }

    /// Checks a welcome received by `me`; the error says what is wrong with it.
    pub(crate) fn from_welcome(welcome: Welcome, me: &WorkerInfo) -> Result<Membership, String> {
        let Welcome { members, you, fingerprint } = welcome;
        let Some((leader, others)) = members.split_first() else {
            return Err("it lists no members".to_string());
        };
        let pairs: Vec<(String, u32, String)> =
            others.iter().map(|m| (m.exchange_addr.clone(), m.threads, m.admin_addr.clone())).collect();
        if Membership::settle((&leader.exchange_addr, leader.threads, &leader.admin_addr), &pairs) != members {
            return Err("its members are not numbered from the leader (0) then by exchange address".to_string());
        }
        let addresses = members.iter().map(|m| m.exchange_addr.as_str());
        if addresses.clone().enumerate().any(|(i, a)| addresses.clone().skip(i + 1).any(|b| a == b)) {
            return Err("two members have the same exchange address".to_string());
        }
        match members.get(you as usize) {
            Some(member)
                if you != 0
                    && member.exchange_addr == me.exchange_addr
                    && member.threads == me.threads
                    && member.admin_addr == me.admin_addr =>
            {
                Ok(Membership { members, me: you, fingerprint })
            }
            _ => Err(format!(
                "it gives this worker id {you}, which is not this worker (exchange {}, {} threads)",
                me.exchange_addr, me.threads
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(addr: &str, threads: u32) -> WorkerInfo {
        WorkerInfo::new(addr, threads, "fp")
    }

    #[test]
    fn settling_is_a_pure_function_of_the_registered_set() {
        let one = [
            ("b:1".to_string(), 2, "b:2".to_string()),
            ("a:9".to_string(), 3, String::new()),
            ("c:0".to_string(), 1, "c:1".to_string()),
        ];
        let other_order = [one[2].clone(), one[0].clone(), one[1].clone()];
        let members = Membership::settle(("z:0", 4, ""), &one);
        assert_eq!(members, Membership::settle(("z:0", 4, ""), &other_order));
        assert_eq!(members[2].admin_addr, "b:2", "each member keeps its admin address");
        let expected = [(0, "z:0", 4), (1, "a:9", 3), (2, "b:1", 2), (3, "c:0", 1)];
        let got: Vec<(u32, &str, u32)> = members.iter().map(|m| (m.id, m.exchange_addr.as_str(), m.threads)).collect();
        assert_eq!(got, expected);
        assert_eq!(Membership::solo(&worker("z:0", 4)).members, members[..1]);
    }

    #[test]
    fn a_joiner_checks_its_welcome() {
        let members = Membership::settle(
            ("l:0", 1, ""),
            &[("a:1".to_string(), 2, String::new()), ("b:1".to_string(), 3, String::new())],
        );
        let welcome = |members: Vec<Member>, you| Welcome { members, you, fingerprint: "fp".into() };
        let me = worker("b:1", 3);
        let settled = Membership::from_welcome(welcome(members.clone(), 2), &me).expect("valid");
        assert_eq!((settled.me, settled.len(), settled.is_leader()), (2, 3, false));
        assert_eq!(settled.member(2).map(|m| m.exchange_addr.as_str()), Some("b:1"));

        let mut swapped = members.clone();
        swapped.swap(1, 2);
        let mut duplicated = members.clone();
        duplicated[2].exchange_addr = "l:0".into();
        let cases = [
            (welcome(Vec::new(), 0), "no members"),
            (welcome(swapped, 2), "not numbered"),
            (welcome(duplicated, 2), "same exchange address"),
            (welcome(members.clone(), 1), "id 1, which is not this worker"),
            (welcome(members.clone(), 0), "id 0"),
            (welcome(members.clone(), 7), "id 7"),
        ];
        for (welcome, problem) in cases {
            let error = Membership::from_welcome(welcome.clone(), &me).expect_err("refused");
            assert!(error.contains(problem), "{welcome:?}: {error}");
        }
        assert!(Membership::from_welcome(welcome(members, 2), &worker("b:1", 4)).is_err(), "threads differ");
    }
}
