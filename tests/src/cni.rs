//! A container runtime's side of CNI, on one machine: each node is a network namespace
//! holding the bridge that the real `bridge` plugin makes, with its own CNI directories
//! (the real `bridge`, `host-local` and `loopback` from Debian's
//! `containernetworking-plugins`, and `ambit-cni` put there by its installer) and its own
//! cgroup (its "root cgroup", where the node proxy attaches the outbound programs). A pod
//! is a network namespace wired by running the node's configuration list in order, each
//! result fed to the next plugin as `prevResult`, and unwired by DEL in reverse — what
//! containerd and CRI-O do. Nodes are joined by a veth with routes to each other's pod
//! subnets. Everything is removed on drop.

use serde_json::{json, Value};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::netns::run;

/// Where Debian installs the reference plugins.
pub const PLUGINS_DIR: &str = "/usr/lib/cni";
/// The CNI version the test runtime speaks (Debian's plugins go up to 1.0.0).
pub const CNI_VERSION: &str = "1.0.0";

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Runs `cmd` with `stdin` on its standard input, as a runtime runs a plugin.
pub fn run_with_stdin(cmd: &mut Command, stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// One node.
#[derive(Debug)]
pub struct CniNode {
    /// Its Kubernetes name (`node-a`).
    pub name: String,
    /// The netns the bridge lives in.
    pub netns: String,
    /// Its pod subnet's third octet (10.78.<n>.0/24).
    pub subnet: u8,
    /// The CNI configuration directory.
    pub conf_dir: PathBuf,
    /// The CNI binary directory.
    pub bin_dir: PathBuf,
    /// The node proxy's CNI socket.
    pub socket: PathBuf,
    /// The node proxy's run directory.
    pub run_dir: PathBuf,
    /// The node's cgroup (pods' processes run in it).
    pub cgroup: PathBuf,
    /// The node proxy's eBPF pin directory.
    pub pin_dir: PathBuf,
}

/// A pod wired by CNI.
#[derive(Debug, Clone)]
pub struct CniPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Its netns name (under /run/netns).
    pub netns: String,
    /// Its address.
    pub ip: Ipv4Addr,
    /// The sandbox id.
    pub container_id: String,
    /// Index of its node.
    pub node: usize,
    /// Each plugin's result, in chain order.
    pub results: Vec<Value>,
}

impl CniPod {
    /// `/run/netns/<netns>`.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.netns)
    }
}

