//! Every attribute key the plugin exports (`docs/metrics.md`): the metrics' `nccl.*` keys and the
//! resource's and member series' keys of the process, GPU and launcher. Every other file names a
//! key through these constants only.
#![forbid(unsafe_code)]

use opentelemetry::Key;

/// The communicator's hash, hexadecimal.
pub const COMM_HASH: Key = Key::from_static_str("nccl.comm.hash");
/// The communicator's name (NCCL 2.27+), else empty.
pub const COMM_NAME: Key = Key::from_static_str("nccl.comm.name");
/// Our rank in the communicator (a link's sending rank).
pub const RANK: Key = Key::from_static_str("nccl.rank");
/// Ranks in the communicator (absent when unknown: ABI v1–v3).
pub const NRANKS: Key = Key::from_static_str("nccl.nranks");
/// The peer rank of a link or P2P send.
pub const PEER: Key = Key::from_static_str("nccl.peer");
/// The channel of a link's transfers.
pub const CHANNEL: Key = Key::from_static_str("nccl.channel");
/// The collective's function (`Send` for P2P).
pub const FUNC: Key = Key::from_static_str("nccl.func");
/// The collective's algorithm.
pub const ALGO: Key = Key::from_static_str("nccl.algo");
/// The collective's protocol.
pub const PROTO: Key = Key::from_static_str("nccl.proto");
/// The operation's datatype.
pub const DATATYPE: Key = Key::from_static_str("nccl.datatype");
/// The operation's size class (a power of two).
pub const SIZE_CLASS: Key = Key::from_static_str("nccl.size_class");
/// Whether the operation was launched from a CUDA graph (NCCL 2.28+).
pub const GRAPH_CAPTURED: Key = Key::from_static_str("nccl.graph_captured");
/// The operation's user tag (bounded).
pub const USER_TAG: Key = Key::from_static_str("nccl.user_tag");
/// The kernel phase of `nccl.kernel.phase.duration`.
pub const PHASE: Key = Key::from_static_str("nccl.phase");
/// Why a counter counted (drops, rejections, sheds, a missing figure, a configuration problem).
pub const REASON: Key = Key::from_static_str("nccl.reason");
/// The family of an overflowed attribute set.
pub const FAMILY: Key = Key::from_static_str("nccl.family");
/// The configuration variable of a problem.
pub const VARIABLE: Key = Key::from_static_str("nccl.variable");
/// What a hung operation waits for.
pub const WAIT: Key = Key::from_static_str("nccl.wait");
/// The series the SDK's and the limiter's overflow go to.
pub const OVERFLOW: Key = Key::from_static_str("otel.metric.overflow");

/// The resource's service name.
pub const SERVICE_NAME: Key = Key::from_static_str("service.name");
/// The resource's instance: host, process and launcher rank.
pub const SERVICE_INSTANCE_ID: Key = Key::from_static_str("service.instance.id");
/// The SDK that made the resource.
pub const SDK_NAME: Key = Key::from_static_str("telemetry.sdk.name");
/// The SDK's language.
pub const SDK_LANGUAGE: Key = Key::from_static_str("telemetry.sdk.language");
/// This plugin.
pub const DISTRO_NAME: Key = Key::from_static_str("telemetry.distro.name");
/// This plugin's version.
pub const DISTRO_VERSION: Key = Key::from_static_str("telemetry.distro.version");
/// The host (the user's, else the kernel's).
pub const HOST_NAME: Key = Key::from_static_str("host.name");
/// The process.
pub const PROCESS_PID: Key = Key::from_static_str("process.pid");
/// The launcher's global rank.
pub const JOB_RANK: Key = Key::from_static_str("job.rank");
/// The launcher's job.
pub const JOB_ID: Key = Key::from_static_str("job.id");
/// The launcher's node, else Kubernetes', else the host.
pub const JOB_NODE_NAME: Key = Key::from_static_str("job.node_name");
/// Kubernetes' node.
pub const K8S_NODE_NAME: Key = Key::from_static_str("k8s.node.name");
/// The communicator's GPU, as DCGM names it.
pub const GPU_UUID: Key = Key::from_static_str("gpu.uuid");
/// The communicator's GPU's PCI bus id, as DCGM formats it.
pub const GPU_PCI_BUS_ID: Key = Key::from_static_str("gpu.pci_bus_id");
