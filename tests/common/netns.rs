//! Nodes on one network: a network namespace per node, each joined by a veth pair to a
//! bridge in the test's own namespace, which holds the servers' address. Removed on drop.

use std::{
    net::{IpAddr, Ipv4Addr},
    process::Command,
};

/// The network: `10.213.7.0/24`, the bridge at `.254`, node `i` at `.(i + 1)`.
pub struct Net {
    tag: String,
    nodes: usize,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Net {
    /// The bridge and `nodes` namespaces, each with its veth up and addressed.
    pub fn new(nodes: usize) -> Net {
        // Interface names are at most 15 bytes.
        let tag = format!("{}", std::process::id() % 100_000);
        let net = Net { tag, nodes };
        net.remove();
        let br = net.bridge();
        ip(&["link", "add", &br, "type", "bridge"]);
        ip(&["addr", "add", "10.213.7.254/24", "dev", &br]);
        ip(&["link", "set", &br, "up"]);
        for i in 0..nodes {
            let (ns, host_end, node_end) = (
                net.ns(i),
                format!("ssh{i}-{}", net.tag),
                format!("ssn{i}-{}", net.tag),
            );
            ip(&["netns", "add", &ns]);
            ip(&[
                "link", "add", &host_end, "type", "veth", "peer", "name", &node_end,
            ]);
            ip(&["link", "set", &host_end, "master", &br, "up"]);
            ip(&["link", "set", &node_end, "netns", &ns]);
            let addr = format!("{}/24", net.node_ip(i));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &node_end]);
            ip(&["-n", &ns, "link", "set", &node_end, "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        net
    }

    fn bridge(&self) -> String {
        format!("ssbr-{}", self.tag)
    }

    /// Node `i`'s namespace name.
    pub fn ns(&self, i: usize) -> String {
        format!("stallscope-{}-{i}", self.tag)
    }

    /// Node `i`'s address.
    pub fn node_ip(&self, i: usize) -> IpAddr {
        Ipv4Addr::new(10, 213, 7, i as u8 + 1).into()
    }

    /// The bridge's address, where the servers listen.
    pub fn host_ip(&self) -> IpAddr {
        Ipv4Addr::new(10, 213, 7, 254).into()
    }

    /// The program that runs a command in node `i`'s network namespace (nsenter, which
    /// execs it and changes nothing else: `ip netns exec` would also remount /sys, hiding
    /// tracefs and the cgroup tree from the daemon).
    pub fn enter(&self, i: usize) -> Vec<String> {
        vec!["nsenter".into(), format!("--net=/run/netns/{}", self.ns(i))]
    }

    fn remove(&self) {
        for i in 0..self.nodes {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(i)])
                .output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge()])
            .output();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.remove();
    }
}
