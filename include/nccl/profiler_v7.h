/*
 * profiler_v7.h - profiler API v7 as NVIDIA released it in NCCL 2.31.2: the v6 descriptor with a
 * 64-bit userTag on collApi, p2pApi, coll, p2p and ceColl, coll.kernelVariant and coll.isSymColl,
 * and the KernelPhase member; every v6 field keeps its offset. State arguments are v6's.
 * Layout: shared/nccl-profiler-api.md section 7.2. Other, incompatible "v7" definitions exist
 * (section 8.x): this one is the only one with userTag. Written for nccl-profiler-otel;
 * include through profiler.h.
 */
#include "profiler.h"

#ifndef NCCL_OTEL_PROFILER_V7_H
#define NCCL_OTEL_PROFILER_V7_H

typedef ncclProfilerEventState_t ncclProfilerEventState_v7_t;

/* Descriptor passed to startEvent (sizeof 136). Check `type` before reading the union. */
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
      uint64_t userTag;   /* ncclCollConfig_t.userProfilerTag; 0 = untagged */
    } collApi;

    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
      uint64_t userTag;
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
      void* parentGroup;          /* Group event handle; parentObj is the CollApi event */
      const char* kernelVariant;  /* symmetric kernel name, or NULL */
      bool isSymColl;
      uint64_t userTag;
    } coll;

    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;  /* Group event handle; parentObj is the P2pApi event */
      uint64_t userTag;
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
      uint64_t userTag;
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

    struct {
      uint8_t channelId;
      uint8_t phaseId;        /* 0 initial_sync, 1 compute, 2 final_sync */
      const char* phaseName;
      uint64_t pTimer;        /* GPU start time of the phase */
    } kernelPhase;
  };
} ncclProfilerEventDescr_v7_t;

/* v7 passes the v6 state arguments unchanged; KernelPhaseStop carries its end in kernelCh.pTimer. */
typedef ncclProfilerEventStateArgs_v6_t ncclProfilerEventStateArgs_v7_t;

/* Exported as the data symbol `ncclProfiler_v7` (sizeof 48). Same init order as v5. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask,
                       const char* commName, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v7_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v7_t eState,
                                   ncclProfilerEventStateArgs_v7_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v7_t;

#endif /* NCCL_OTEL_PROFILER_V7_H */
