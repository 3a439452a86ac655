/*
 * profiler_v5.h - profiler API v5 (NCCL 2.28+): 64-bit event type, API-level events
 * (GroupApi, CollApi, P2pApi, KernelLaunch), `parentGroup`, and the new `init` argument order.
 * Layout: shared/nccl-profiler-api.md sections 2.4, 2.6, 2.9. Written for nccl-profiler-otel;
 * include through profiler.h.
 */
#include "profiler.h"

#ifndef NCCL_OTEL_PROFILER_V5_H
#define NCCL_OTEL_PROFILER_V5_H

typedef ncclProfilerEventState_t ncclProfilerEventState_v5_t;

/* Descriptor passed to startEvent (sizeof 112). Check `type` before reading the union. */
typedef struct {
  uint64_t type;     /* one ncclProfile* bit */
  void* parentObj;   /* parent event handle, or NULL */
  int rank;          /* rank that produced the event */
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;

    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;

    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;

    struct {
      void* stream;
    } kernelLaunch;

    struct {
      uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;  /* Group event handle; parentObj is the CollApi event */
    } coll;

    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;  /* Group event handle; parentObj is the P2pApi event */
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
      uint8_t channelId;
      uint64_t pTimer;    /* GPU start time */
    } kernelCh;

    struct {
      int64_t id;         /* low 16 bits: descriptor version; next 16 bits: network type */
      void* data;         /* network-defined descriptor */
    } netPlugin;
  };
} ncclProfilerEventDescr_v5_t;

/* Argument of recordEventState (sizeof 8); the pointer is NULL for GroupApi states. */
typedef union {
  struct {
    size_t transSize;
  } proxyStep;

  struct {
    int appendedProxyOps;
  } proxyCtrl;

  struct {
    void* data;
  } netPlugin;

  struct {
    uint64_t pTimer;    /* GPU stop time (ncclProfilerKernelChStop) */
  } kernelCh;
} ncclProfilerEventStateArgs_v5_t;

/* Exported as the data symbol `ncclProfiler_v5` (sizeof 48). commId is now the 2nd argument. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask,
                       const char* commName, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v5_t eState,
                                   ncclProfilerEventStateArgs_v5_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v5_t;

#endif /* NCCL_OTEL_PROFILER_V5_H */
