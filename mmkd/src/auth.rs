//! Who calls mmkd, and which jobs they may act on.
//!
//! A caller is identified by the Unix socket's peer credentials (`SO_PEERCRED`). A job's
//! owner (the uid that submitted it) and the node's operators may act on it: cancel it,
//! renew or release its allocation, read its command, environment and logs. Operators are
//! root, the user mmkd runs as, members of `--admin-group`, and the cluster scheduler's
//! users (`--scheduler-user`). Everyone else sees only what is safe of other users' jobs
//! (id, name, class, state, partition) and gets PERMISSION_DENIED for anything more.

use std::collections::HashSet;

use mmk_core::ServiceError;

use crate::job::Owner;

/// What a caller may do beyond its own jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Acts on its own jobs only.
    User,
    /// Root, mmkd's own user, the admin group, the cluster scheduler: acts on every job.
    Operator,
}

/// An identified caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub role: Role,
}

impl Caller {
    /// The caller as a job's owner (a managed job runs as this user and group).
    pub fn owner(&self) -> Owner {
        Owner {
            uid: self.uid,
            gid: self.gid,
        }
    }

    /// Whether the caller may act on, and see all of, a job owned by `owner` (`None`: a
    /// job of unknown owner, which only operators may touch).
    pub fn may_act_on(&self, owner: Option<Owner>) -> bool {
        self.role == Role::Operator || owner.is_some_and(|o| o.uid == self.uid)
    }

    /// `Ok` when the caller may act on job `id` of `owner`, else PERMISSION_DENIED.
    pub fn authorize(&self, id: u64, owner: Option<Owner>) -> Result<(), ServiceError> {
        if self.may_act_on(owner) {
            Ok(())
        } else {
            Err(ServiceError::PermissionDenied(format!(
                "job {id} belongs to another user; only its owner, root, the admin group and \
                 the cluster scheduler may act on it"
            )))
        }
    }
}

/// The node's access settings.
#[derive(Debug, Clone, Default)]
pub struct Access {
    admin_gid: Option<u32>,
    scheduler_uids: HashSet<u32>,
}

impl Access {
    pub fn new(admin_gid: Option<u32>, scheduler_uids: Vec<u32>) -> Access {
        Access {
            admin_gid,
            scheduler_uids: scheduler_uids.into_iter().collect(),
        }
    }

    /// The caller with peer credentials `uid` and `gid`.
    pub fn caller(&self, uid: u32, gid: u32) -> Caller {
        Caller {
            uid,
            gid,
            role: self.role(uid, gid),
        }
    }

    /// The caller a verified client certificate names: its subject's common name is a user
    /// of this node, whose uid and primary group the caller gets.
    pub fn caller_from_cert(&self, der: &[u8]) -> Result<Caller, ServiceError> {
        let denied = |why: String| ServiceError::PermissionDenied(why);
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|_| denied("the client certificate cannot be read".into()))?;
        let name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .ok_or_else(|| denied("the client certificate has no common name".into()))?;
        let user = uzers::get_user_by_name(name).ok_or_else(|| {
            denied(format!(
                "the client certificate names {:?}, who is not a user on this node",
                mmk_core::spec::short(name, 64)
            ))
        })?;
        // A certificate is only as careful as the CA that signed it: root's identity (and
        // mmkd's own) would let a remote caller run processes as root, so TCP never grants
        // it unless the operator named that user with --scheduler-user.
        let (uid, gid) = (user.uid(), user.primary_group_id());
        let me = crate::os::euid();
        // Group root counts too: a command job runs with the user's primary group. A
        // system user (a uid outside the node's UID_MIN..=UID_MAX: daemons, nobody) is no
        // person's.
        let (first, last) = login_uids();
        let system = uid < first || uid > last;
        if (uid == 0 || gid == 0 || uid == me || system) && !self.scheduler_uids.contains(&uid) {
            return Err(denied(format!(
                "the client certificate names {:?}, whose identity (root's, group root's, a \
                 system user's or mmkd's own) mmkd does not grant over TCP; a remote operator \
                 uses a user named with --scheduler-user",
                mmk_core::spec::short(name, 64)
            )));
        }
        Ok(self.caller(uid, gid))
    }

    fn role(&self, uid: u32, gid: u32) -> Role {
        let me = crate::os::euid();
        if uid == 0 || uid == me || self.scheduler_uids.contains(&uid) {
            return Role::Operator;
        }
        let Some(admin) = self.admin_gid else {
            return Role::User;
        };
        if gid == admin || member_of(uid, gid, admin) {
            Role::Operator
        } else {
            Role::User
        }
    }
}

