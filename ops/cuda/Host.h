// Helpers of the op kernels in ops/cuda/*.cpp, which run on the host and call the launchers:
// the executor's stream, broadcast maps from shapes, dtype dispatch and error sinks.
#pragma once

#include "core/Half.h"
#include "core/OpRegistry.h"
#include "core/cuda/Runtime.h"
#include "ops/cuda/Launchers.h"

#include <mutex>
#include <utility>
#include <vector>

namespace weft::cudaops {

inline cudaStream_t streamOf(const KernelContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

/// Where this step's kernels record data errors.
inline ErrorSink errorSink(const KernelContext& ctx) {
  return {cuda::device(ctx.device.index).deviceError, ctx.planStep};
}

/// The map from `out` to `in` (right-aligned shapes); throws beyond kMaxRank dimensions.
BroadcastMap broadcastMap(const Shape& out, const Shape& in);

/// A library handle (cuBLAS, cuDNN) per GPU, created by `create(Handle&)` on first use while that
/// GPU is current (a handle belongs to the device current when it is made). Handles live as long
/// as the process.
template <class Handle>
class HandlePerGpu {
 public:
  template <class Create>
  Handle get(int gpu, Create create) {
    std::lock_guard lock(mutex_);
    if (handles_.size() <= static_cast<size_t>(gpu)) handles_.resize(static_cast<size_t>(gpu) + 1, nullptr);
    Handle& h = handles_[static_cast<size_t>(gpu)];
    if (!h) {
      cuda::setCurrent(gpu);
      create(h);
    }
    return h;
  }

 private:
  std::mutex mutex_;
  std::vector<Handle> handles_;
};

/// Copies a tensor's bytes on the device (nothing when they are the same memory).
void copyOnDevice(const KernelContext& ctx, const Tensor& src, Tensor& dst);
/// Converts every element of `from` into `to` on the device (same element count, any dtypes).
void castOnDevice(const KernelContext& ctx, const Tensor& from, Tensor& to);

/// Calls f(T{}) for the dtypes CUDA kernels compute in.
template <class F>
void dispatchAll(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); break;
    case DType::F64: f(double{}); break;
    case DType::I32: f(int32_t{}); break;
    case DType::I64: f(int64_t{}); break;
    default: WEFT_THROW("dtype {} has no CUDA kernels for this op", dtypeName(t));
  }
}

template <class F>
void dispatchFloating(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); break;
    case DType::F64: f(double{}); break;
    default: WEFT_THROW("dtype {} is not a floating type with CUDA kernels", dtypeName(t));
  }
}

/// dispatchFloating, and the 16-bit types (BFloat16, Float16), whose kernels compute in f32.
template <class F>
void dispatchFloatingOrHalf(DType t, F&& f) {
  switch (t) {
    case DType::BF16: f(BFloat16{}); break;
    case DType::F16: f(Float16{}); break;
    default: dispatchFloating(t, std::forward<F>(f));
  }
}

/// dispatchAll, and the 16-bit types.
template <class F>
void dispatchAllOrHalf(DType t, F&& f) {
  switch (t) {
    case DType::BF16: f(BFloat16{}); break;
    case DType::F16: f(Float16{}); break;
    default: dispatchAll(t, std::forward<F>(f));
  }
}

template <class F>
void dispatchIds(DType t, F&& f) {
  switch (t) {
    case DType::I32: f(int32_t{}); break;
    case DType::I64: f(int64_t{}); break;
    default: WEFT_THROW("dtype {} is not an index type (i32 or i64)", dtypeName(t));
  }
}

/// Sets every element of `out` to `value` converted to its dtype (16-bit types included).
inline void fillOnDevice(const KernelContext& ctx, Tensor& out, double value) {
  if (out.numel() == 0) return;
  switch (out.dtype()) {
    case DType::BF16:
      WEFT_CUDA_CHECK(launch::fill<uint16_t>(static_cast<uint16_t*>(out.raw()),
                                             BFloat16(static_cast<float>(value)).bits, out.numel(), streamOf(ctx)));
      break;
    case DType::F16:
      WEFT_CUDA_CHECK(launch::fill<uint16_t>(static_cast<uint16_t*>(out.raw()), Float16(static_cast<float>(value)).bits,
                                             out.numel(), streamOf(ctx)));
      break;
    default:
      dispatchAll(out.dtype(), [&](auto z) {
        using T = decltype(z);
        WEFT_CUDA_CHECK(launch::fill<T>(out.data<T>(), static_cast<T>(value), out.numel(), streamOf(ctx)));
      });
  }
}

/// For an op with ids but no data to move: still fails the step on an id outside [0, limit), as
/// the CPU kernel does.
inline void checkIdsOnly(const KernelContext& ctx, const Tensor& ids, int64_t limit) {
  dispatchIds(ids.dtype(), [&](auto zi) {
    using I = decltype(zi);
    WEFT_CUDA_CHECK(launch::checkIds<I>(ids.data<I>(), ids.numel(), limit, errorSink(ctx), streamOf(ctx)));
  });
}

}  // namespace weft::cudaops
