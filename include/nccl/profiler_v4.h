/*
 * profiler_v4.h - profiler API v4 (NCCL 2.27+): event descriptor, state arguments and the
 * table exported as `ncclProfiler_v4`. Layout: shared/nccl-profiler-api.md sections 2.4, 2.7, 2.9.
 * Written for nccl-profiler-otel; include through profiler.h.
 */
#include "profiler.h"

#ifndef NCCL_OTEL_PROFILER_V4_H
#define NCCL_OTEL_PROFILER_V4_H

typedef ncclProfilerEventState_t ncclProfilerEventState_v4_t;

/* Descriptor passed to startEvent (sizeof 104). Check `type` before reading the union. */
typedef struct {
  uint8_t type;      /* one ncclProfile* bit (bits 0-7 only) */
  void* parentObj;   /* parent event handle, or NULL */
  int rank;          /* rank that produced the event */
  union {
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
    } coll;

    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
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
} ncclProfilerEventDescr_v4_t;

/* Argument of recordEventState (sizeof 8); which member is valid depends on eState. */
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
} ncclProfilerEventStateArgs_v4_t;

/* Exported as the data symbol `ncclProfiler_v4` (sizeof 48). */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName,
                       uint64_t commHash, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v4_t eState,
                                   ncclProfilerEventStateArgs_v4_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v4_t;

#endif /* NCCL_OTEL_PROFILER_V4_H */
