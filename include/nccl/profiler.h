/*
 * profiler.h - umbrella header for the NCCL profiler plugin ABI: event type bits, event
 * states, and the per-version descriptor, state-argument and function-table types.
 *
 * Written for nccl-profiler-otel from shared/nccl-profiler-api.md (sections 2.2, 2.3).
 * Input of bindgen (`cargo build --features bindgen` regenerates src/bindings.rs).
 */
#ifndef NCCL_OTEL_PROFILER_H
#define NCCL_OTEL_PROFILER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common.h"

/*
 * Event type bits: the `type` field of a descriptor and the bits of the activation mask.
 * v1-v4 descriptors carry the type in a uint8_t (bits 0-7 only); v5 to v7 in a uint64_t.
 */
typedef enum {
  ncclProfileGroup = 0x1,        /* v1 */
  ncclProfileColl = 0x2,         /* v1 */
  ncclProfileP2p = 0x4,          /* v1 */
  ncclProfileProxyOp = 0x8,      /* v1 */
  ncclProfileProxyStep = 0x10,   /* v1 */
  ncclProfileProxyCtrl = 0x20,   /* v1 */
  ncclProfileKernelCh = 0x40,    /* v3 */
  ncclProfileNetPlugin = 0x80,   /* v3 */
  ncclProfileGroupApi = 0x100,   /* v5 */
  ncclProfileCollApi = 0x200,    /* v5 */
  ncclProfileP2pApi = 0x400,     /* v5 */
  ncclProfileKernelLaunch = 0x800, /* v5 */
  ncclProfileCeColl = 0x1000,    /* v6 */
  ncclProfileCeSync = 0x2000,    /* v6 */
  ncclProfileCeBatch = 0x4000,   /* v6 */
  ncclProfileKernelPhase = 0x8000 /* v7 */
} ncclProfilerEventType_t;

/*
 * `eState` argument of recordEventState. Passed by value as a C enum: a plugin must accept
 * values it does not know.
 */
typedef enum {
  /* ProxyOp states; not emitted since v4. */
  ncclProfilerProxyOpSendPosted = 0,
  ncclProfilerProxyOpSendRemFifoWait = 1,
  ncclProfilerProxyOpSendTransmitted = 2,
  ncclProfilerProxyOpSendDone = 3,
  ncclProfilerProxyOpRecvPosted = 4,
  ncclProfilerProxyOpRecvReceived = 5,
  ncclProfilerProxyOpRecvTransmitted = 6,
  ncclProfilerProxyOpRecvDone = 7,

  /* ProxyStep states (args: proxyStep.transSize). */
  ncclProfilerProxyStepSendGPUWait = 8,
  ncclProfilerProxyStepSendWait = 9,
  ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,

  /* ProxyCtrl states (args: proxyCtrl.appendedProxyOps). */
  ncclProfilerProxyCtrlIdle = 13,
  ncclProfilerProxyCtrlActive = 14,
  ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16,
  ncclProfilerProxyCtrlAppend = 17,
  ncclProfilerProxyCtrlAppendEnd = 18,

  /* Added in v4. */
  ncclProfilerProxyOpInProgress_v4 = 19,
  ncclProfilerProxyStepSendPeerWait_v4 = 20,
  ncclProfilerNetPluginUpdate = 21,
  ncclProfilerKernelChStop = 22,

  /* Added in v5: GroupApi states, called with a NULL args pointer. */
  ncclProfilerGroupStartApiStop = 23,
  ncclProfilerGroupEndApiStart = 24,

  /* Added in v6: copy-engine states, declared but not emitted by NCCL 2.30.7. */
  ncclProfilerCeCollStart = 25,
  ncclProfilerCeCollComplete = 26,
  ncclProfilerCeSyncStart = 27,
  ncclProfilerCeSyncComplete = 28,
  ncclProfilerCeBatchStart = 29,
  ncclProfilerCeBatchComplete = 30,

  /* Added in v7: end of a KernelPhase interval (args: kernelCh.pTimer). */
  ncclProfilerKernelPhaseStop = 31
} ncclProfilerEventState_t;

#include "profiler_v1.h"
#include "profiler_v2.h"
#include "profiler_v3.h"
#include "profiler_v4.h"
#include "profiler_v5.h"
#include "profiler_v6.h"
#include "profiler_v7.h"

#endif /* NCCL_OTEL_PROFILER_H */
