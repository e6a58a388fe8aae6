//! Names of the Docker objects sandboxd creates, and the subnet pool its
//! per-sandbox networks are carved from.
//!
//! Names join the deployment, the sandbox id and the engine with `.`, a
//! character none of them may contain, so two different triples can never
//! produce one name (deployment `a` + sandbox `b-c` and deployment `a-b` +
//! sandbox `c` give `sandboxd.a.b-c.…` and `sandboxd.a-b.c.…`).

use super::id::{Deployment, EngineName, SandboxId};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// The container of one engine of one sandbox.
pub fn container_name(deployment: &Deployment, sandbox: &SandboxId, engine: EngineName) -> String {
    format!("sandboxd.{deployment}.{sandbox}.{engine}")
}

/// What the name of every container of one sandbox starts with: its
/// engines' ([`container_name`]), a rotation's candidates
/// ([`candidate_name`]) and the warm-pool containers claimed for it, which
/// take the engine's name when claimed but keep the pool's labels (Docker
/// cannot relabel a container), so that only the name tells whose they
/// are. Neither a deployment nor a sandbox id has a dot: sandbox `a`'s
/// prefix is never the start of sandbox `ab`'s names.
pub fn container_name_prefix(deployment: &Deployment, sandbox: &SandboxId) -> String {
    format!("sandboxd.{deployment}.{sandbox}.")
}

/// The one selector that finds every container of a sandbox, claimed
/// warm-pool containers included: Docker's name filter,
/// `docker ps -a --filter 'name=<this>'` (the `filters` of the list API).
/// Docker matches a name filter as an unanchored regular expression
/// against the name with and without its leading slash, so this one is
/// anchored at the start and its dots are escaped (a bare `.` matches any
/// character: `sandboxd.d.a.` would find sandbox `ab`'s containers too).
pub fn container_selector(deployment: &Deployment, sandbox: &SandboxId) -> String {
    format!(
        "^{}",
        container_name_prefix(deployment, sandbox).replace('.', "\\.")
    )
}

/// Whether `name` is [`container_name`]`(deployment, sandbox, engine)`,
/// told without building it (a relist asks for every container).
pub(crate) fn is_container_name(
    name: &str,
    deployment: &Deployment,
    sandbox: &SandboxId,
    engine: EngineName,
) -> bool {
    (|| {
        let rest = name.strip_prefix("sandboxd.")?;
        let rest = rest.strip_prefix(deployment.as_str())?.strip_prefix('.')?;
        let rest = rest.strip_prefix(sandbox.as_str())?.strip_prefix('.')?;
        Some(rest == engine.as_str())
    })()
    .unwrap_or(false)
}

/// The temporary name of a rotation's new container, built next to the
/// running one (whose name and network alias it takes once it is ready):
/// the engine's container name and `.next-` and the new container's
/// instance token, lower-cased (a DNS name).
pub(crate) fn candidate_name(canonical: &str, instance: &str) -> String {
    format!("{canonical}.next-{}", instance.to_ascii_lowercase())
}

/// The network of one sandbox (in the per-sandbox network layout).
pub fn network_name(deployment: &Deployment, sandbox: &SandboxId) -> String {
    format!("sandboxd.{deployment}.{sandbox}")
}

/// What every warm-pool network of `deployment` is called up to its
/// container's token (a name no sandbox's own network can have).
pub(crate) fn pool_network_prefix(deployment: &Deployment) -> String {
    format!("sandboxd-pool.{deployment}.")
}

/// The network sandbox `id` of `deployment` is on in the per-sandbox
/// layout: the one its status records, when that is its own network or a
/// warm-pool network it adopted with its first claim; its own network
/// otherwise.
pub fn sandbox_network(deployment: &Deployment, id: &SandboxId, recorded: Option<&str>) -> String {
    let own = network_name(deployment, id);
    match recorded {
        Some(r) if r.starts_with(&pool_network_prefix(deployment)) => r.to_owned(),
        _ => own,
    }
}

/// The sandbox whose own network is called `name`, if `deployment` named
/// it (the inverse of [`network_name`]; anything else is `None`).
pub(crate) fn sandbox_of_network(deployment: &Deployment, name: &str) -> Option<SandboxId> {
    let id = name
        .strip_prefix("sandboxd.")?
        .strip_prefix(deployment.as_str())?
        .strip_prefix('.')?;
    SandboxId::parse(id).ok()
}

/// Prefix of the Linux bridges of sandbox networks without egress, which
/// the host guard (`deploy/host-firewall.sh`) keeps from forwarding to or
/// from any other interface.
pub(crate) const GUARDED_BRIDGE_PREFIX: &str = "sbx";

