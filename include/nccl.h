/* topoccl's drop-in nccl.h: NCCL 2.28 names, values and struct layouts, so an application built
 * against NCCL links and runs against topoccl unchanged. Every function also has a pnccl* alias. */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#if defined(TOPOCCL_NO_CUDA_HEADERS) || !defined(__has_include)
#define TOPOCCL_HAS_CUDA_HEADERS 0
#elif __has_include(<cuda_runtime.h>)
#define TOPOCCL_HAS_CUDA_HEADERS 1
#else
#define TOPOCCL_HAS_CUDA_HEADERS 0
#endif

#if TOPOCCL_HAS_CUDA_HEADERS
#include <cuda_runtime.h>
#else
/* Same type CUDA declares, so the ABI is identical with or without the CUDA headers. */
typedef struct CUstream_st* cudaStream_t;
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#define TOPOCCL_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01
#define NCCL_REVOKE_DEFAULT 0x00

/* Versioned by size/magic/version: a caller's older or newer struct is accepted. */
typedef struct ncclConfig_v22800 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                          \
  {                                                                                      \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,             \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,             \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,             \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,             \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                     \
  }

typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER \
  { sizeof(ncclSimInfo_t), 0x74685283u, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT }

typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

#define TOPOCCL_DECLARE(ret, name, args) \
  ret name args;                         \
  ret p##name args;

TOPOCCL_DECLARE(ncclResult_t, ncclMemAlloc, (void** ptr, size_t size))
TOPOCCL_DECLARE(ncclResult_t, ncclMemFree, (void* ptr))
TOPOCCL_DECLARE(ncclResult_t, ncclGetVersion, (int* version))
TOPOCCL_DECLARE(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId))
TOPOCCL_DECLARE(ncclResult_t, ncclCommInitRankConfig,
                (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config))
TOPOCCL_DECLARE(ncclResult_t, ncclCommInitRank,
                (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank))
TOPOCCL_DECLARE(ncclResult_t, ncclCommInitAll, (ncclComm_t * comm, int ndev, const int* devlist))
TOPOCCL_DECLARE(ncclResult_t, ncclCommInitRankScalable,
                (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                 ncclConfig_t* config))
TOPOCCL_DECLARE(ncclResult_t, ncclCommFinalize, (ncclComm_t comm))
TOPOCCL_DECLARE(ncclResult_t, ncclCommDestroy, (ncclComm_t comm))
TOPOCCL_DECLARE(ncclResult_t, ncclCommAbort, (ncclComm_t comm))
TOPOCCL_DECLARE(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags))
TOPOCCL_DECLARE(ncclResult_t, ncclCommSplit,
                (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config))
TOPOCCL_DECLARE(ncclResult_t, ncclCommShrink,
                (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                 ncclConfig_t* config, int shrinkFlags))
TOPOCCL_DECLARE(const char*, ncclGetErrorString, (ncclResult_t result))
TOPOCCL_DECLARE(const char*, ncclGetLastError, (ncclComm_t comm))
TOPOCCL_DECLARE(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError))
TOPOCCL_DECLARE(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count))
TOPOCCL_DECLARE(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device))
TOPOCCL_DECLARE(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank))
TOPOCCL_DECLARE(ncclResult_t, ncclCommRegister,
                (const ncclComm_t comm, void* buff, size_t size, void** handle))
TOPOCCL_DECLARE(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle))
TOPOCCL_DECLARE(ncclResult_t, ncclCommWindowRegister,
                (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags))
TOPOCCL_DECLARE(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win))
TOPOCCL_DECLARE(ncclResult_t, ncclRedOpCreatePreMulSum,
                (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype,
                 ncclScalarResidence_t residence, ncclComm_t comm))
TOPOCCL_DECLARE(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm))
TOPOCCL_DECLARE(ncclResult_t, ncclReduce,
                (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                 ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream))
TOPOCCL_DECLARE(ncclResult_t, ncclBcast,
                (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                 cudaStream_t stream))
TOPOCCL_DECLARE(ncclResult_t, ncclBroadcast,
                (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                 int root, ncclComm_t comm, cudaStream_t stream))
TOPOCCL_DECLARE(ncclResult_t, ncclAllReduce,
                (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                 ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))
TOPOCCL_DECLARE(ncclResult_t, ncclReduceScatter,
                (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                 ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))
TOPOCCL_DECLARE(ncclResult_t, ncclAllGather,
                (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                 ncclComm_t comm, cudaStream_t stream))
TOPOCCL_DECLARE(ncclResult_t, ncclAlltoAll,
                (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                 ncclComm_t comm, cudaStream_t stream))
TOPOCCL_DECLARE(ncclResult_t, ncclGather,
                (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                 int root, ncclComm_t comm, cudaStream_t stream))
TOPOCCL_DECLARE(ncclResult_t, ncclScatter,
                (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                 int root, ncclComm_t comm, cudaStream_t stream))
TOPOCCL_DECLARE(ncclResult_t, ncclSend,
                (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                 ncclComm_t comm, cudaStream_t stream))
TOPOCCL_DECLARE(ncclResult_t, ncclRecv,
                (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                 cudaStream_t stream))
TOPOCCL_DECLARE(ncclResult_t, ncclGroupStart, (void))
TOPOCCL_DECLARE(ncclResult_t, ncclGroupEnd, (void))
TOPOCCL_DECLARE(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo))

#undef TOPOCCL_DECLARE

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
