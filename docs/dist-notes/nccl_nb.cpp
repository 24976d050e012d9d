#include <nccl.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

using Clock = std::chrono::steady_clock;

// Poll a non-blocking communicator until it leaves ncclInProgress (or the deadline passes).
inline ncclResult_t ncclWaitComm(ncclComm_t comm, Clock::time_point deadline) {
    for (;;) {
        ncclResult_t state = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess) return r;
        if (state != ncclInProgress) return state;     // ncclSuccess or the async error
        if (Clock::now() > deadline) return ncclInProgress;
        // here: also poll the coordinator for "abort" broadcasts / dead ranks
    }
}

// id bytes come from rank 0's ncclGetUniqueId via the coordinator (128 bytes, opaque).
inline ncclComm_t initComm(const unsigned char (&idBytes)[NCCL_UNIQUE_ID_BYTES], int nranks,
                           int rank, int device, Clock::duration timeout) {
    if (cudaSetDevice(device) != cudaSuccess) throw std::runtime_error("cudaSetDevice");
    ncclUniqueId id;
    std::memcpy(id.internal, idBytes, NCCL_UNIQUE_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;        // mandatory initializer
    cfg.blocking = 0;                                  // never block inside NCCL calls
    cfg.commName = "weft-dp";
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &cfg);
    if (r == ncclInProgress) r = ncclWaitComm(comm, Clock::now() + timeout);
    if (r != ncclSuccess) {
        if (comm) ncclCommAbort(comm);
        throw std::runtime_error(std::string("NCCL init: ") + ncclGetErrorString(r));
    }
    return comm;
}

// Enqueue an in-place f32 sum; returns when the kernel is enqueued (not finished).
inline void allReduceSum(ncclComm_t comm, float* buf, size_t count, cudaStream_t stream,
                         Clock::duration timeout) {
    ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, stream);
    if (r == ncclInProgress) r = ncclWaitComm(comm, Clock::now() + timeout);
    if (r != ncclSuccess) {
        ncclCommAbort(comm);
        throw std::runtime_error(std::string("ncclAllReduce: ") + ncclGetErrorString(r));
    }
}

// Completion with a watchdog: never cudaStreamSynchronize blindly on a possibly hung comm.
inline void waitStream(ncclComm_t comm, cudaEvent_t done, cudaStream_t stream, Clock::duration timeout) {
    cudaEventRecord(done, stream);
    const auto deadline = Clock::now() + timeout;
    while (cudaEventQuery(done) == cudaErrorNotReady) {
        ncclResult_t state = ncclSuccess;
        ncclCommGetAsyncError(comm, &state);
        if ((state != ncclSuccess && state != ncclInProgress) || Clock::now() > deadline) {
            ncclCommAbort(comm);                        // unblocks the kernel; comm is gone
            throw std::runtime_error("allreduce failed or timed out");
        }
    }
}

inline void shutdownComm(ncclComm_t comm, Clock::duration timeout) {
    ncclResult_t r = ncclCommFinalize(comm);            // non-blocking: may return ncclInProgress
    if (r == ncclInProgress) r = ncclWaitComm(comm, Clock::now() + timeout);
    if (r == ncclSuccess) ncclCommDestroy(comm); else ncclCommAbort(comm);
}
