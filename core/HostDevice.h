// WEFT_HOST_DEVICE marks small inline functions that both the host compiler and nvcc compile
// for both sides (formulas shared by CPU and CUDA kernels).
#pragma once

#ifdef __CUDACC__
#define WEFT_HOST_DEVICE __host__ __device__
#else
#define WEFT_HOST_DEVICE
#endif