/// The Linux bridge of a sandbox network without egress: the guarded prefix
/// and 12 hex digits of a hash of the network's name (15 characters, the
/// kernel's limit), the same for the same name every time.
pub fn bridge_name(network: &str) -> String {
    // FNV-1a, 64 bits: stable across builds, unlike std's hasher.
    let hash = network.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{GUARDED_BRIDGE_PREFIX}{:012x}", hash >> 16)
}

/// Why a subnet or pool was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubnetError {
    /// Not `A.B.C.D/N`.
    #[error("invalid subnet {0:?}: use IPv4 CIDR notation, e.g. 10.213.0.0/16")]
    Invalid(String),
    /// Host bits are set (`10.0.0.1/16`).
    #[error("invalid subnet {0:?}: the address has bits set past the prefix; did you mean {1}?")]
    HostBits(String, Ipv4Net),
    /// The per-network prefix does not fit inside the pool.
    #[error("a /{prefix} network does not fit in the pool {pool}: use a prefix between {} and 29", pool.prefix)]
    PrefixOutsidePool {
        /// The pool.
        pool: Ipv4Net,
        /// The requested per-network prefix.
        prefix: u8,
    },
}

/// An IPv4 network in CIDR notation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Net {
    addr: u32,
    prefix: u8,
}

impl Ipv4Net {
    /// The network `addr/prefix`; host bits must be clear.
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Option<Self> {
        let net = Self {
            addr: u32::from(addr),
            prefix,
        };
        (prefix <= 32 && net.addr & !net.mask() == 0).then_some(net)
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    fn mask(&self) -> u32 {
        u32::MAX
            .checked_shl(32 - u32::from(self.prefix))
            .unwrap_or(0)
    }

    fn last(&self) -> u32 {
        self.addr | !self.mask()
    }

    /// The network of `addr` under the netmask `mask`, if the mask is
    /// contiguous (`255.255.255.224`, not `255.0.255.0`).
    pub(crate) fn with_mask(addr: Ipv4Addr, mask: Ipv4Addr) -> Option<Self> {
        let mask = u32::from(mask);
        let prefix = mask.leading_ones() as u8;
        (mask.count_ones() == u32::from(prefix)).then(|| Self {
            addr: u32::from(addr) & mask,
            prefix,
        })
    }

    /// Whether `addr` is in the network.
    pub(crate) fn contains(&self, addr: Ipv4Addr) -> bool {
        let a = u32::from(addr);
        self.addr <= a && a <= self.last()
    }

    /// Whether the two networks share an address.
    pub(crate) fn overlaps(&self, other: &Ipv4Net) -> bool {
        self.addr <= other.last() && other.addr <= self.last()
    }

    /// The first usable address, which Docker makes the bridge's gateway.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.addr + 1)
    }

    /// The `/prefix` networks inside this one, in address order.
    pub fn subnets(&self, prefix: u8) -> impl Iterator<Item = Ipv4Net> {
        let first = self.addr;
        let step = 1u64 << (32 - u32::from(prefix.min(32)));
        let count = if prefix < self.prefix || prefix > 32 {
            0
        } else {
            1u64 << (prefix - self.prefix)
        };
        (0..count).map(move |i| Ipv4Net {
            addr: (u64::from(first) + i * step) as u32,
            prefix,
        })
    }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.addr), self.prefix)
    }
}

impl FromStr for Ipv4Net {
    type Err = SubnetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || SubnetError::Invalid(s.to_owned());
        let (addr, prefix) = s.split_once('/').ok_or_else(invalid)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| invalid())?;
        let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
        if prefix > 32 {
            return Err(invalid());
        }
        let masked = Ipv4Net {
            addr: u32::from(addr),
            prefix,
        };
        let clean = Ipv4Net {
            addr: masked.addr & masked.mask(),
            prefix,
        };
        if clean.addr == masked.addr {
            Ok(clean)
        } else {
            Err(SubnetError::HostBits(s.to_owned(), clean))
        }
    }
}

/// Where per-sandbox networks get their subnets: `pool` cut into `/prefix`
/// networks. The daemon's default pools hold about thirty bridge networks;
/// the default pool here, 10.213.0.0/16 in /27s, holds 2048 of 29 hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubnetPool {
    pool: Ipv4Net,
    prefix: u8,
}

impl SubnetPool {
    /// `pool` cut into `/prefix` networks (at most /29: gateway, two
    /// engines and an agent need room).
    pub fn new(pool: Ipv4Net, prefix: u8) -> Result<Self, SubnetError> {
        if prefix < pool.prefix || prefix > 29 {
            return Err(SubnetError::PrefixOutsidePool { pool, prefix });
        }
        Ok(Self { pool, prefix })
    }

    /// The prefix length of each network.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// The whole pool.
    pub fn pool(&self) -> Ipv4Net {
        self.pool
    }

