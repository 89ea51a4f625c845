//! The run's own network: one namespace per host (each node, the primary, the standby) on a
//! bridge the run makes, the clients (this process) on the bridge's address in the host's
//! namespace. Everything is made with `ip` and `tc` and removed when [`Net`] is dropped, also
//! after a panic.
//!
//! Faults are traffic classes on each host's two ends of its veth pair (its `eth0`, and the
//! bridge port that sends towards it), chosen by `u32` filters on addresses:
//! - a **partition** of a and b: what a sends to b and b to a goes to a class of 8 bit/s with a
//!   one-packet queue, so it is dropped silently (no reset, no ICMP) both ways;
//! - a **slow link**: everything to and from a host goes through a 2 Mbit/s class with a short
//!   queue (queueing delay and tail loss under load).
//!
//! This kernel has neither `sch_netem` nor tc actions (`tc qdisc add ... netem` answers "unknown
//! qdisc"), so fixed delay and reordering of packets cannot be injected here; requests are
//! reordered by the clients' concurrent connections, and the model checks (`crates/storage/tests/
//! model_*.rs`) explore reordering exhaustively.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
#[error("network setup: `{command}` failed: {reason}")]
pub struct NetError {
    command: String,
    reason: String,
}

/// One host on the run's network.
#[derive(Debug, Clone)]
pub struct Host {
    pub name: String,
    /// Its network namespace.
    pub ns: String,
    pub ip: Ipv4Addr,
    /// The bridge port (host side of its veth pair).
    port: String,
}

pub struct Net {
    bridge: String,
    /// The clients' address (the bridge's, in the host namespace).
    pub clients: Ipv4Addr,
    hosts: Vec<Host>,
}

fn ip_cmd(args: &[&str]) -> Result<(), NetError> {
    run("ip", args)
}

fn run(prog: &str, args: &[&str]) -> Result<(), NetError> {
    let command = format!("{prog} {}", args.join(" "));
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NetError { command: command.clone(), reason: e.to_string() })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetError { command, reason: String::from_utf8_lossy(&out.stderr).trim().to_owned() })
    }
}

/// `tc` on `dev`, inside namespace `ns` when given.
fn tc(ns: Option<&str>, args: &[&str]) -> Result<(), NetError> {
    match ns {
        Some(ns) => run("ip", &[&["netns", "exec", ns, "tc"], args].concat()),
        None => run("tc", args),
    }
}

/// The classes every faultable device gets: 1:10 fast (the default), 1:20 slow and lossy,
/// 1:30 a black hole.
fn classes(ns: Option<&str>, dev: &str) -> Result<(), NetError> {
    tc(ns, &["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10", "r2q", "1000"])?;
    tc(ns, &["class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit"])?;
    tc(ns, &["class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb", "rate", "2mbit", "ceil", "2mbit"])?;
    tc(ns, &["qdisc", "add", "dev", dev, "parent", "1:20", "handle", "20:", "pfifo", "limit", "30"])?;
    tc(
        ns,
        &[
            "class", "add", "dev", dev, "parent", "1:", "classid", "1:30", "htb", "rate", "8bit", "ceil", "8bit",
            "burst", "1", "cburst", "1",
        ],
    )?;
    tc(ns, &["qdisc", "add", "dev", dev, "parent", "1:30", "handle", "30:", "pfifo", "limit", "1"])
}

/// Sends what `dev` sends to (`dst`) or receives from (`src`) the address `peer` into `class`;
/// `prio` groups the filters so that a heal removes them together.
fn steer(ns: Option<&str>, dev: &str, prio: &str, field: &str, peer: &str, class: &str) -> Result<(), NetError> {
    tc(
        ns,
        &[
            "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", prio, "u32", "match", "ip", field,
            peer, "flowid", class,
        ],
    )
}

/// Partition filters (prio 1), slow links (prio 2).
const PARTITION: &str = "1";
const SLOW: &str = "2";

