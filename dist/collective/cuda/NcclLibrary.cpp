// NCCL, opened when a GPU worker first sums through it (core/cuda/GpuLibrary.h): the functions
// dist/collective/cuda/Nccl.cpp calls, each forwarded to the library's own.
#ifdef WEFT_HAVE_NCCL
#include "core/cuda/GpuLibrary.h"

#include <nccl.h>

namespace {

weft::cuda::GpuLibrary& ncclLibrary() {
  static weft::cuda::GpuLibrary library("NCCL", WEFT_NCCL_PATH);
  return library;
}

}  // namespace

WEFT_GPU_FORWARD(ncclLibrary(), const char*, ncclGetErrorString, (ncclResult_t result), (result))
WEFT_GPU_FORWARD(ncclLibrary(), ncclResult_t, ncclGetUniqueId, (ncclUniqueId* uniqueId), (uniqueId))
WEFT_GPU_FORWARD(ncclLibrary(), ncclResult_t, ncclCommInitRankConfig,
                 (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config),
                 (comm, nranks, commId, rank, config))
WEFT_GPU_FORWARD(ncclLibrary(), ncclResult_t, ncclCommGetAsyncError,
                 (ncclComm_t comm, ncclResult_t* asyncError),
                 (comm, asyncError))
WEFT_GPU_FORWARD(ncclLibrary(), ncclResult_t, ncclCommFinalize, (ncclComm_t comm), (comm))
WEFT_GPU_FORWARD(ncclLibrary(), ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm))
WEFT_GPU_FORWARD(ncclLibrary(), ncclResult_t, ncclCommAbort, (ncclComm_t comm), (comm))
WEFT_GPU_FORWARD(ncclLibrary(), ncclResult_t, ncclAllReduce,
                 (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                  ncclComm_t comm, cudaStream_t stream),
                 (sendbuff, recvbuff, count, datatype, op, comm, stream))

#endif  // WEFT_HAVE_NCCL
