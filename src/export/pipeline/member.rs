//! The membership info series (`nccl.comm.member`, `docs/metrics.md`): every interval, 1 for each
//! communicator this process is a member of, with the communicator's attributes and where the
//! member runs — `host.name`, `job.node_name` and the launcher's global rank `job.rank` — so that a
//! rule naming a culprit by communicator and rank can join its host (with `last_over_time`, since
//! a killed culprit exports nothing). One series per communicator; attributes that differ between
//! a process's communicators (its GPU, say) join in `Members::attrs`, from the communicator's meta.
//! Called on: the telemetry thread.
#![forbid(unsafe_code)]

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use super::super::catalogue::{Fresh, gauge};
use super::super::limiter::Family;
use super::super::resource::host_name;
use super::{Pipeline, comm_attrs};
use crate::config;
use crate::record::CommMeta;

/// The gauge, and the attributes of this process that every member series carries.
pub(super) struct Members {
    gauge: Fresh<f64>,
    process: Vec<KeyValue>,
}

impl Members {
    /// The gauge, and this process's place from the resource's attributes: `host.name` (the
    /// user's, else the kernel's), `job.node_name` (the launcher's node, else `k8s.node.name`,
    /// else the host) and `job.rank` when the launcher gives one.
    pub(super) fn new(meter: &Meter, export: &config::Export) -> Members {
        let get = |key: &str| export.attribute(key).map(str::to_owned);
        let host = get("host.name").unwrap_or_else(host_name);
        let node = get("job.node_name").or_else(|| get("k8s.node.name"));
        let mut process = vec![
            KeyValue::new("job.node_name", node.unwrap_or_else(|| host.clone())),
            KeyValue::new("host.name", host),
        ];
        process.extend(get("job.rank").map(|rank| KeyValue::new("job.rank", rank)));
        let gauge = gauge(
            meter,
            "nccl.comm.member",
            "{member}",
            "1 per communicator of this process: its rank there, with the process's host, node and launcher rank",
        );
        Members { gauge, process }
    }

    /// The member series' attributes of communicator `meta`.
    fn attrs(&self, meta: &CommMeta) -> Vec<KeyValue> {
        let mut attrs = comm_attrs(meta);
        attrs.extend(self.process.iter().cloned());
        attrs
    }

    /// Starts an interval: last interval's series go.
    pub(super) fn clear(&self) {
        self.gauge.clear();
    }
}

impl Pipeline {
    /// Reports this process's membership of communicator `meta` for the interval.
    pub(super) fn member(&mut self, meta: &CommMeta) {
        let attrs = self.members.attrs(meta);
        let attrs = self.attrs_or_overflow(Family::Profiler, attrs, 1);
        self.members.gauge.record(1.0, &attrs);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::SdkMeterProvider;

    use super::*;

    /// The member series' attributes when the resource has `resource`.
    fn attrs(resource: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut export = config::Config::default().export;
        export.resource = resource.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let provider = SdkMeterProvider::default();
        let members = Members::new(&provider.meter("test"), &export);
        let meta = CommMeta {
            hash: 0xab,
            name: "c".into(),
            rank: 2,
            nranks: 4,
            nnodes: 1,
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
}
