//! The host's side of sandbox networks: its routes and its Linux bridges,
//! as far as they decide whether a sandbox's subnet works.
//!
//! Docker checks a new network's subnet against its own networks only. An
//! interface Docker no longer knows (a bridge that outlived its network)
//! keeps its route, and a network given that subnet later is unreachable
//! from the host: the kernel sends the engine's packets to the dead bridge
//! (of two routes with one prefix, the older wins). So a subnet is free
//! only if the host routes it nowhere else, sandboxd's own bridges that no
//! Docker network owns are removed, and a probe that times out says when
//! the route is why.

use super::network::{Ipv4Net, SubnetPool, GUARDED_BRIDGE_PREFIX};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// One route of the host's main table (a line of `/proc/net/route`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The interface the route sends packets to.
    pub iface: String,
    /// The addresses it covers.
    pub dest: Ipv4Net,
    /// Its metric: of two routes with one prefix the lower wins.
    pub metric: u32,
}

/// The routes of `/proc/net/route`'s text that are up. Its addresses are
/// hexadecimal words in the kernel's byte order (this machine's).
pub fn parse_routes(text: &str) -> Vec<Route> {
    const RTF_UP: u32 = 0x1;
    let word = |s: &str| {
        u32::from_str_radix(s, 16)
            .ok()
            .map(|w| Ipv4Addr::from(w.to_ne_bytes()))
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (iface, dest, flags, metric, mask) =
                (f.first()?, f.get(1)?, f.get(3)?, f.get(6)?, f.get(7)?);
            let flags = u32::from_str_radix(flags, 16).ok()?;
            (flags & RTF_UP != 0).then_some(())?;
            Some(Route {
                iface: (*iface).to_owned(),
                dest: Ipv4Net::with_mask(word(dest)?, word(mask)?)?,
                metric: metric.parse().ok()?,
            })
        })
        .collect()
}

/// Whether `route` keeps `candidate` from working as a new network's
/// subnet: it overlaps it and is at least as specific, so some of the
/// candidate's addresses would go to the route's interface rather than the
/// new bridge (the longest prefix wins; of equal ones, the older route).
/// A less specific route (the default route, a VPN's 10.0.0.0/8) is
/// overridden by the new network's own route for its addresses.
fn shadows(route: &Route, candidate: &Ipv4Net) -> bool {
    route.dest.prefix() >= candidate.prefix() && route.dest.overlaps(candidate)
}

/// The host route that keeps `candidate` from working, if one does.
pub(crate) fn shadowing<'a>(routes: &'a [Route], candidate: &Ipv4Net) -> Option<&'a Route> {
    routes.iter().find(|r| shadows(r, candidate))
}

/// The first subnet of `pool` that overlaps none of `used` (Docker's
/// networks') and that no host route shadows.
pub(crate) fn free_subnet(
    pool: &SubnetPool,
    used: &[Ipv4Net],
    routes: &[Route],
) -> Option<Ipv4Net> {
    pool.pool()
        .subnets(pool.prefix())
        .find(|c| !used.iter().any(|u| u.overlaps(c)) && shadowing(routes, c).is_none())
}

/// The route the kernel takes to `addr`: the longest prefix, then the
/// lowest metric, then the first listed.
pub(crate) fn route_to(routes: &[Route], addr: Ipv4Addr) -> Option<&Route> {
    routes
        .iter()
        .filter(|r| r.dest.contains(addr))
        .min_by_key(|r| (std::cmp::Reverse(r.dest.prefix()), r.metric))
}

/// Why the host cannot reach a container's address on its network: the
/// route for it goes through another interface, or there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConflict {
    /// The container's address.
    pub addr: Ipv4Addr,
    /// The Docker network it is on.
    pub network: String,
    /// That network's bridge.
    pub bridge: String,
    /// The route the host takes instead (`None`: no route at all).
    pub taken: Option<Route>,
    /// Whether the route's interface is a sandboxd bridge no Docker network
    /// owns (a relist removes it).
    pub stale: bool,
}

