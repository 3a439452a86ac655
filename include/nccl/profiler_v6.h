/*
 * profiler_v6.h - profiler API v6 (NCCL 2.29+): v5 plus the copy-engine events
 * (CeColl, CeSync, CeBatch). State arguments are unchanged from v5.
 * Layout: shared/nccl-profiler-api.md sections 2.4, 2.5, 2.9. Written for nccl-profiler-otel;
 * include through profiler.h.
 */
#include "profiler.h"

#ifndef NCCL_OTEL_PROFILER_V6_H
#define NCCL_OTEL_PROFILER_V6_H

typedef ncclProfilerEventState_t ncclProfilerEventState_v6_t;

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

    struct {
      uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;  /* "MC" or "UC" */
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
    } ceColl;

    struct {
      bool isComplete;
      int nRanks;
    } ceCollSync;

    struct {
      int numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
  };
} ncclProfilerEventDescr_v6_t;

/* v6 passes the v5 state arguments unchanged. */
typedef ncclProfilerEventStateArgs_v5_t ncclProfilerEventStateArgs_v6_t;

/* Exported as the data symbol `ncclProfiler_v6` (sizeof 48). Same init order as v5. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask,
                       const char* commName, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v6_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v6_t eState,
                                   ncclProfilerEventStateArgs_v6_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v6_t;

#endif /* NCCL_OTEL_PROFILER_V6_H */
