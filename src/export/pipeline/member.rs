//! The membership info series (`nccl.comm.member`, `docs/metrics.md`): every interval, 1 for each
//! communicator this process is a member of, with the communicator's attributes and where the
//! member runs — `host.name`, `job.node_name` and the launcher's global rank `job.rank` — so that a
//! rule naming a culprit by communicator and rank can join its host (with `last_over_time`, since
//! a killed culprit exports nothing) — and the communicator's GPU, `gpu.uuid` and `gpu.pci_bus_id`
//! in DCGM's formats when the CUDA driver told them at `init`, so that DCGM's series join too. One
//! series per communicator.
//! Called on: the telemetry thread.
#![forbid(unsafe_code)]

use opentelemetry::KeyValue;

use super::super::catalogue::keys;
use super::super::limiter::Family;
use super::super::resource::host_name;
use super::{Pipeline, comm_attrs};
use crate::config;
use crate::record::CommMeta;

/// The attributes of this process that every member series carries.
pub(super) struct Members {
    process: Vec<KeyValue>,
}

impl Members {
    /// This process's place from the resource's attributes: `host.name` (the user's, else the
    /// kernel's), `job.node_name` (the launcher's node, else `k8s.node.name`, else the host) and
    /// `job.rank` when the launcher gives one.
    pub(super) fn new(export: &config::Export) -> Members {
        let get = |key: &str| export.attribute(key).map(str::to_owned);
        let host = get(keys::HOST_NAME.as_str()).unwrap_or_else(host_name);
        let node = get(keys::JOB_NODE_NAME.as_str()).or_else(|| get(keys::K8S_NODE_NAME.as_str()));
        let mut process = vec![
            KeyValue::new(keys::JOB_NODE_NAME, node.unwrap_or_else(|| host.clone())),
            KeyValue::new(keys::HOST_NAME, host),
        ];
        process.extend(get(keys::JOB_RANK.as_str()).map(|rank| KeyValue::new(keys::JOB_RANK, rank)));
        Members { process }
    }

    /// The member series' attributes of communicator `meta`.
    fn attrs(&self, meta: &CommMeta) -> Vec<KeyValue> {
        let mut attrs = comm_attrs(meta);
        attrs.extend(self.process.iter().cloned());
        let gpu = [(keys::GPU_UUID, &meta.gpu.uuid), (keys::GPU_PCI_BUS_ID, &meta.gpu.pci_bus_id)];
        attrs.extend(gpu.into_iter().filter_map(|(key, value)| Some(KeyValue::new(key, value.clone()?))));
        attrs
    }
}

impl Pipeline {
    /// Reports this process's membership of communicator `meta` for the interval.
    pub(super) fn member(&mut self, meta: &CommMeta) {
        let attrs = self.members.attrs(meta);
        let attrs = self.attrs_or_overflow(Family::Profiler, attrs, 1);
        self.inst.comm_member.record(1.0, &attrs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Gpu;

    /// The member series' attributes when the resource has `resource`.
    fn attrs(resource: &[(&str, &str)]) -> Vec<(String, String)> {
        gpu_attrs(resource, Gpu::default())
    }

    /// The member series' attributes when the resource has `resource` and the communicator `gpu`.
    fn gpu_attrs(resource: &[(&str, &str)], gpu: Gpu) -> Vec<(String, String)> {
        let mut export = config::Config::default().export;
        export.resource = resource.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let members = Members::new(&export);
        let meta = CommMeta {
            hash: 0xab,
            name: "c".into(),
            rank: 2,
            nranks: 4,
            nnodes: 1,
            gpu,
        };
        let mut attrs: Vec<(String, String)> =
            members.attrs(&meta).iter().map(|kv| (kv.key.to_string(), kv.value.to_string())).collect();
        attrs.sort();
        attrs
    }

    #[test]
    fn names_the_host_the_node_and_the_launcher_rank() {
        let pod = attrs(&[("job.rank", "13"), ("k8s.node.name", "node-a"), ("host.name", "pod-3")]);
        let expected = [
            ("host.name", "pod-3"),
            ("job.node_name", "node-a"),
            ("job.rank", "13"),
            ("nccl.comm.hash", "0xab"),
            ("nccl.comm.name", "c"),
            ("nccl.nranks", "4"),
            ("nccl.rank", "2"),
        ];
        let expected: Vec<(String, String)> = expected.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        assert_eq!(pod, expected);
        let slurm = attrs(&[("job.node_name", "gpu-017"), ("k8s.node.name", "ignored")]);
        assert!(slurm.contains(&("job.node_name".into(), "gpu-017".into())), "{slurm:?}");
        // No launcher: the kernel's host is the node, and there is no launcher rank.
        let plain = attrs(&[]);
        let host = host_name();
        assert!(plain.contains(&("host.name".into(), host.clone())), "{plain:?}");
        assert!(plain.contains(&("job.node_name".into(), host)), "{plain:?}");
        assert!(!plain.iter().any(|(k, _)| k == "job.rank"), "{plain:?}");
    }

    #[test]
    fn names_the_gpu_when_known() {
        let uuid = "GPU-00112233-4455-6677-8899-aabbccddeeff";
        let gpu = Gpu {
            uuid: Some(uuid.into()),
            pci_bus_id: Some("00000000:3B:00.0".into()),
        };
        let known = gpu_attrs(&[], gpu);
        assert!(known.contains(&("gpu.uuid".into(), uuid.into())), "{known:?}");
        assert!(known.contains(&("gpu.pci_bus_id".into(), "00000000:3B:00.0".into())), "{known:?}");
        let partly = gpu_attrs(&[], Gpu { uuid: Some(uuid.into()), pci_bus_id: None });
        assert!(!partly.iter().any(|(k, _)| k == "gpu.pci_bus_id"), "{partly:?}");
        assert!(!attrs(&[]).iter().any(|(k, _)| k.starts_with("gpu.")));
    }
}