impl Net {
    /// A bridge and one namespace per name in `hosts`, on 10.77.`k`.0/24 with `k` from this
    /// process's id (runs at the same time do not collide).
    pub fn create(hosts: &[&str]) -> Result<Net, NetError> {
        let pid = std::process::id();
        let k = (pid % 250) as u8;
        let bridge = format!("oclb{}", pid % 100_000);
        let mut net = Net { bridge: bridge.clone(), clients: Ipv4Addr::new(10, 77, k, 1), hosts: Vec::new() };
        ip_cmd(&["link", "add", &bridge, "type", "bridge"])?;
        ip_cmd(&["addr", "add", &format!("{}/24", net.clients), "dev", &bridge])?;
        ip_cmd(&["link", "set", &bridge, "up"])?;
        for (i, name) in hosts.iter().enumerate() {
            let h = Host {
                name: (*name).to_owned(),
                ns: format!("ocl{pid}-{name}"),
                ip: Ipv4Addr::new(10, 77, k, 10 + i as u8),
                port: format!("oclp{}{}", pid % 100_000, i),
            };
            ip_cmd(&["netns", "add", &h.ns])?;
            // Pushed before the veth exists: Drop removes the namespace (and with it the pair).
            net.hosts.push(h.clone());
            ip_cmd(&["link", "add", &h.port, "type", "veth", "peer", "name", "eth0", "netns", &h.ns])?;
            ip_cmd(&["link", "set", &h.port, "master", &bridge])?;
            ip_cmd(&["link", "set", &h.port, "up"])?;
            ip_cmd(&["-n", &h.ns, "addr", "add", &format!("{}/24", h.ip), "dev", "eth0"])?;
            ip_cmd(&["-n", &h.ns, "link", "set", "eth0", "up"])?;
            ip_cmd(&["-n", &h.ns, "link", "set", "lo", "up"])?;
            classes(Some(&h.ns), "eth0")?;
            classes(None, &h.port)?;
        }
        Ok(net)
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts.iter().find(|h| h.name == name).unwrap_or_else(|| panic!("no host {name} on the run's network"))
    }

    /// Drops every packet between hosts `a` and `b` (`None`: the clients), both ways.
    pub fn partition(&self, a: &str, b: Option<&str>) -> Result<(), NetError> {
        let ha = self.host(a);
        match b.map(|b| self.host(b)) {
            Some(hb) => {
                steer(Some(&ha.ns), "eth0", PARTITION, "dst", &format!("{}/32", hb.ip), "1:30")?;
                steer(Some(&hb.ns), "eth0", PARTITION, "dst", &format!("{}/32", ha.ip), "1:30")
            }
            None => {
                let c = format!("{}/32", self.clients);
                steer(Some(&ha.ns), "eth0", PARTITION, "dst", &c, "1:30")?;
                steer(None, &ha.port, PARTITION, "src", &c, "1:30")
            }
        }
    }

    /// Everything `a` sends and receives through a slow, lossy link.
    pub fn slow(&self, a: &str) -> Result<(), NetError> {
        let h = self.host(a);
        steer(Some(&h.ns), "eth0", SLOW, "dst", "0.0.0.0/0", "1:20")?;
        steer(None, &h.port, SLOW, "dst", "0.0.0.0/0", "1:20")
    }

    /// Every partition and slow link removed.
    pub fn heal(&self) {
        for h in &self.hosts {
            for prio in [PARTITION, SLOW] {
                let _ = tc(Some(&h.ns), &["filter", "del", "dev", "eth0", "parent", "1:", "prio", prio]);
                let _ = tc(None, &["filter", "del", "dev", &h.port, "parent", "1:", "prio", prio]);
            }
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            let _ = ip_cmd(&["netns", "del", &h.ns]);
        }
        let _ = ip_cmd(&["link", "del", &self.bridge]);
    }
}
