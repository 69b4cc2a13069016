//! Test hosts in network namespaces: a hub namespace holding a bridge, and one namespace per
//! host linked to it by a veth pair, all on 10.213.0.0/24 (the hub is .1, host `i` is
//! `.{i + 2}`). Nothing is added to the machine's own namespace, so traffic goes only between
//! namespaces the test made. The test's own clients, and processes it starts directly, run in
//! the hub ([`Net::run_in_hub`]); a host's processes run under [`Net::exec`]. Partitions are
//! nftables rules inside a host's namespace. Everything is deleted on drop.
//!
//! This needs root (or `CAP_NET_ADMIN` and `CAP_SYS_ADMIN`) and Debian's `iproute2` and
//! `nftables`. `scripts/test` installs them, checks that a namespace can be made, and says so
//! when it cannot (then `MODELMUX_TEST_NETNS` starts with `unavailable`).
#![allow(dead_code, unreachable_pub)]

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// The prefix of every namespace these tests make (`<prefix><pid>-<tag>-<host>`).
const PREFIX: &str = "mmx";

/// Whether this run may make namespaces: `true` when `MODELMUX_TEST_NETNS=1` (the test command
/// found it can). Otherwise the test fails, saying what is missing, unless
/// `MODELMUX_TEST_ALLOW_NO_NETNS=1` accepts the gap: then it is named on standard error and in
/// the suite's list of parts not run (`MODELMUX_TEST_GAPS`), and the test returns.
pub fn enabled() -> bool {
    let why = match std::env::var("MODELMUX_TEST_NETNS") {
        Ok(v) if v == "1" => return true,
        Ok(v) => v,
        Err(_) => "not probed (MODELMUX_TEST_NETNS is not set: run ./scripts/test)".into(),
    };
    let line = format!("partition tests: network namespaces {why}");
    if std::env::var("MODELMUX_TEST_ALLOW_NO_NETNS").as_deref() != Ok("1") {
        panic!(
            "{line}. They need root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) with iproute2 and \
             nftables, which ./scripts/test installs; set MODELMUX_TEST_ALLOW_NO_NETNS=1 to run \
             the suite without them"
        );
    }
    eprintln!("NOT RUN: {line}");
    if let Ok(path) = std::env::var("MODELMUX_TEST_GAPS") {
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("the gaps file opens");
        file.write_all(format!("{line}\n").as_bytes())
            .expect("the gaps file takes a line");
    }
    false
}

/// A set of test hosts, deleted on drop.
pub struct Net {
    hub: String,
    hosts: Vec<String>,
}

impl Net {
    /// Makes the hub and `hosts` host namespaces, tagged `tag` (unique per test).
    pub fn create(tag: &str, hosts: usize) -> Net {
        remove_stale();
        let base = format!("{PREFIX}{}-{tag}", std::process::id());
        let net = Net {
            hub: format!("{base}-hub"),
            hosts: (0..hosts).map(|i| format!("{base}-h{i}")).collect(),
        };
        // Registered before they exist, so a failure half-way still cleans up.
        ip(&["netns", "add", &net.hub]);
        ip(&["-n", &net.hub, "link", "set", "lo", "up"]);
        ip(&["-n", &net.hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &net.hub, "addr", "add", "10.213.0.1/24", "dev", "br0"]);
        ip(&["-n", &net.hub, "link", "set", "br0", "up"]);
        for (i, host) in net.hosts.iter().enumerate() {
            let port = format!("v{i}");
            let addr = format!("{}/24", net.ip(i));
            ip(&["netns", "add", host]);
            ip(&["-n", host, "link", "set", "lo", "up"]);
            ip(&[
                "-n", &net.hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", host,
            ]);
            ip(&["-n", &net.hub, "link", "set", &port, "master", "br0", "up"]);
            ip(&["-n", host, "addr", "add", &addr, "dev", "eth0"]);
            ip(&["-n", host, "link", "set", "eth0", "up"]);
        }
        net
    }

    /// The hub's address: the test's clients and etcd.
    pub fn hub_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, 0, 1)
    }

    /// Host `i`'s address.
    pub fn ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, 0, u8::try_from(i + 2).expect("at most 250 hosts"))
    }

    /// The command prefix that runs a program in host `i`'s namespace.
    pub fn exec(&self, i: usize) -> [&str; 4] {
        ["ip", "netns", "exec", &self.hosts[i]]
    }

    /// Runs `f` on a thread inside the hub's namespace: every socket it opens, every thread
    /// and process it starts (a runtime's workers, etcd) is in the hub.
    pub fn run_in_hub<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.hub);
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
                nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .unwrap_or_else(|e| panic!("entering {path}: {e}"));
                f()
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }

    /// Cuts host `i` off from `peers` (both ways), leaving everything else as it was.
    pub fn cut_from_hosts(&self, i: usize, peers: &[usize]) {
        let set: Vec<String> = peers.iter().map(|&p| self.ip(p).to_string()).collect();
        let set = set.join(", ");
        self.rules(
            i,
            &format!("ip saddr {{ {set} }} drop"),
            &format!("ip daddr {{ {set} }} drop"),
        );
    }

    /// Cuts host `i` off from the hub's TCP `ports` (etcd's), leaving everything else.
    pub fn cut_from_hub_ports(&self, i: usize, ports: &[u16]) {
        let hub = self.hub_ip();
        let set: Vec<String> = ports.iter().map(u16::to_string).collect();
        let set = set.join(", ");
        self.rules(
            i,
            &format!("ip saddr {hub} tcp sport {{ {set} }} drop"),
            &format!("ip daddr {hub} tcp dport {{ {set} }} drop"),
        );
    }

    /// Takes host `i`'s partition rules away.
    pub fn heal(&self, i: usize) {
        nft(&self.hosts[i], "delete table inet partition\n");
    }

    /// Drops packets in host `i`'s namespace: those matching `input` on the way in, `output`
    /// on the way out. Dropped, not refused: the other side hears nothing, as in a real
    /// partition.
    fn rules(&self, i: usize, input: &str, output: &str) {
        nft(
            &self.hosts[i],
            &format!(
                "table inet partition {{\n\
                 chain input {{ type filter hook input priority 0; policy accept; {input}; }}\n\
                 chain output {{ type filter hook output priority 0; policy accept; {output}; }}\n\
                 }}\n"
            ),
        );
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a host's namespace deletes its veth pair too.
        for ns in self.hosts.iter().chain([&self.hub]) {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn ip(args: &[&str]) {
    run(
        Command::new("ip").args(args),
        &format!("ip {}", args.join(" ")),
    );
}

fn nft(ns: &str, rules: &str) {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("nft in {ns}: {e} (install nftables; scripts/test does)"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(rules.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nft in {ns} refused\n{rules}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn run(command: &mut Command, what: &str) {
    let out = command
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e} (install iproute2; scripts/test does)"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Deletes namespaces left by test processes that died before cleaning up.
fn remove_stale() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
}