    /// The first network of the pool that overlaps none of `used`, if any
    /// is left.
    pub(crate) fn first_free(&self, used: &[Ipv4Net]) -> Option<Ipv4Net> {
        self.pool
            .subnets(self.prefix)
            .find(|candidate| !used.iter().any(|u| u.overlaps(candidate)))
    }
}

impl Default for SubnetPool {
    fn default() -> Self {
        Self {
            pool: Ipv4Net {
                addr: u32::from(Ipv4Addr::new(10, 213, 0, 0)),
                prefix: 16,
            },
            prefix: 27,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_container_selector_is_the_sandboxs_name_prefix_anchored_with_its_dots_escaped() {
        let d = Deployment::parse("prod").unwrap();
        let cases = [
            ("a", "sandboxd.prod.a.", r"^sandboxd\.prod\.a\."),
            ("ab", "sandboxd.prod.ab.", r"^sandboxd\.prod\.ab\."),
            (
                "agent-7_x",
                "sandboxd.prod.agent-7_x.",
                r"^sandboxd\.prod\.agent-7_x\.",
            ),
        ];
        for (id, prefix, selector) in cases {
            let id = SandboxId::parse(id).unwrap();
            assert_eq!(container_name_prefix(&d, &id), prefix);
            assert_eq!(container_selector(&d, &id), selector);
            let name = container_name(&d, &id, EngineName::of_engine("postgres"));
            assert!(name.starts_with(prefix), "{name}");
            assert!(candidate_name(&name, "I1").starts_with(prefix));
        }
    }

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn names_cannot_collide_across_deployments_and_ids() {
        let a = Deployment::parse("a").unwrap();
        let ab = Deployment::parse("a-b").unwrap();
        let bc = SandboxId::parse("b-c").unwrap();
        let c = SandboxId::parse("c").unwrap();
        let pg = EngineName::of_engine("postgres");
        assert_ne!(container_name(&a, &bc, pg), container_name(&ab, &c, pg));
        assert_ne!(network_name(&a, &bc), network_name(&ab, &c));
        assert_eq!(container_name(&a, &bc, pg), "sandboxd.a.b-c.postgres");
    }

    #[test]
    fn a_name_is_recognised_as_an_engines_container_name_exactly_when_it_is_one() {
        let pg = EngineName::of_engine("postgres");
        let redis = EngineName::of_engine("redis");
        let a = Deployment::parse("a").unwrap();
        let ab = Deployment::parse("a-b").unwrap();
        let bc = SandboxId::parse("b-c").unwrap();
        let c = SandboxId::parse("c").unwrap();
        for (d, s, e) in [(&a, &bc, pg), (&ab, &c, pg), (&a, &bc, redis)] {
            let name = container_name(d, s, e);
            assert!(is_container_name(&name, d, s, e), "{name}");
        }
        let name = container_name(&a, &bc, pg);
        assert!(!is_container_name(&name, &ab, &c, pg));
        assert!(!is_container_name(&name, &a, &bc, redis));
        assert!(!is_container_name(&format!("{name}.next-x"), &a, &bc, pg));
        assert!(!is_container_name("sandboxd.a.b-c", &a, &bc, pg));
        assert!(!is_container_name("", &a, &bc, pg));
        assert_eq!(network_name(&ab, &c), "sandboxd.a-b.c");
    }

    #[test]
    fn a_rotation_candidate_is_named_after_its_engine_container_and_its_token() {
        let name = candidate_name("sandboxd.a.b-c.postgres", "AbC123");
        assert_eq!(name, "sandboxd.a.b-c.postgres.next-abc123");
        assert!(
            name.starts_with("sandboxd.a.b-c."),
            "an attach sync keeps it"
        );
    }

    #[test]
    fn a_network_name_gives_back_its_sandbox_only_for_its_own_deployment() {
        let a = Deployment::parse("a").unwrap();
        let id = |s: &str| SandboxId::parse(s).ok();
        let table = [
            ("sandboxd.a.b-c", id("b-c")),
            ("sandboxd.a.x", id("x")),
            // Another deployment's, whose name merely starts like ours.
            ("sandboxd.a-b.c", None),
            // A container's name, not a network's.
            ("sandboxd.a.b-c.postgres", None),
            ("sandboxd.a.", None),
            ("sandboxd.a", None),
            ("other.a.b", None),
            ("bridge", None),
        ];
        for (name, want) in table {
            assert_eq!(sandbox_of_network(&a, name), want, "{name}");
        }
        let c = SandboxId::parse("c").unwrap();
        assert_eq!(sandbox_of_network(&a, &network_name(&a, &c)), Some(c));
    }

    #[test]
    fn bridge_names_are_stable_guarded_and_fit_the_kernel_limit() {
        let a = bridge_name("sandboxd.a.b-c");
        assert_eq!(a, bridge_name("sandboxd.a.b-c"));
        assert_ne!(a, bridge_name("sandboxd.a-b.c"));
        assert!(a.starts_with(GUARDED_BRIDGE_PREFIX));
        assert_eq!(a.len(), 15);
    }

    #[test]
    fn cidrs_parse_print_and_refuse_host_bits() {
        assert_eq!(net("10.213.0.0/16").to_string(), "10.213.0.0/16");
        assert_eq!(
            "10.213.0.1/16".parse::<Ipv4Net>(),
            Err(SubnetError::HostBits(
                "10.213.0.1/16".into(),
                net("10.213.0.0/16")
            ))
        );
        assert!("10.213.0.0".parse::<Ipv4Net>().is_err());
        assert!("10.213.0.0/33".parse::<Ipv4Net>().is_err());
        assert!("nonsense/8".parse::<Ipv4Net>().is_err());
        assert_eq!(net("10.0.0.0/8").gateway(), Ipv4Addr::new(10, 0, 0, 1));
    }

    #[test]
    fn overlapping_networks_are_recognised_both_ways() {
        assert!(net("10.0.0.0/8").overlaps(&net("10.213.4.0/27")));
        assert!(net("10.213.4.0/27").overlaps(&net("10.0.0.0/8")));
        assert!(!net("10.213.4.0/27").overlaps(&net("10.213.4.32/27")));
        assert!(net("0.0.0.0/0").overlaps(&net("192.168.1.0/24")));
    }

    #[test]
    fn netmasks_give_prefixes_and_addresses_fall_inside_or_outside() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let table = [
            ("10.213.0.0", "255.255.255.224", Some("10.213.0.0/27")),
            ("10.213.0.7", "255.255.255.224", Some("10.213.0.0/27")),
            ("0.0.0.0", "0.0.0.0", Some("0.0.0.0/0")),
            ("192.0.2.1", "255.255.255.255", Some("192.0.2.1/32")),
            ("10.0.0.0", "255.0.255.0", None),
        ];
        for (addr, mask, want) in table {
            assert_eq!(
                Ipv4Net::with_mask(ip(addr), ip(mask)),
                want.map(net),
                "{addr} {mask}"
            );
        }
        assert!(net("10.213.0.0/27").contains(ip("10.213.0.31")));
        assert!(!net("10.213.0.0/27").contains(ip("10.213.0.32")));
        assert!(net("0.0.0.0/0").contains(ip("255.255.255.255")));
    }

    #[test]
    fn the_pool_hands_out_the_first_subnet_no_network_uses() {
        let pool = SubnetPool::new(net("10.213.0.0/16"), 27).unwrap();
        assert_eq!(pool.first_free(&[]), Some(net("10.213.0.0/27")));
        let used = [net("10.213.0.0/27"), net("10.213.0.64/26")];
        assert_eq!(pool.first_free(&used), Some(net("10.213.0.32/27")));
        let used = [
            net("10.213.0.0/27"),
            net("10.213.0.32/27"),
            net("10.213.0.64/26"),
        ];
        assert_eq!(pool.first_free(&used), Some(net("10.213.0.128/27")));
        // A network covering the whole pool leaves nothing.
        assert_eq!(pool.first_free(&[net("10.0.0.0/8")]), None);
        assert_eq!(pool.pool().subnets(27).count(), 2048);
    }

    #[test]
    fn a_prefix_outside_the_pool_is_refused() {
        assert!(SubnetPool::new(net("10.213.0.0/16"), 12).is_err());
        assert!(SubnetPool::new(net("10.213.0.0/16"), 30).is_err());
        assert_eq!(SubnetPool::default().pool(), net("10.213.0.0/16"));
    }

    #[test]
    fn a_sandbox_is_on_its_own_network_unless_its_status_records_an_adopted_pool_network() {
        let a = Deployment::parse("a").unwrap();
        let b = Deployment::parse("b").unwrap();
        let id = SandboxId::parse("x").unwrap();
        assert_eq!(sandbox_network(&a, &id, None), "sandboxd.a.x");
        assert_eq!(
            sandbox_network(&a, &id, Some("sandboxd-pool.a.tok")),
            "sandboxd-pool.a.tok"
        );
        // Another deployment's pool network, or anything else, is not its.
        assert_eq!(
            sandbox_network(&a, &id, Some("sandboxd-pool.b.tok")),
            "sandboxd.a.x"
        );
        assert_eq!(sandbox_network(&a, &id, Some("bridge")), "sandboxd.a.x");
        assert_eq!(
            sandbox_network(&b, &id, Some("sandboxd-pool.b.tok")),
            "sandboxd-pool.b.tok"
        );
    }
}
