//! Unit tests of the launcher's identity: each launcher alone names the job, the rank and a
//! `service.name` other than the default; the precedence between launchers and the user's
//! `OTEL_*` variables.

use super::super::*;
use super::load;

/// The value of `key` in the resource.
fn attr<'a>(config: &'a Config, key: &str) -> Option<&'a str> {
    let resource = &config.export.resource;
    resource.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// Asserts the resource has each (attribute, value) of `expected`.
fn has(config: &Config, expected: &[(&str, &str)]) {
    for (key, value) in expected {
        assert_eq!(attr(config, key), Some(*value), "{key}: {:?}", config.export.resource);
    }
}

#[test]
fn slurm_alone() {
    let (config, warnings) = load(&[
        ("SLURM_JOB_ID", " 4242 "),
        ("SLURM_JOB_NAME", "llama-pretrain"),
        ("SLURM_PROCID", "13"),
        ("SLURM_LOCALID", "5"),
        ("SLURM_NODEID", "1"),
        ("SLURM_NTASKS", "16"),
        ("SLURMD_NODENAME", "gpu-017"),
    ]);
    assert!(warnings.is_empty());
    assert_eq!(config.export.service_name, "llama-pretrain");
    let expected = [
        ("job.id", "4242"),
        ("job.launcher", "slurm"),
        ("job.local_rank", "5"),
        ("job.name", "llama-pretrain"),
        ("job.node_name", "gpu-017"),
        ("job.node_rank", "1"),
        ("job.rank", "13"),
        ("job.world_size", "16"),
        ("service.namespace", "4242"),
    ];
    let expected: Vec<(String, String)> = expected.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
    assert_eq!(config.export.resource, expected);
}

#[test]
fn torchrun_alone() {
    let (config, _) = load(&[
        ("TORCHELASTIC_RUN_ID", "run-7"),
        ("RANK", "3"),
        ("LOCAL_RANK", "1"),
        ("GROUP_RANK", "0"),
        ("WORLD_SIZE", "8"),
    ]);
    assert_eq!(config.export.service_name, "run-7");
    has(
        &config,
        &[
            ("service.namespace", "run-7"),
            ("job.launcher", "torchrun"),
            ("job.rank", "3"),
            ("job.local_rank", "1"),
            ("job.node_rank", "0"),
            ("job.world_size", "8"),
        ],
    );
    // torchrun without `--rdzv-id` says `none`: no job id, but still not the generic name.
    let (config, _) = load(&[("TORCHELASTIC_RUN_ID", "none"), ("RANK", "3")]);
    assert_eq!(config.export.service_name, "nccl-torchrun");
    assert_eq!(attr(&config, "job.id"), None);
    assert_eq!(attr(&config, "service.namespace"), None);
}

#[test]
fn open_mpi_alone() {
    let (config, _) = load(&[
        ("OMPI_COMM_WORLD_RANK", "6"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("PMIX_RANK", "6"),
        ("PMIX_NAMESPACE", "prterun-gpu-017-81234@1"),
    ]);
    assert_eq!(config.export.service_name, "prterun-gpu-017-81234@1");
    has(
        &config,
        &[
            ("service.namespace", "prterun-gpu-017-81234@1"),
            ("job.launcher", "mpi"),
            ("job.rank", "6"),
            ("job.local_rank", "2"),
            ("job.world_size", "8"),
        ],
    );
    // PMIx alone (e.g. `srun --mpi=pmix` without Slurm's own variables).
    let (config, _) = load(&[("PMIX_RANK", "4"), ("PMIX_NAMESPACE", "ns")]);
    assert_eq!(attr(&config, "job.rank"), Some("4"));
    assert_eq!(config.export.service_name, "ns");
}

#[test]
fn kubernetes_alone() {
    let pod = [
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("POD_NAME", "trainer-3-x7k2p"),
        ("POD_NAMESPACE", "ml"),
        ("NODE_NAME", "node-a"),
        ("JOB_COMPLETION_INDEX", "3"),
        ("K8S_JOB_NAME", "trainer"),
    ];
    let (config, _) = load(&pod);
    assert_eq!(config.export.service_name, "trainer");
    has(
        &config,
        &[
            ("service.namespace", "ml"),
            ("job.launcher", "kubernetes"),
            ("k8s.pod.name", "trainer-3-x7k2p"),
            ("k8s.namespace.name", "ml"),
            ("k8s.node.name", "node-a"),
            ("job.node_rank", "3"),
        ],
    );
    // The `K8S_` spellings; no job name: still not the generic name.
    let (config, _) = load(&[
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("K8S_POD_NAME", "p"),
        ("K8S_NAMESPACE", "ns"),
        ("K8S_NODE_NAME", "n"),
    ]);
    assert_eq!(config.export.service_name, "nccl-kubernetes");
    has(
        &config,
        &[
            ("k8s.pod.name", "p"),
            ("k8s.node.name", "n"),
            ("service.namespace", "ns"),
        ],
    );
    // Outside a pod the same names mean nothing to us.
    let (config, _) = load(&pod[1..]);
    assert_eq!(config.export.service_name, DEFAULT_SERVICE_NAME);
    assert!(config.export.resource.is_empty());
}

/// `srun` starting one torchrun per node: the job is Slurm's, the rank torchrun's (its workers
/// all inherit the one task's `SLURM_PROCID`).
#[test]
fn slurm_names_the_job_torchrun_places_the_process() {
    let (config, _) = load(&[
        ("SLURM_JOB_ID", "4242"),
        ("SLURM_JOB_NAME", "llama"),
        ("SLURM_PROCID", "1"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_NODEID", "1"),
        ("TORCHELASTIC_RUN_ID", "4242-rdzv"),
        ("RANK", "13"),
        ("LOCAL_RANK", "5"),
        ("GROUP_RANK", "1"),
        ("WORLD_SIZE", "16"),
    ]);
    assert_eq!(config.export.service_name, "llama");
    has(
        &config,
        &[
            ("job.id", "4242"),
            ("job.launcher", "slurm"),
            ("job.rank", "13"),
            ("job.local_rank", "5"),
            ("job.world_size", "16"),
        ],
    );
}

#[test]
fn the_users_variables_win() {
    let slurm = [
        ("SLURM_JOB_ID", "4242"),
        ("SLURM_JOB_NAME", "llama"),
        ("RANK", " 3 "),
        ("POD_NAME", ""),
    ];
    let user = (
        otel::RESOURCE_ATTRIBUTES,
        "team=ml,service.name=from-resource,job.rank=7,service.namespace=prod",
    );
    let (config, warnings) = load(&[slurm[0], slurm[1], slurm[2], slurm[3], user]);
    assert!(warnings.is_empty());
    assert_eq!(config.export.service_name, "from-resource");
    has(
        &config,
        &[
            ("job.rank", "7"),
            ("service.namespace", "prod"),
            ("team", "ml"),
            ("job.id", "4242"),
        ],
    );
    let (config, _) = load(&[slurm[0], slurm[1], (otel::SERVICE_NAME, "trainer")]);
    assert_eq!(config.export.service_name, "trainer");
    assert_eq!(attr(&config, "service.namespace"), Some("4242"));
    // The user's job attributes name the service as the launcher's would.
    let (config, _) = load(&[(otel::RESOURCE_ATTRIBUTES, "job.id=j1")]);
    assert_eq!(config.export.service_name, "j1");
    assert_eq!(attr(&config, "service.namespace"), Some("j1"));
}
