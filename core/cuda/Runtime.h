// The CUDA runtime behind Device("cuda:N"): per-GPU streams, the caching allocator, and the error
// record that kernels fill instead of stopping the device. Internal to core/ and the CUDA kernels
// in ops/cuda/; callers outside see only core/Device.h.
#pragma once

#include "core/CachingAllocator.h"
#include "core/Error.h"
#include "core/cuda/KernelError.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace weft::cuda {

/// Throws weft::Error naming the CUDA call, its error and the source location.
[[noreturn]] void fail(cudaError_t error, const char* call, const char* file, int line);

#define WEFT_CUDA_CHECK(...)                                              \
  do {                                                                    \
    const cudaError_t weftCudaError_ = (__VA_ARGS__);                     \
    if (weftCudaError_ != cudaSuccess) {                                  \
      ::weft::cuda::fail(weftCudaError_, #__VA_ARGS__, __FILE__, __LINE__); \
    }                                                                     \
  } while (0)

/// One GPU's state, created on first use and kept for the life of the process.
struct DeviceState {
  int index = 0;
  cudaStream_t compute = nullptr;  // every kernel of the executor runs here, in plan order
  cudaStream_t upload = nullptr;   // uploadTo()'s copies, beside the compute stream's work
  CachingAllocator* allocator = nullptr;
  KernelError* deviceError = nullptr;  // where kernels record data errors...
  KernelError* hostError = nullptr;    // ...and its pinned host copy, read once per step
};

/// The state of GPU `index`; throws when it does not exist.
DeviceState& device(int index);

/// Makes GPU `index` current for this thread (the runtime's device is per thread).
void setCurrent(int index);

}  // namespace weft::cuda
