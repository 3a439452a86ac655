/*
 * profiler_v1.h - profiler API v1 (NCCL 2.23; the only table 2.23 looks up): event descriptor,
 * state arguments and the table exported as `ncclProfiler_v1`. Function, datatype, algorithm and
 * protocol are numeric codes. Layout: shared/nccl-profiler-api.md sections 2.4, 2.8, 2.9.
 * Written for nccl-profiler-otel; include through profiler.h.
 */
#include "profiler.h"

#ifndef NCCL_OTEL_PROFILER_V1_H
#define NCCL_OTEL_PROFILER_V1_H

typedef ncclProfilerEventState_t ncclProfilerEventState_v1_t;

/* Descriptor passed to startEvent (sizeof 120). Check `type` before reading the union. */
typedef struct {
  uint8_t type;      /* one ncclProfile* bit (bits 0-5 only) */
  void* parentObj;   /* parent event handle, or NULL */
  int rank;          /* rank that produced the event */
  union {
    struct {
      const char* name;     /* communicator name: always NULL in 2.23-2.26 */
      uint64_t commHash;
      uint64_t seqNumber;
      uint8_t func;         /* ncclFunc_t */
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      uint8_t datatype;     /* ncclDataType_t */
      uint32_t op;
      size_t trafficBytes;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      uint8_t algo;         /* algorithm index */
      uint8_t proto;        /* protocol index */
      int isCollnet;
      int isNvls;
    } coll;

    struct {
      const char* name;
      uint64_t commHash;
      uint8_t func;
      void* buff;
      uint8_t datatype;
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
  };
} ncclProfilerEventDescr_v1_t;

/* Argument of recordEventState (sizeof 16); which member is valid depends on eState. */
typedef union {
  struct {
    size_t transSize;   /* running byte total of the proxy sub-op (never reset by NCCL) */
    int steps;
  } proxyOp;

  struct {
    int appendedProxyOps;
  } proxyCtrl;
} ncclProfilerEventStateArgs_v1_t;

/* Exported as the data symbol `ncclProfiler_v1` (sizeof 48). */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v1_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v1_t eState,
                                   ncclProfilerEventStateArgs_v1_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v1_t;

#endif /* NCCL_OTEL_PROFILER_V1_H */
