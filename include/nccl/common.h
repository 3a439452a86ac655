/*
 * common.h - result codes and the logger type shared by every profiler API version.
 *
 * Written for nccl-profiler-otel from the ABI description in
 * shared/nccl-profiler-api.md (section 2.1). Values and layouts match NCCL 2.30.7 on x86_64 Linux.
 * Fed to bindgen to produce src/bindings.rs; edit here, then run `cargo build --features bindgen`.
 */
#ifndef NCCL_OTEL_COMMON_H
#define NCCL_OTEL_COMMON_H

/* Return code of every profiler callback. NCCL 2.30 knows 0..8; older headers stop at 6. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

/* Severity passed as the first logger argument; filtered by NCCL_DEBUG. */
typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

/* Subsystem flags passed as the second logger argument; filtered by NCCL_DEBUG_SUBSYS. */
typedef enum {
  NCCL_INIT = 0x1,
  NCCL_COLL = 0x2,
  NCCL_P2P = 0x4,
  NCCL_SHM = 0x8,
  NCCL_NET = 0x10,
  NCCL_GRAPH = 0x20,
  NCCL_TUNING = 0x40,
  NCCL_ENV = 0x80,
  NCCL_ALLOC = 0x100,
  NCCL_CALL = 0x200,
  NCCL_PROXY = 0x400,
  NCCL_NVLS = 0x800,
  NCCL_BOOTSTRAP = 0x1000,
  NCCL_REG = 0x2000,
  NCCL_PROFILE = 0x4000,
  NCCL_RAS = 0x8000,
  NCCL_DESTROY = 0x10000,
  NCCL_ALLOC_HOST = 0x20000,
  NCCL_ALL = ~0
} ncclDebugLogSubSys;

/*
 * NCCL's logger (its own ncclDebugLog). C variadic: call it with fmt = "%s" and one
 * pre-formatted string. `file` is printed for WARN and used as the function name for TRACE.
 */
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags,
                                  const char* file, int line, const char* fmt, ...);

#endif /* NCCL_OTEL_COMMON_H */
