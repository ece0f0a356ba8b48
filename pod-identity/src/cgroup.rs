//! The container and pod a cgroup path names.
//!
//! The kubelet places each container in a cgroup below its pod's, under the QoS class's:
//!
//! | driver | cgroup v2 path (v1: the same path on each controller's line) |
//! |---|---|
//! | systemd | `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, _ for ->.slice/cri-containerd-<id>.scope` |
//! | cgroupfs | `/kubepods/burstable/pod<uid>/<id>` |
//!
//! Guaranteed pods sit directly below `kubepods`. The container scope's prefix names the
//! runtime: `cri-containerd-`, `crio-`, `docker-` (cri-dockerd, and Docker outside
//! Kubernetes, whose cgroupfs path is `/docker/<id>`). CRI-O's `crio-conmon-<id>.scope` is
//! the container's monitor, not the container. Ids are 64 hex digits.
//!
//! Read through a cgroup namespace (a sidecar's, rooted at its own container), a sibling
//! container's path is `/../cri-containerd-<id>.scope`: the container shows, the pod does not.

/// A container, and its pod when the cgroup is a kubelet's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRef {
    /// The container id (64 hex digits).
    pub container_id: String,
    /// `containerd`, `cri-o` or `docker`, when the path names it.
    pub runtime: Option<&'static str>,
    /// The pod's UID (with dashes), when the container is a pod's.
    pub pod_uid: Option<String>,
}

/// The container `/proc/PID/cgroup`'s text places the process in: the unified (v2) line
/// first, else the first v1 line that names one.
pub fn parse(proc_cgroup: &str) -> Option<ContainerRef> {
    let paths = proc_cgroup
        .lines()
        .filter_map(|l| Some((l.starts_with("0::"), l.splitn(3, ':').nth(2)?)));
    let (unified, v1): (Vec<_>, Vec<_>) = paths.partition(|(v2, _)| *v2);
    unified
        .into_iter()
        .chain(v1)
        .find_map(|(_, path)| from_path(path))
}

/// The container a cgroup path names.
pub fn from_path(path: &str) -> Option<ContainerRef> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // The innermost segment naming a container: runtimes may nest cgroups below it.
    let (at, container_id, runtime) = segments
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, s)| container_segment(s).map(|(id, rt)| (i, id, rt)))?;
    let pod_uid = segments[..at].iter().rev().find_map(|s| pod_segment(s));
    // A bare id is a container only below a pod or Docker's cgroupfs root.
    if runtime.is_none() && pod_uid.is_none() && segments[..at].last() != Some(&"docker") {
        return None;
    }
    let runtime = runtime.or((segments[..at].last() == Some(&"docker")).then_some("docker"));
    Some(ContainerRef {
        container_id,
        runtime,
        pod_uid,
    })
}

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope` or a bare `<id>`.
fn container_segment(s: &str) -> Option<(String, Option<&'static str>)> {
    const PREFIXES: [(&str, &str); 3] = [
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("docker-", "docker"),
    ];
    let (rest, runtime) = PREFIXES
        .iter()
        .find_map(|(p, rt)| Some((s.strip_prefix(p)?.strip_suffix(".scope")?, Some(*rt))))
        .unwrap_or((s, None));
    is_container_id(rest).then(|| (rest.to_string(), runtime))
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid with _>.slice` (systemd).
fn pod_segment(s: &str) -> Option<String> {
    let uid = match s.strip_suffix(".slice") {
        Some(slice) => slice.rsplit_once("-pod")?.1.replace('_', "-"),
        None => s.strip_prefix("pod")?.to_string(),
    };
    let dashed = uid.len() == 36
        && uid.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    dashed.then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b";

    /// The container id, the runtime and whether the pod UID is found; `None`: no container.
    type Expected = Option<(&'static str, Option<&'static str>, bool)>;

    #[test]
    fn reads_every_driver_and_runtime() {
        let uid_ = UID.replace('-', "_");
        let cases: Vec<(&str, String, Expected)> = vec![
            (
                "v2 systemd containerd burstable",
                format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope\n"),
                Some((ID, Some("containerd"), true)),
            ),
            (
                "v2 systemd cri-o guaranteed",
                format!("0::/kubepods.slice/kubepods-pod{uid_}.slice/crio-{ID}.scope\n"),
                Some((ID, Some("cri-o"), true)),
            ),
            (
                "v2 systemd cri-dockerd besteffort",
                format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/docker-{ID}.scope\n"),
                Some((ID, Some("docker"), true)),
            ),
            (
                "v2 cgroupfs",
                format!("0::/kubepods/burstable/pod{UID}/{ID}\n"),
                Some((ID, None, true)),
            ),
            (
                "v1 cgroupfs, unified line empty",
                format!("12:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{ID}\n11:memory:/kubepods/besteffort/pod{UID}/{ID}\n0::/\n"),
                Some((ID, None, true)),
            ),
            (
                "v1 systemd",
                format!("4:pids:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope\n1:name=systemd:/system.slice/containerd.service\n"),
                Some((ID, Some("containerd"), true)),
            ),
            (
                "a runtime's sub-cgroup below the container",
                format!("0::/kubepods.slice/kubepods-pod{uid_}.slice/cri-containerd-{ID}.scope/init\n"),
                Some((ID, Some("containerd"), true)),
            ),
            (
                "a sibling container read through a cgroup namespace (a sidecar's view)",
                format!("0::/../cri-containerd-{ID}.scope\n"),
                Some((ID, Some("containerd"), false)),
            ),
            (
                "docker outside kubernetes, systemd",
                format!("0::/system.slice/docker-{ID}.scope\n"),
                Some((ID, Some("docker"), false)),
            ),
            (
                "docker outside kubernetes, cgroupfs",
                format!("0::/docker/{ID}\n"),
                Some((ID, Some("docker"), false)),
            ),
            (
                "cri-o's monitor is not the container",
                format!("0::/kubepods.slice/kubepods-pod{uid_}.slice/crio-conmon-{ID}.scope\n"),
                None,
            ),
            ("a host process", "0::/user.slice/user-0.slice/session-1.scope\n".into(), None),
            ("no cgroup at all", String::new(), None),
            (
                "a bare 64-hex segment outside any pod",
                format!("0::/system.slice/{ID}\n"),
                None,
            ),
        ];
        for (case, text, want) in cases {
            let got = parse(&text);
            let want = want.map(|(id, runtime, in_pod)| ContainerRef {
                container_id: id.into(),
                runtime,
                pod_uid: in_pod.then(|| UID.to_string()),
            });
            assert_eq!(got, want, "{case}: {text}");
        }
    }
}