impl fmt::Display for RouteConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(route) = &self.taken else {
            return write!(
                f,
                "the host has no route to {} (network {}, bridge {}): its subnet's route is gone; remove the network and sandboxd creates it again",
                self.addr, self.network, self.bridge
            );
        };
        write!(
            f,
            "the host routes {} (network {}) through {}, which holds the route for {}, not through the network's bridge {}: the engine is up but unreachable from the host; ",
            self.addr, self.network, route.iface, route.dest, self.bridge
        )?;
        if self.stale {
            write!(
                f,
                "{} is a sandboxd bridge no Docker network owns (it outlived its network): sandboxd removes it at a relist once relists have found it without a network for --stale-bridge-age (if it may: that needs CAP_NET_ADMIN on the host), or remove it now with `ip link delete {}`",
                route.iface, route.iface
            )
        } else {
            write!(
                f,
                "free {} on the host (remove that route or interface) or give sandboxd a --subnet-pool that no host route overlaps",
                route.dest
            )
        }
    }
}

/// Where the host sends packets for `addr`, a container's address on
/// `network` whose bridge is `bridge`: `None` if through that bridge.
pub(crate) fn route_conflict(
    routes: &[Route],
    addr: Ipv4Addr,
    network: &str,
    bridge: &str,
    stale_bridges: &[&str],
) -> Option<RouteConflict> {
    let taken = route_to(routes, addr);
    if taken.is_some_and(|r| r.iface == bridge) {
        return None;
    }
    Some(RouteConflict {
        addr,
        network: network.to_owned(),
        bridge: bridge.to_owned(),
        stale: taken.is_some_and(|r| stale_bridges.contains(&r.iface.as_str())),
        taken: taken.cloned(),
    })
}

/// One network interface of the host, as `/sys/class/net` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Its name.
    pub name: String,
    /// Whether it is a Linux bridge.
    pub bridge: bool,
    /// How many interfaces are plugged into it (a bridge's ports).
    pub ports: usize,
}

/// Whether `name` is one sandboxd gives its bridges
/// ([`super::network::bridge_name`]): the guarded prefix and 12 lower-case
/// hexadecimal digits.
pub(crate) fn is_sandbox_bridge_name(name: &str) -> bool {
    name.strip_prefix(GUARDED_BRIDGE_PREFIX)
        .is_some_and(|hash| {
            hash.len() == 12 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
}

/// The bridges of `links` sandboxd named that no Docker network owns
/// (`owned`: every network's bridge, whoever made it) and nothing is
/// plugged into (a bridge with ports is in use, or a network is being
/// made on it right now).
pub(crate) fn stale_bridges<'a>(links: &'a [Link], owned: &HashSet<&str>) -> Vec<&'a str> {
    links
        .iter()
        .filter(|l| {
            l.bridge
                && l.ports == 0
                && is_sandbox_bridge_name(&l.name)
                && !owned.contains(l.name.as_str())
        })
        .map(|l| l.name.as_str())
        .collect()
}

/// How long a bridge must have been found stale, by every sweep since the
/// first, before it is removed. A bridge is without its network for a while
/// whenever Docker creates or removes that network (seen here: two sweeps a
/// second apart both caught bridges of networks being removed, and the
/// bridge was gone by the time `ip link delete` ran); a bridge stale this
/// long outlived its network.
pub(crate) const STALE_BRIDGE_AGE: Duration = Duration::from_secs(30);

/// The bridges of `stale` due for removal at `now`: those that every sweep
/// since the first that found them has found stale, for at least `age`.
/// `since` holds when each was first found stale, and is left holding the
/// bridges of `stale` only (a bridge found owned again starts afresh).
pub(crate) fn due_for_removal<'a>(
    stale: &[&'a str],
    since: &mut HashMap<String, Instant>,
    now: Instant,
    age: Duration,
) -> Vec<&'a str> {
    since.retain(|name, _| stale.contains(&name.as_str()));
    stale
        .iter()
        .copied()
        .filter(|name| {
            let first = *since.entry((*name).to_owned()).or_insert(now);
            now.saturating_duration_since(first) >= age
        })
        .collect()
}