/// The uids of people's accounts: `UID_MIN` and `UID_MAX` of `/etc/login.defs`, 1000 and
/// 60000 where it says none (Debian's, Red Hat's and shadow's defaults). Read once.
fn login_uids() -> (u32, u32) {
    static UIDS: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *UIDS.get_or_init(|| {
        let text = std::fs::read_to_string("/etc/login.defs").unwrap_or_default();
        (
            login_def(&text, "UID_MIN").unwrap_or(1000),
            login_def(&text, "UID_MAX").unwrap_or(60000),
        )
    })
}

/// A number set in the text of a `login.defs`.
fn login_def(text: &str, key: &str) -> Option<u32> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some(key))
            .then(|| words.next()?.parse().ok())
            .flatten()
    })
}

/// Whether user `uid` (primary group `gid`) is in group `group`, by the node's user
/// database (getgrouplist).
fn member_of(uid: u32, gid: u32, group: u32) -> bool {
    let Some(user) = uzers::get_user_by_uid(uid) else {
        return false;
    };
    uzers::get_user_groups(user.name(), gid)
        .is_some_and(|groups| groups.iter().any(|g| g.gid() == group))
}

/// The gid of group `name` (or a number).
pub fn group_id(name: &str) -> Option<u32> {
    name.parse()
        .ok()
        .or_else(|| uzers::get_group_by_name(name).map(|g| g.gid()))
}

/// The uid of user `name` (or a number).
pub fn user_id(name: &str) -> Option<u32> {
    name.parse()
        .ok()
        .or_else(|| uzers::get_user_by_name(name).map(|u| u.uid()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_and_operators_act_others_do_not() {
        let access = Access::new(None, vec![4242]);
        let alice = access.caller(5001, 5001);
        let mine = Some(Owner {
            uid: 5001,
            gid: 5001,
        });
        let bobs = Some(Owner {
            uid: 5002,
            gid: 5002,
        });
        assert!(alice.may_act_on(mine));
        assert!(!alice.may_act_on(bobs));
        assert!(
            !alice.may_act_on(None),
            "a job of unknown owner is the operators'"
        );
        let err = alice.authorize(7, bobs).expect_err("denied");
        assert!(matches!(err, ServiceError::PermissionDenied(_)), "{err:?}");
        assert!(access.caller(0, 0).may_act_on(bobs), "root");
        assert!(access.caller(4242, 100).may_act_on(bobs), "the scheduler");
    }

    #[test]
    fn peoples_uids_come_from_login_defs() {
        let defs = "# comment\nMAIL_DIR /var/mail\nUID_MIN\t\t 2000\nUID_MAX 60000\n";
        assert_eq!(login_def(defs, "UID_MIN"), Some(2000));
        assert_eq!(login_def(defs, "UID_MAX"), Some(60000));
        assert_eq!(login_def("UID_MAX 60000\n", "UID_MIN"), None);
        assert_eq!(login_def("UID_MIN lots\n", "UID_MIN"), None);
    }

    #[test]
    fn the_admin_groups_members_are_operators() {
        let access = Access::new(Some(777), Vec::new());
        assert_eq!(access.caller(5001, 777).role, Role::Operator);
        assert_eq!(access.caller(5001, 5001).role, Role::User);
    }
}
