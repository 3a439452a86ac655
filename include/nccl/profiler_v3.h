/*
 * profiler_v3.h - profiler API v3 (NCCL 2.26): v2 without coll.trafficBytes, plus KernelCh
 * (channel only, no GPU time) and NetPlugin. State arguments are v1's.
 * Layout: shared/nccl-profiler-api.md sections 2.4, 2.8, 2.9. Written for nccl-profiler-otel;
 * include through profiler.h.
 */
#include "profiler.h"

#ifndef NCCL_OTEL_PROFILER_V3_H
#define NCCL_OTEL_PROFILER_V3_H

typedef ncclProfilerEventState_t ncclProfilerEventState_v3_t;

/* Descriptor passed to startEvent (sizeof 120). Check `type` before reading the union. */
typedef struct {
  uint8_t type;      /* one ncclProfile* bit (bits 0-7 only) */
  void* parentObj;   /* parent event handle, or NULL */
  int rank;          /* rank that produced the event */
  union {
    struct {
      const char* name;     /* communicator name: always NULL in 2.23-2.26 */
      uint64_t commHash;
      uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;

    struct {
      const char* name;
      uint64_t commHash;
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
    } p2p;

    struct {
      pid_t pid;          /* process that posted the op; differs from ours under PXN */
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;

    struct {
      int step;
    } proxyStep;

    struct {
      uint8_t channelId;  /* no GPU time in v3 */
    } kernelCh;

    struct {
      int64_t id;         /* low 16 bits: descriptor version; next 16 bits: network type */
      void* data;         /* network-defined descriptor */
    } netPlugin;
  };
} ncclProfilerEventDescr_v3_t;

/* v3 passes the v1 state arguments unchanged (sizeof 16). */
typedef ncclProfilerEventStateArgs_v1_t ncclProfilerEventStateArgs_v3_t;

/* Exported as the data symbol `ncclProfiler_v3` (sizeof 48). */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v3_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v3_t eState,
                                   ncclProfilerEventStateArgs_v3_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v3_t;

#endif /* NCCL_OTEL_PROFILER_V3_H */