/// Whether this process sees the network namespace Docker's bridges are
/// in (the host's): it has a link (`has_link`) of the name of some bridge
/// a Docker network names.
/// In a container of its own (`--probe-via network`) it sees neither the
/// host's routes nor its bridges, and must not take its own for them. With
/// no Docker bridge to tell by, it assumes it does (nothing is at stake:
/// no network of sandboxd's exists yet).
pub(crate) fn sees_host(docker_bridges: &HashSet<&str>, has_link: impl Fn(&str) -> bool) -> bool {
    docker_bridges.is_empty() || docker_bridges.iter().any(|b| has_link(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn route(iface: &str, dest: &str, metric: u32) -> Route {
        Route {
            iface: iface.into(),
            dest: net(dest),
            metric,
        }
    }

    fn link(name: &str, bridge: bool, ports: usize) -> Link {
        Link {
            name: name.into(),
            bridge,
            ports,
        }
    }

    /// `/proc/net/route` as this machine prints it (little-endian words:
    /// the test machines are x86-64 or arm64).
    #[cfg(target_endian = "little")]
    #[test]
    fn proc_net_route_is_read_into_routes_that_are_up() {
        let text =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
            eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
            docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
            sbx0123456789ab\t0000D50A\t00000000\t0001\t0\t0\t0\tE0FFFFFF\t0\t0\t0\n\
            down0\t0000D60A\t00000000\t0000\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
            bad\tzz\n";
        assert_eq!(
            parse_routes(text),
            vec![
                route("eth0", "0.0.0.0/0", 100),
                route("docker0", "172.17.0.0/16", 0),
                route("sbx0123456789ab", "10.213.0.0/27", 0),
            ]
        );
    }

    #[test]
    fn a_subnet_is_free_when_no_network_uses_it_and_no_route_at_least_as_specific_holds_it() {
        let pool = SubnetPool::new(net("10.213.0.0/16"), 27).unwrap();
        let stale = route("sbx0123456789ab", "10.213.0.0/27", 0);
        let table: [(&str, Vec<Ipv4Net>, Vec<Route>, &str); 7] = [
            ("nothing in the way", vec![], vec![], "10.213.0.0/27"),
            (
                "a Docker network",
                vec![net("10.213.0.0/27")],
                vec![],
                "10.213.0.32/27",
            ),
            (
                "a stale bridge's route",
                vec![],
                vec![stale.clone()],
                "10.213.0.32/27",
            ),
            (
                "both, side by side",
                vec![net("10.213.0.32/27")],
                vec![stale.clone()],
                "10.213.0.64/27",
            ),
            (
                "a more specific route",
                vec![],
                vec![route("tun0", "10.213.0.8/29", 0)],
                "10.213.0.32/27",
            ),
            (
                "the default route and a VPN's /8 are overridden by the network's own",
                vec![],
                vec![
                    route("eth0", "0.0.0.0/0", 0),
                    route("tun0", "10.0.0.0/8", 0),
                ],
                "10.213.0.0/27",
            ),
            (
                "a route elsewhere",
                vec![],
                vec![route("docker0", "172.17.0.0/16", 0)],
                "10.213.0.0/27",
            ),
        ];
        for (what, used, routes, want) in table {
            assert_eq!(
                free_subnet(&pool, &used, &routes),
                Some(net(want)),
                "{what}"
            );
        }
        // Every subnet held: none left.
        let all = [route("tun0", "10.213.0.0/16", 0)];
        let small = SubnetPool::new(net("10.213.0.0/16"), 16).unwrap();
        assert_eq!(free_subnet(&small, &[], &all), None);
        assert_eq!(
            shadowing(std::slice::from_ref(&stale), &net("10.213.0.0/27")),
            Some(&stale)
        );
    }

    #[test]
    fn the_route_taken_is_the_longest_prefix_then_the_lowest_metric_then_the_first() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let routes = [
            route("eth0", "0.0.0.0/0", 0),
            route("tun0", "10.0.0.0/8", 0),
            route("sbxold", "10.213.0.0/27", 0),
            route("sbxnew", "10.213.0.0/27", 0),
            route("wlan0", "192.168.1.0/24", 600),
            route("eth1", "192.168.1.0/24", 100),
        ];
        let table = [
            ("10.213.0.2", Some("sbxold")),
            ("10.213.0.40", Some("tun0")),
            ("192.168.1.5", Some("eth1")),
            ("8.8.8.8", Some("eth0")),
        ];
        for (addr, want) in table {
            assert_eq!(
                route_to(&routes, ip(addr)).map(|r| r.iface.as_str()),
                want,
                "{addr}"
            );
        }
        assert_eq!(route_to(&routes[1..2], ip("8.8.8.8")), None);
    }

    #[test]
    fn a_conflict_is_named_when_the_route_for_the_address_is_not_through_the_networks_bridge() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let stale = "sbx0123456789ab";
        let bridge = "sbxfedcba987654";
        let routes = [
            route("eth0", "0.0.0.0/0", 0),
            route(stale, "10.213.0.0/27", 0),
            route(bridge, "10.213.0.0/27", 0),
            route(bridge, "10.213.1.0/27", 0),
            route("tun0", "10.213.2.0/27", 0),
        ];
        assert_eq!(
            route_conflict(&routes, ip("10.213.1.2"), "n", bridge, &[stale]),
            None
        );
        let c = route_conflict(&routes, ip("10.213.0.2"), "n", bridge, &[stale]).unwrap();
        assert!(c.stale);
        let text = c.to_string();
        for part in [
            stale,
            "10.213.0.0/27",
            bridge,
            "10.213.0.2",
            "--stale-bridge-age",
            "ip link delete",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        let c = route_conflict(&routes, ip("10.213.2.2"), "n", bridge, &[stale]).unwrap();
        assert!(!c.stale);
        let text = c.to_string();
        assert!(
            text.contains("tun0") && text.contains("--subnet-pool"),
            "{text}"
        );
        let c = route_conflict(&routes[1..], ip("10.213.9.2"), "n", bridge, &[stale]).unwrap();
        assert_eq!(c.taken, None);
        assert!(c.to_string().contains("no route"), "{c}");
    }

    #[test]
    fn only_unowned_unplugged_bridges_named_like_sandboxds_are_stale() {
        let links = [
            link("sbx0123456789ab", true, 0),
            link("sbx0123456789ac", true, 0),
            link("sbx0123456789ad", true, 2),
            link("sbx0123456789ae", false, 0),
            link("sbxfoo", true, 0),
            link("sbx0123456789AB", true, 0),
            link("sbx0123456789abc", true, 0),
            link("br-0123456789ab", true, 0),
            link("docker0", true, 0),
        ];
        let owned: HashSet<&str> = ["sbx0123456789ac", "docker0"].into();
        assert_eq!(stale_bridges(&links, &owned), vec!["sbx0123456789ab"]);
        let name = super::super::network::bridge_name("sandboxd.a.b");
        assert!(is_sandbox_bridge_name(&name), "{name}");
    }

    #[test]
    fn a_bridge_goes_only_once_every_sweep_has_found_it_stale_for_the_age() {
        let age = Duration::from_secs(30);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Sweeps in order: (seconds after the first, found stale, removed).
        let table: [(u64, &[&str], &[&str]); 7] = [
            (0, &["sbx000000000001", "sbx000000000002"], &[]),
            // Stale again a second later: a network being removed.
            (1, &["sbx000000000001", "sbx000000000002"], &[]),
            // 2 is owned again (its network was being created): forgotten.
            (20, &["sbx000000000001"], &[]),
            (
                30,
                &["sbx000000000001", "sbx000000000002"],
                &["sbx000000000001"],
            ),
            // 2's clock started again at 30.
            (45, &["sbx000000000002", "sbx000000000003"], &[]),
            (
                60,
                &["sbx000000000002", "sbx000000000003"],
                &["sbx000000000002"],
            ),
            (90, &[], &[]),
        ];
        let mut since = HashMap::new();
        for (t, stale, want) in table {
            assert_eq!(
                due_for_removal(stale, &mut since, at(t), age),
                want,
                "at {t} s: {stale:?}"
            );
        }
        assert!(since.is_empty(), "nothing stale is remembered: {since:?}");
    }

    #[test]
    fn the_host_is_seen_when_a_docker_bridge_is_among_the_links() {
        let links = [
            link("lo", false, 0),
            link("eth0", false, 0),
            link("docker0", true, 1),
        ];
        let table: [(&[&str], bool); 4] = [
            (&["docker0"], true),
            (&["br-0123456789ab", "docker0"], true),
            // In a container of its own: Docker's bridges are elsewhere.
            (&["br-0123456789ab"], false),
            (&[], true),
        ];
        for (bridges, want) in table {
            let bridges: HashSet<&str> = bridges.iter().copied().collect();
            let has_link = |name: &str| links.iter().any(|l| l.name == name);
            assert_eq!(sees_host(&bridges, has_link), want, "{bridges:?}");
        }
    }
}
