//! etcd members started on this machine, on free ports (loopback unless told otherwise) with
//! their data in a temporary directory: what the cluster tests and `scripts/bench-cluster` run against (Debian's
//! `etcd-server` package provides the `etcd` binary; `ETCD_BIN` names another). With the
//! `local-etcd-tls` feature, also members that take clients only over TLS with a client
//! certificate, with authentication enabled (`local_etcd_tls.rs`).

use std::net::{IpAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

/// One local etcd cluster of one or more members, killed when dropped.
pub struct LocalEtcd {
    members: Vec<Member>,
    /// How its own checks (the leader) reach it: for a secure one, over TLS as `root`.
    pub(crate) admin: modelmux_etcd::ConnectOptions,
    #[cfg(feature = "local-etcd-tls")]
    pub(crate) secure: Option<crate::local_etcd_tls::SecureEtcd>,
    /// The members' data and logs (shared by the attempts of one start).
    _dir: std::sync::Arc<tempfile::TempDir>,
}

/// How members are started: TLS for their clients, and more flags.
#[derive(Default)]
pub(crate) struct Launch {
    /// `--cert-file`, `--key-file`, `--trusted-ca-file`: clients then speak https, with a
    /// certificate the CA signed (`--client-cert-auth`).
    pub(crate) tls: Option<(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf)>,
    pub(crate) args: Vec<String>,
    /// How its own checks reach it (default: plaintext, no user, short timeouts).
    pub(crate) admin: Option<modelmux_etcd::ConnectOptions>,
}

struct Member {
    name: String,
    client_url: String,
    child: Option<Child>,
}

fn free_port(host: IpAddr) -> std::io::Result<u16> {
    Ok(TcpListener::bind((host, 0))?.local_addr()?.port())
}

impl LocalEtcd {
    /// Starts `members` members (1 or 3, say) on loopback and waits until the cluster has a
    /// leader.
    pub async fn start(members: usize) -> std::io::Result<Self> {
        Self::start_on(members, IpAddr::from([127, 0, 0, 1])).await
    }

    /// Starts `members` members listening on `host` (an address of this machine, or of the
    /// network namespace the calling thread is in) and waits until the cluster has a leader.
    pub async fn start_on(members: usize, host: IpAddr) -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        Self::launch(members, host, dir, Launch::default()).await
    }

    /// Starts the members with their data in `dir`, as `launch` says. Their ports are found
    /// free just before etcd binds them, so another process can take one in between: a
    /// member that exits because its port was taken is started again, with all the others, on
    /// fresh ports (a few times at most).
    pub(crate) async fn launch(
        members: usize,
        host: IpAddr,
        dir: tempfile::TempDir,
        launch: Launch,
    ) -> std::io::Result<Self> {
        let dir = std::sync::Arc::new(dir);
        let mut attempt = 0;
        loop {
            let mut etcd = Self::launch_once(members, host, &dir, &launch, attempt)?;
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if etcd.leader().await.is_some() {
                    return Ok(etcd);
                }
                if etcd.lost_its_port() && attempt < 4 {
                    break;
                }
                if Instant::now() >= deadline {
                    // The same answer a later wait gives: what the first member says, and
                    // its log.
                    etcd.wait_for_leader(Duration::ZERO).await?;
                    return Ok(etcd);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            attempt += 1;
        }
    }

    /// Whether a member has exited because its port was taken (it says so in its log).
    fn lost_its_port(&mut self) -> bool {
        let dir = self._dir.clone();
        self.members.iter_mut().any(|m| {
            let exited = (m.child.as_mut()).is_some_and(|c| c.try_wait().ok().flatten().is_some());
            exited
                && std::fs::read_to_string(dir.path().join(format!("{}.log", m.name)))
                    .is_ok_and(|log| log.contains("address already in use"))
        })
    }

    /// One attempt of [`launch`](Self::launch): the members spawned on fresh ports, their data
    /// in a directory of this attempt's own.
    fn launch_once(
        members: usize,
        host: IpAddr,
        dir: &std::sync::Arc<tempfile::TempDir>,
        launch: &Launch,
        attempt: usize,
    ) -> std::io::Result<Self> {
        let url = |scheme: &str, port: u16| {
            format!("{scheme}://{}", std::net::SocketAddr::new(host, port))
        };
        // Peers talk plaintext (on this machine); clients over TLS when it is set.
        let client_scheme = if launch.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut specs = Vec::new();
        for i in 0..members.max(1) {
            specs.push((
                format!("m{i}"),
                url(client_scheme, free_port(host)?),
                url("http", free_port(host)?),
            ));
        }
        let initial: Vec<String> = specs
            .iter()
            .map(|(name, _, peer)| format!("{name}={peer}"))
            .collect();
        let initial = initial.join(",");
        let binary = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".into());
        let mut started = Vec::new();
        for (name, client, peer) in specs {
            let mut command = Command::new(&binary);
            if let Some((cert, key, ca)) = &launch.tls {
                command
                    .arg("--cert-file")
                    .arg(cert)
                    .arg("--key-file")
                    .arg(key)
                    .arg("--trusted-ca-file")
                    .arg(ca)
                    .arg("--client-cert-auth");
            }
            let child = command
                .args(&launch.args)
                .args(["--name", &name, "--data-dir"])
                .arg(dir.path().join(format!("{name}-{attempt}")))
                .args(["--listen-client-urls", &client])
                .args(["--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer])
                .args(["--initial-advertise-peer-urls", &peer])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-state", "new"])
                .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                .stdout(Stdio::null())
                // Its log beside its data, for a test that fails to read.
                .stderr(
                    std::fs::File::create(dir.path().join(format!("{name}.log")))
                        .map_or_else(|_| Stdio::null(), Stdio::from),
                )
                .spawn()
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!(
                            "starting {binary}: {e} (install Debian's etcd-server; scripts/test does)"
                        ),
                    )
                })?;
            started.push(Member {
                name,
                client_url: client,
                child: Some(child),
            });
        }
        let admin = launch.admin.clone().unwrap_or_else(|| {
            modelmux_etcd::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(2))
                .with_timeout(Duration::from_secs(5))
        });
        Ok(Self {
            members: started,
            admin,
            #[cfg(feature = "local-etcd-tls")]
            secure: None,
            _dir: dir.clone(),
        })
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// The members' client URLs as a `--cluster` value: `etcd://h:p,h:p` (spoken over TLS
    /// when the client is given TLS options).
    pub fn cluster_url(&self) -> String {
        let hosts: Vec<&str> = self
            .members
            .iter()
            .map(|m| {
                let url = m.client_url.as_str();
                url.split_once("://").map_or(url, |(_, rest)| rest)
            })
            .collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// Waits until a live member reports a leader; returns the leader's index.
    pub async fn wait_for_leader(&self, within: Duration) -> std::io::Result<usize> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(leader) = self.leader().await {
                return Ok(leader);
            }
            if Instant::now() >= deadline {
                // What the first member answers, and the end of its log.
                let answer = match modelmux_etcd::Client::connect(
                    [self.members[0].client_url.as_str()],
                    self.admin.clone(),
                )
                .await
                {
                    Ok(client) => client.status().await.map(|_| ()),
                    Err(e) => Err(e),
                };
                let log = std::fs::read_to_string(
                    self._dir
                        .path()
                        .join(format!("{}.log", self.members[0].name)),
                )
                .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                return Err(std::io::Error::other(format!(
                    "etcd at {:?} has no leader after {within:?} (its status: {answer:?}; the \
                     end of its log: {:?})",
                    self.endpoints(),
                    tail
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The index of the member that leads now, if a live member knows.
    pub async fn leader(&self) -> Option<usize> {
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            let options = self.admin.clone();
            let Ok(client) = modelmux_etcd::Client::connect([m.client_url.as_str()], options).await
            else {
                continue;
            };
            let Ok(status) = client.status().await else {
                continue;
            };
            let leader = status.leader;
            if leader == 0 {
                continue;
            }
            let Ok(list) = client.member_list().await else {
                continue;
            };
            let name = list
                .members
                .iter()
                .find(|x| x.id == leader)
                .map(|x| x.name.clone())?;
            return self.members.iter().position(|m| m.name == name);
        }
        None
    }

    /// Kills member `i` at once (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