/// Nodes, their link, and the pods made on them.
#[derive(Debug)]
pub struct Cluster {
    prefix: String,
    /// The nodes.
    pub nodes: Vec<CniNode>,
    netns: std::sync::Mutex<Vec<String>>,
    /// Holds the nodes' CNI directories and run directories; removed on drop.
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Two nodes (`names`), each with its bridge configuration and `ambit-cni` installed
    /// by running `cni_binary install`, as the DaemonSet would.
    pub fn new(test: &str, names: &[&str; 2], cni_binary: &Path) -> Self {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("cni{}{test}{n}", std::process::id());
        let dir = tempfile::tempdir().unwrap();
        let mut nodes = Vec::new();
        let mut netns = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let ns = format!("{prefix}-{name}");
            run(&["ip", "netns", "add", &ns]);
            netns.push(ns.clone());
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
            // The node routes between its pods and the other node (no procps needed).
            let forward = "echo 1 > /proc/sys/net/ipv4/ip_forward";
            run(&["ip", "netns", "exec", &ns, "sh", "-c", forward]);
            let root = dir.path().join(name);
            let node = CniNode {
                name: name.to_string(),
                netns: ns,
                subnet: (i + 1) as u8,
                conf_dir: root.join("net.d"),
                bin_dir: root.join("bin"),
                socket: root.join("cni.sock"),
                run_dir: root.join("run"),
                cgroup: ambit_ebpf::sys::cgroup2_mount().join(format!("{prefix}-{name}")),
                pin_dir: PathBuf::from(format!("/sys/fs/bpf/{prefix}-{name}")),
            };
            for d in [&node.conf_dir, &node.bin_dir] {
                std::fs::create_dir_all(d).unwrap();
            }
            std::fs::create_dir(&node.cgroup).unwrap();
            for plugin in ["bridge", "host-local", "loopback"] {
                std::os::unix::fs::symlink(
                    Path::new(PLUGINS_DIR).join(plugin),
                    node.bin_dir.join(plugin),
                )
                .unwrap();
            }
            // The cluster's own network: one bridge .conf, as a primary CNI writes it.
            let primary = json!({
                "cniVersion": CNI_VERSION,
                "name": "podnet",
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipam": {
                    "type": "host-local",
                    "subnet": format!("10.78.{}.0/24", node.subnet),
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": root.join("ipam"),
                },
            });
            std::fs::write(node.conf_dir.join("10-podnet.conf"), primary.to_string()).unwrap();
            let out = Command::new(cni_binary)
                .arg("install")
                .arg("--cni-bin-dir")
                .arg(&node.bin_dir)
                .arg("--cni-conf-dir")
                .arg(&node.conf_dir)
                .arg("--socket")
                .arg(&node.socket)
                .args(["--timeout", "20s", "--exclude-namespaces", "kube-system"])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "ambit-cni install: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            nodes.push(node);
        }
        // The nodes' link, and routes to each other's pod subnets.
        let (a, b) = (&nodes[0], &nodes[1]);
        run(&[
            "ip", "-n", &a.netns, "link", "add", "peer0", "type", "veth", "peer", "name", "peer0",
            "netns", &b.netns,
        ]);
        for (node, addr, other) in [(a, "10.79.0.1/30", b), (b, "10.79.0.2/30", a)] {
            run(&["ip", "-n", &node.netns, "addr", "add", addr, "dev", "peer0"]);
            run(&["ip", "-n", &node.netns, "link", "set", "peer0", "up"]);
            let via = if node.subnet == 1 {
                "10.79.0.2"
            } else {
                "10.79.0.1"
            };
            let dst = format!("10.78.{}.0/24", other.subnet);
            run(&["ip", "-n", &node.netns, "route", "add", &dst, "via", via]);
        }
        Self {
            prefix,
            nodes,
            netns: std::sync::Mutex::new(netns),
            _dir: dir,
        }
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> &CniNode {
        self.nodes.iter().find(|n| n.name == name).unwrap()
    }

    /// The node's configuration list, as the installer left it.
    pub fn conflist(&self, node: &CniNode) -> Value {
        let path = node.conf_dir.join("10-podnet.conflist");
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    }

    fn cni_args(&self, pod: &CniPod) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID=uid-{};IP={}",
            pod.namespace, pod.name, pod.container_id, pod.name, pod.ip
        )
    }

    /// Runs one plugin as the runtime does (in the node's netns); its stdout, or an error
    /// with its stdout and stderr.
    fn plugin(
        &self,
        node: &CniNode,
        command: &str,
        pod: &CniPod,
        ifname: &str,
        conf: &Value,
    ) -> Result<String, String> {
        let plugin = conf["type"].as_str().unwrap().to_string();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &node.netns])
            .arg(node.bin_dir.join(&plugin))
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &pod.container_id)
            .env("CNI_NETNS", pod.path())
            .env("CNI_IFNAME", ifname)
            .env("CNI_PATH", &node.bin_dir)
            .env("CNI_ARGS", self.cni_args(pod));
        let out = run_with_stdin(&mut cmd, conf.to_string().as_bytes());
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "{plugin} {command}: exit {:?}\nstdout: {stdout}\nstderr: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn plugin_conf(list: &Value, plugin: &Value, prev: Option<&Value>) -> Value {
        let mut conf = plugin.clone();
        conf["cniVersion"] = list["cniVersion"].clone();
        conf["name"] = list["name"].clone();
        if let Some(prev) = prev {
            conf["prevResult"] = prev.clone();
        }
        conf
    }

    /// Creates pod `namespace/name` on `node` with address 10.78.<subnet>.<host>: a new
    /// netns, `loopback`, then the node's list. On failure the runtime's cleanup (DEL)
    /// runs and the failing plugin's output is returned.
    pub fn add_pod(
        &self,
        node: &str,
        namespace: &str,
        name: &str,
        host: u8,
    ) -> Result<CniPod, String> {
        let idx = self.nodes.iter().position(|n| n.name == node).unwrap();
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let mut pod = CniPod {
            namespace: namespace.into(),
            name: name.into(),
            netns: format!("{}-{name}-{n}", self.prefix),
            ip: Ipv4Addr::new(10, 78, self.nodes[idx].subnet, host),
            container_id: format!("{:08x}{:08x}{name}", std::process::id(), n),
            node: idx,
            results: Vec::new(),
        };
        run(&["ip", "netns", "add", &pod.netns]);
        self.netns.lock().unwrap().push(pod.netns.clone());
        let node = &self.nodes[idx];
        let lo = json!({"cniVersion": CNI_VERSION, "name": "lo", "type": "loopback"});
        self.plugin(node, "ADD", &pod, "lo", &lo)?;
        let list = self.conflist(node);
        let mut prev: Option<Value> = None;
        for plugin in list["plugins"].as_array().unwrap() {
            let conf = Self::plugin_conf(&list, plugin, prev.as_ref());
            match self.plugin(node, "ADD", &pod, "eth0", &conf) {
                Ok(out) => {
                    let result: Value = serde_json::from_str(&out).map_err(|e| {
                        format!("{}: result is not JSON: {e}: {out}", plugin["type"])
                    })?;
                    pod.results.push(result.clone());
                    prev = Some(result);
                }
                Err(e) => {
                    let _ = self.del_pod(&pod);
                    return Err(e);
                }
            }
        }
        Ok(pod)
    }

    /// Runs one command (`CHECK`, `STATUS`, `GC`...) of the node's `ambit-cni` entry for
    /// `pod`, with `extra` merged into its configuration.
    pub fn ambit_cni(&self, pod: &CniPod, command: &str, extra: Value) -> Result<String, String> {
        let node = &self.nodes[pod.node];
        let list = self.conflist(node);
        let entry = list["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["type"] == "ambit-cni")
            .unwrap()
            .clone();
        let mut conf = Self::plugin_conf(&list, &entry, pod.results.last());
        if let (Some(conf), Value::Object(extra)) = (conf.as_object_mut(), extra) {
            conf.extend(extra);
        }
        self.plugin(node, command, pod, "eth0", &conf)
    }

    /// DEL in reverse order (each plugin given the cached result), then `loopback`.
    pub fn del_pod(&self, pod: &CniPod) -> Result<(), String> {
        let node = &self.nodes[pod.node];
        let list = self.conflist(node);
        for plugin in list["plugins"].as_array().unwrap().iter().rev() {
            let conf = Self::plugin_conf(&list, plugin, pod.results.last());
            self.plugin(node, "DEL", pod, "eth0", &conf)?;
        }
        let lo = json!({"cniVersion": CNI_VERSION, "name": "lo", "type": "loopback"});
        self.plugin(node, "DEL", pod, "lo", &lo).map(drop)
    }

    /// Deletes the pod's netns (after DEL, as the runtime does when a sandbox goes).
    pub fn remove_netns(&self, pod: &CniPod) {
        let _ = Command::new("ip")
            .args(["netns", "del", &pod.netns])
            .output();
        self.netns.lock().unwrap().retain(|n| n != &pod.netns);
    }

    /// Runs `args` as a process of `pod`: in its node's cgroup and in its netns, as the
    /// runtime starts a container (an unmodified application: no mark, no proxy
    /// settings).
    pub fn exec(&self, pod: &CniPod, args: &[&str]) -> Output {
        let node = &self.nodes[pod.node];
        ambit_topology::pod_command(Some(&node.cgroup), &pod.netns, args[0], &args[1..])
            .output()
            .unwrap()
    }

    /// `curl` from `pod` to `url`: the HTTP status and body, or curl's error.
    pub fn curl(&self, pod: &CniPod, url: &str) -> Result<(u16, String), String> {
        let out = self.exec(
            pod,
            &[
                "curl",
                "-sS",
                "--max-time",
                "10",
                "-w",
                "\n%{http_code}",
                url,
            ],
        );
        if !out.status.success() {
            return Err(format!(
                "curl {url}: exit {:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        Ok((code.trim().parse().unwrap_or(0), body.to_string()))
    }

    /// The TCP listeners in `pod`'s netns (`ss -ltnH`).
    pub fn listeners(&self, pod: &CniPod) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &pod.netns, "ss", "-ltnH"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A container's process (`sleep`) in a pod's netns and in a cgroup named as the
/// kubelet's cgroupfs driver names a container's, below the node's cgroup:
/// `<node cgroup>/kubepods/besteffort/pod<uid>/<container>`. Killed (by pid), and its
/// cgroups removed, on drop; drop it before the [`Cluster`].
#[derive(Debug)]
pub struct ContainerProcess {
    child: Child,
    /// The cgroups made for it, deepest first.
    cgroups: Vec<PathBuf>,
}

impl ContainerProcess {
    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ContainerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for dir in &self.cgroups {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl Cluster {
    /// Starts a container of `pod` whose pod UID is `uid` (a long `sleep`, bounded at ten
    /// minutes), as a runtime would under the kubelet's cgroupfs driver, and waits until
    /// it is in its cgroup and the pod's netns.
    pub fn start_container(&self, pod: &CniPod, uid: &str) -> ContainerProcess {
        let node = &self.nodes[pod.node];
        let kubepods = node.cgroup.join("kubepods");
        let qos = kubepods.join("besteffort");
        let pod_cgroup = qos.join(format!("pod{uid}"));
        let container = pod_cgroup.join(format!("ctr{}", pod.container_id));
        std::fs::create_dir_all(&container).unwrap();
        // Into the cgroup first, then the netns (`ip netns exec` execs, keeping the pid).
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && exec ip netns exec "$1" sleep 600"#)
            .arg(&container)
            .arg(&pod.netns)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let process = ContainerProcess {
            child,
            cgroups: vec![container, pod_cgroup, qos, kubepods],
        };
        let proc_dir = PathBuf::from(format!("/proc/{}", process.pid()));
        let own_netns = std::fs::read_link("/proc/self/ns/net").unwrap();
        for _ in 0..500 {
            let in_cgroup = std::fs::read_to_string(proc_dir.join("cgroup"))
                .is_ok_and(|c| c.contains(&format!("/pod{uid}/")));
            let in_netns =
                std::fs::read_link(proc_dir.join("ns/net")).is_ok_and(|ns| ns != own_netns);
            let is_sleep =
                std::fs::read_to_string(proc_dir.join("comm")).is_ok_and(|c| c.trim() == "sleep");
            if in_cgroup && in_netns && is_sleep {
                return process;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("the container of {} did not start", pod.name);
    }
}

/// The blocking runtime operations, from async tests.
impl Cluster {
    /// [`Cluster::add_pod`] on a blocking thread, as a runtime waits for its CNI chain;
    /// fails the test if ADD fails.
    pub async fn add(self: &Arc<Self>, node: &str, ns: &str, name: &str, host: u8) -> CniPod {
        let (c, node, ns, name) = (
            self.clone(),
            node.to_string(),
            ns.to_string(),
            name.to_string(),
        );
        tokio::task::spawn_blocking(move || c.add_pod(&node, &ns, &name, host))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("CNI ADD failed: {e}"))
    }

    /// [`Cluster::del_pod`] of each of `pods`, in order, on a blocking thread, as a runtime
    /// tears its sandboxes down; fails the test if one fails.
    pub async fn del_all(self: &Arc<Self>, pods: &[&CniPod]) {
        for pod in pods {
            let (c, pod) = (self.clone(), (*pod).clone());
            tokio::task::spawn_blocking(move || c.del_pod(&pod))
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("CNI DEL failed: {e}"));
        }
    }

    /// [`Cluster::curl`] on a blocking thread.
    pub async fn curl_async(
        self: &Arc<Self>,
        pod: &CniPod,
        url: &str,
    ) -> Result<(u16, String), String> {
        let (c, pod, url) = (self.clone(), pod.clone(), url.to_string());
        tokio::task::spawn_blocking(move || c.curl(&pod, &url))
            .await
            .unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            // Netns handles the proxy kept (a proxy stopped mid-test leaves them).
            drop(crate::NetnsHandles(node.run_dir.clone()));
            let _ = ambit_ebpf::remove_pinned(&node.pin_dir);
        }
        for ns in self.netns.lock().unwrap().iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        for node in &self.nodes {
            let _ = std::fs::remove_dir(&node.cgroup);
        }
    }
}
