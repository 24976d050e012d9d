// CUDA kernel of the shape ops (ops/Shape.cpp defines them; ops/cuda/Shape.cpp maps each to a box
// copy): one strided copy moves any box of a tensor to any box of another.
#include "ops/cuda/Device.cuh"

namespace weft::cudaops {
namespace {

template <class Bits>
__global__ void boxCopyKernel(const Bits* src, int64_t srcBase, BroadcastMap srcMap, Bits* dst, int64_t dstBase,
                              BroadcastMap dstMap, int64_t n) {
  WEFT_GRID_STRIDE(i, n) dst[dstBase + dstMap.offset(i)] = src[srcBase + srcMap.offset(i)];
}

template <class Bits>
cudaError_t launchBoxCopy(const void* src, int64_t srcBase, const BroadcastMap& srcMap, void* dst, int64_t dstBase,
                          const BroadcastMap& dstMap, int64_t n, cudaStream_t stream) {
  boxCopyKernel<Bits><<<blocksFor(n), kThreads, 0, stream>>>(static_cast<const Bits*>(src), srcBase, srcMap,
                                                              static_cast<Bits*>(dst), dstBase, dstMap, n);
  return cudaGetLastError();
}

template <class Bits, class I>
__global__ void reverseSequenceKernel(const Bits* x, Bits* out, int64_t n, int64_t seqStride, int64_t seqLen,
                                      int64_t batchStride, int64_t batch, const I* lengths, ErrorSink errors) {
  WEFT_GRID_STRIDE(i, n) {
    const int64_t t = (i / seqStride) % seqLen, b = (i / batchStride) % batch;
    int64_t len = static_cast<int64_t>(lengths[b]);
    if (len < 0 || len > seqLen) {
      if (t == 0) raiseError(errors, cuda::KernelError::LengthOutOfRange, len, b, seqLen);
      len = 0;
    }
    out[i] = x[t < len ? i + (len - 1 - 2 * t) * seqStride : i];
  }
}

template <class Bits, class I>
cudaError_t launchReverse(const void* x, void* out, int64_t n, int64_t seqStride, int64_t seqLen, int64_t batchStride,
                          int64_t batch, const I* lengths, ErrorSink errors, cudaStream_t stream) {
  reverseSequenceKernel<Bits, I><<<blocksFor(n), kThreads, 0, stream>>>(
      static_cast<const Bits*>(x), static_cast<Bits*>(out), n, seqStride, seqLen, batchStride, batch, lengths, errors);
  return cudaGetLastError();
}

}  // namespace

template <class I>
cudaError_t launch::reverseSequence(size_t elementBytes, const void* x, void* out, int64_t n, int64_t seqStride,
                                    int64_t seqLen, int64_t batchStride, int64_t batch, const I* lengths,
                                    ErrorSink errors, cudaStream_t stream) {
  switch (elementBytes) {
    case 2:
      return launchReverse<uint16_t, I>(x, out, n, seqStride, seqLen, batchStride, batch, lengths, errors, stream);
    case 4:
      return launchReverse<uint32_t, I>(x, out, n, seqStride, seqLen, batchStride, batch, lengths, errors, stream);
    case 8:
      return launchReverse<uint64_t, I>(x, out, n, seqStride, seqLen, batchStride, batch, lengths, errors, stream);
    default: return cudaErrorInvalidValue;
  }
}

template cudaError_t launch::reverseSequence<int32_t>(size_t, const void*, void*, int64_t, int64_t, int64_t, int64_t,
                                                      int64_t, const int32_t*, ErrorSink, cudaStream_t);
template cudaError_t launch::reverseSequence<int64_t>(size_t, const void*, void*, int64_t, int64_t, int64_t, int64_t,
                                                      int64_t, const int64_t*, ErrorSink, cudaStream_t);

cudaError_t launch::boxCopy(size_t elementBytes, const void* src, int64_t srcBase, const BroadcastMap& srcMap,
                            void* dst, int64_t dstBase, const BroadcastMap& dstMap, int64_t n, cudaStream_t stream) {
  switch (elementBytes) {
    case 2: return launchBoxCopy<uint16_t>(src, srcBase, srcMap, dst, dstBase, dstMap, n, stream);
    case 4: return launchBoxCopy<uint32_t>(src, srcBase, srcMap, dst, dstBase, dstMap, n, stream);
    case 8: return launchBoxCopy<uint64_t>(src, srcBase, srcMap, dst, dstBase, dstMap, n, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace weft::cudaops
