//! Readers of each NCCL profiler ABI version's descriptors and state arguments.
