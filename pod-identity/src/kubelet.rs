//! The node's pods as its kubelet lists them: `GET /pods` answers a v1 `PodList`, from which
//! each container id gets its pod's namespace and name and its container's name.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

/// A container's names in the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub namespace: String,
    pub pod: String,
    /// The pod's UID (for a container whose cgroup path does not show it: one read through a
    /// cgroup namespace, as a sidecar reads its pod's).
    pub uid: String,
    /// The container's name in the pod's spec; `None` when only the pod is known (its
    /// container has no status yet).
    pub container: Option<String>,
    /// The pod's labels.
    pub labels: BTreeMap<String, String>,
}

/// The pods of a `PodList`, by container id and by pod UID.
#[derive(Debug, Default)]
pub struct Directory {
    by_container: HashMap<String, Names>,
    by_pod: HashMap<String, Names>,
}

impl Directory {
    /// Reads a `PodList` (JSON).
    pub fn from_pod_list(json: &str) -> Result<Directory, serde_json::Error> {
        let list: PodList = serde_json::from_str(json)?;
        let mut d = Directory::default();
        for pod in list.items {
            let names = |container: Option<String>| Names {
                namespace: pod.metadata.namespace.clone(),
                pod: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
                container,
                labels: pod.metadata.labels.clone(),
            };
            let status = pod.status.unwrap_or_default();
            for c in status
                .container_statuses
                .iter()
                .chain(&status.init_container_statuses)
                .chain(&status.ephemeral_container_statuses)
            {
                // `containerd://<id>`, `cri-o://<id>`, `docker://<id>`.
                if let Some((_, id)) = c.container_id.split_once("://") {
                    d.by_container
                        .insert(id.to_string(), names(Some(c.name.clone())));
                }
            }
            d.by_pod.insert(pod.metadata.uid.clone(), names(None));
        }
        Ok(d)
    }

    /// The names of `container_id`, else of the pod `pod_uid` alone.
    pub fn find(&self, container_id: &str, pod_uid: Option<&str>) -> Option<&Names> {
        self.by_container
            .get(container_id)
            .or_else(|| self.by_pod.get(pod_uid?))
    }
}

#[derive(Deserialize)]
struct PodList {
    items: Vec<Pod>,
}

#[derive(Deserialize)]
struct Pod {
    metadata: Metadata,
    status: Option<PodStatus>,
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
    namespace: String,
    uid: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct PodStatus {
    container_statuses: Vec<ContainerStatus>,
    init_container_statuses: Vec<ContainerStatus>,
    ephemeral_container_statuses: Vec<ContainerStatus>,
}

#[derive(Deserialize)]
struct ContainerStatus {
    name: String,
    #[serde(rename = "containerID", default)]
    container_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_containers_and_pods() {
        let list = r#"{"kind":"PodList","apiVersion":"v1","items":[
          {"metadata":{"name":"vllm-0","namespace":"serving","uid":"u-1","labels":{"stallscope.io/serving-group":"llama-tp2"}},
           "status":{"containerStatuses":[{"name":"engine","containerID":"containerd://aaa"},
                                          {"name":"sidecar","containerID":"containerd://bbb"}],
                     "initContainerStatuses":[{"name":"fetch-weights","containerID":"containerd://ccc"}]}},
          {"metadata":{"name":"pending","namespace":"serving","uid":"u-2"},"status":{}},
          {"metadata":{"name":"no-status","namespace":"default","uid":"u-3"}}]}"#;
        let d = Directory::from_pod_list(list).unwrap();
        let names = |ns: &str, pod: &str, c: Option<&str>| Names {
            namespace: ns.into(),
            pod: pod.into(),
            uid: match pod {
                "vllm-0" => "u-1",
                "pending" => "u-2",
                _ => "u-3",
            }
            .into(),
            container: c.map(str::to_string),
            labels: if pod == "vllm-0" {
                [("stallscope.io/serving-group".into(), "llama-tp2".into())].into()
            } else {
                Default::default()
            },
        };
        for (id, uid, want) in [
            (
                "aaa",
                None,
                Some(names("serving", "vllm-0", Some("engine"))),
            ),
            (
                "bbb",
                Some("u-1"),
                Some(names("serving", "vllm-0", Some("sidecar"))),
            ),
            (
                "ccc",
                None,
                Some(names("serving", "vllm-0", Some("fetch-weights"))),
            ),
            ("ddd", Some("u-2"), Some(names("serving", "pending", None))),
            (
                "ddd",
                Some("u-3"),
                Some(names("default", "no-status", None)),
            ),
            ("ddd", Some("u-9"), None),
            ("ddd", None, None),
        ] {
            assert_eq!(d.find(id, uid), want.as_ref(), "{id} {uid:?}");
        }
        assert!(Directory::from_pod_list("<html>").is_err());
    }
}
