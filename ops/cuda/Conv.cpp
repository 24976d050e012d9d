// The CUDA kernels of the convolutions (ops/Conv.cpp defines the ops): cuDNN, NCHW, with the
// algorithm of each shape chosen once by timing cuDNN's candidates on the GPU (the fastest
// deterministic one, so a step gives the same bits every run, unless
// allowNondeterministicConvolutions) and cached with its descriptors.
#include "ops/Ops.h"
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

#include <cudnn.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

namespace weft::cudaops {
namespace {

void checkDnn(cudnnStatus_t status, const char* call) {
  WEFT_CHECK(status == CUDNN_STATUS_SUCCESS, "cuDNN error {} in {}", cudnnGetErrorString(status), call);
}

cudnnHandle_t handleFor(int gpu) {
  static HandlePerGpu<cudnnHandle_t> handles;
  return handles.get(gpu, [](cudnnHandle_t& h) { checkDnn(cudnnCreate(&h), "cudnnCreate"); });
}

/// Everything that determines a convolution's descriptors and algorithms.
struct ConvKey {
  int gpu;
  DType dtype;
  bool tf32, anyDeterminism;
  std::vector<int64_t> dims;  // n, c, h, w, o, kh, kw, strides, padding, dilation
  bool operator<(const ConvKey& o) const {
    return std::tie(gpu, dtype, tf32, anyDeterminism, dims) <
           std::tie(o.gpu, o.dtype, o.tf32, o.anyDeterminism, o.dims);
  }
};

/// Descriptors and the chosen algorithms of one convolution shape.
struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t filter = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t forward{};
  cudnnConvolutionBwdDataAlgo_t backwardData{};
  cudnnConvolutionBwdFilterAlgo_t backwardFilter{};
  size_t forwardBytes = 0, backwardDataBytes = 0, backwardFilterBytes = 0;
};

/// An algorithm and the workspace it needs with the plan's descriptors.
template <class Algo>
struct Chosen {
  Algo algo;
  size_t bytes;
};

/// The fastest algorithm of cuDNN's measured ranking (cudnnFind*, which runs each algorithm once on
/// this GPU, as PyTorch's cudnn.benchmark does) that works: those of the descriptor's math type
/// before others (the ranking lists both tensor-op and plain versions, and an algorithm runs
/// under the descriptor's type), deterministic ones first within each unless `anyDeterminism`,
/// so that a step gives the same bits every run. The workspace is asked of cuDNN for the
/// descriptors as set, not taken from the ranking; an algorithm whose size query fails is passed
/// over.
template <class Perf, class Find, class WorkspaceOf>
Chosen<decltype(Perf::algo)> pickAlgorithm(Find find, WorkspaceOf workspaceOf, cudnnMathType_t math,
                                           bool anyDeterminism, const char* what) {
  static thread_local std::vector<Perf> perfs(16);
  int count = 0;
  checkDnn(find(static_cast<int>(perfs.size()), &count, perfs.data()), what);
  for (const bool sameMath : {true, false}) {
    for (const bool deterministic : {!anyDeterminism, false}) {
      for (int i = 0; i < count; ++i) {
        const Perf& perf = perfs[static_cast<size_t>(i)];
        if (perf.status != CUDNN_STATUS_SUCCESS || (sameMath && perf.mathType != math) ||
            (deterministic && perf.determinism != CUDNN_DETERMINISTIC)) {
          continue;
        }
        size_t bytes = 0;
        if (workspaceOf(perf.algo, &bytes) == CUDNN_STATUS_SUCCESS) return {perf.algo, bytes};
      }
    }
  }
  WEFT_THROW("cuDNN offers no algorithm for {}", what);
}

const ConvPlan& planFor(const KernelContext& ctx, const Shape& x, const Shape& filter) {
  const auto& strides = ctx.attrs().get<std::vector<int64_t>>("strides");
  const auto& padding = ctx.attrs().get<std::vector<int64_t>>("padding");
  const auto& dilation = ctx.attrs().get<std::vector<int64_t>>("dilation");
  const DType dtype = ctx.inputs[0]->dtype();
  const bool tf32 = dtype == f32 && tf32Allowed();
  ConvKey key{ctx.device.index,
              dtype,
              tf32,
              nondeterministicConvolutionsAllowed(),
              {x[0], x[1], x[2], x[3], filter[0], filter[2], filter[3], strides[0], strides[1], padding[0], padding[1],
               dilation[0], dilation[1]}};
  for (int64_t d : key.dims) {
    WEFT_CHECK(d >= 0 && d <= 2147483647, "{}: a dimension of {} exceeds cuDNN's 32-bit sizes", ctx.node->describe(),
               d);
  }
  static std::mutex mutex;
  static std::map<ConvKey, std::unique_ptr<ConvPlan>> plans;
  std::lock_guard lock(mutex);
  auto& slot = plans[key];
  if (slot) return *slot;
  auto p = std::make_unique<ConvPlan>();
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  const cudnnDataType_t type = dtype == f64    ? CUDNN_DATA_DOUBLE
                               : dtype == bf16 ? CUDNN_DATA_BFLOAT16
                               : dtype == f16  ? CUDNN_DATA_HALF
                                               : CUDNN_DATA_FLOAT;
  // 16-bit data accumulates in f32 (cuDNN's "pseudo-half" configurations).
  const cudnnDataType_t accumulate = isHalfPrecision(dtype) ? CUDNN_DATA_FLOAT : type;
  checkDnn(cudnnCreateTensorDescriptor(&p->x), "cudnnCreateTensorDescriptor");
  checkDnn(cudnnCreateTensorDescriptor(&p->y), "cudnnCreateTensorDescriptor");
  checkDnn(cudnnCreateFilterDescriptor(&p->filter), "cudnnCreateFilterDescriptor");
  checkDnn(cudnnCreateConvolutionDescriptor(&p->conv), "cudnnCreateConvolutionDescriptor");
  checkDnn(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, type, i(x[0]), i(x[1]), i(x[2]), i(x[3])),
           "cudnnSetTensor4dDescriptor");
  checkDnn(cudnnSetFilter4dDescriptor(p->filter, type, CUDNN_TENSOR_NCHW, i(filter[0]), i(filter[1]), i(filter[2]),
                                      i(filter[3])),
           "cudnnSetFilter4dDescriptor");
  checkDnn(cudnnSetConvolution2dDescriptor(p->conv, i(padding[0]), i(padding[1]), i(strides[0]), i(strides[1]),
                                           i(dilation[0]), i(dilation[1]), CUDNN_CROSS_CORRELATION, accumulate),
           "cudnnSetConvolution2dDescriptor");
  // FMA math keeps f32 exact to f32; the default lets tensor cores use TF32; 16-bit data runs
  // on tensor cores.
  const cudnnMathType_t math = isHalfPrecision(dtype) ? CUDNN_TENSOR_OP_MATH
                               : dtype == f32 && !tf32 ? CUDNN_FMA_MATH
                                                       : CUDNN_DEFAULT_MATH;
  checkDnn(cudnnSetConvolutionMathType(p->conv, math),
           "cudnnSetConvolutionMathType");
  int n = 0, c = 0, h = 0, w = 0;
  checkDnn(cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->filter, &n, &c, &h, &w),
           "cudnnGetConvolution2dForwardOutputDim");
  checkDnn(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, type, n, c, h, w), "cudnnSetTensor4dDescriptor");
  cudnnHandle_t handle = handleFor(ctx.device.index);
  const auto fwd = pickAlgorithm<cudnnConvolutionFwdAlgoPerf_t>(
      [&](int want, int* got, cudnnConvolutionFwdAlgoPerf_t* out) {
        return cudnnFindConvolutionForwardAlgorithm(handle, p->x, p->filter, p->conv, p->y, want, got, out);
      },
      [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(handle, p->x, p->filter, p->conv, p->y, algo, bytes);
      },
      math, key.anyDeterminism, "the forward convolution");
  p->forward = fwd.algo;
  p->forwardBytes = fwd.bytes;
  const auto data = pickAlgorithm<cudnnConvolutionBwdDataAlgoPerf_t>(
      [&](int want, int* got, cudnnConvolutionBwdDataAlgoPerf_t* out) {
        return cudnnFindConvolutionBackwardDataAlgorithm(handle, p->filter, p->y, p->conv, p->x, want, got, out);
      },
      [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, p->filter, p->y, p->conv, p->x, algo, bytes);
      },
      math, key.anyDeterminism, "the input gradient");
  p->backwardData = data.algo;
  p->backwardDataBytes = data.bytes;
  const auto filterAlgo = pickAlgorithm<cudnnConvolutionBwdFilterAlgoPerf_t>(
      [&](int want, int* got, cudnnConvolutionBwdFilterAlgoPerf_t* out) {
        return cudnnFindConvolutionBackwardFilterAlgorithm(handle, p->x, p->y, p->conv, p->filter, want, got, out);
      },
      [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, p->x, p->y, p->conv, p->filter, algo, bytes);
      },
      math, key.anyDeterminism, "the filter gradient");
  p->backwardFilter = filterAlgo.algo;
  p->backwardFilterBytes = filterAlgo.bytes;
  slot = std::move(p);
  return *slot;
}

/// A workspace of `bytes` from the caching allocator, released in stream order.
Tensor workspace(const KernelContext& ctx, size_t bytes) {
  return Tensor(i64, {static_cast<int64_t>((bytes + 7) / 8) + 1}, ctx.device);
}

/// cuDNN's alpha and beta: doubles for f64 data, floats otherwise (16-bit data included).
struct Scalars {
  float f[2] = {1, 0};
  double d[2] = {1, 0};
  const void* one(DType t) const { return t == f64 ? static_cast<const void*>(&d[0]) : &f[0]; }
  const void* zero(DType t) const { return t == f64 ? static_cast<const void*>(&d[1]) : &f[1]; }
};

cudnnHandle_t boundHandle(const KernelContext& ctx) {
  cudnnHandle_t h = handleFor(ctx.device.index);
  checkDnn(cudnnSetStream(h, streamOf(ctx)), "cudnnSetStream");
  return h;
}

void requireFloating(const KernelContext& ctx, DType t) {
  WEFT_CHECK(isFloating(t), "{}: cuDNN convolutions take f32, f64, bf16 or f16, got {}", ctx.node->describe(),
             dtypeName(t));
}

}  // namespace

// Inputs x (N, C, H, W), filter (O, C, KH, KW); output y (N, O, OH, OW).
void conv2d(KernelContext& ctx) {
  const Tensor &x = ctx.input(0), &filter = ctx.input(1);
  Tensor& y = ctx.output(0);
  requireFloating(ctx, x.dtype());
  if (y.numel() == 0) return;
  if (x.numel() == 0 || filter.numel() == 0) {  // sums over nothing (cuDNN takes no empty shapes)
    WEFT_CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, y.bytes(), streamOf(ctx)));
    return;
  }
  const ConvPlan& p = planFor(ctx, x.shape(), filter.shape());
  const Tensor space = workspace(ctx, p.forwardBytes);
  const Scalars s;
  checkDnn(cudnnConvolutionForward(boundHandle(ctx), s.one(x.dtype()), p.x, x.raw(), p.filter, filter.raw(), p.conv,
                                   p.forward, space.raw(), p.forwardBytes, s.zero(x.dtype()), p.y, y.raw()),
           "cudnnConvolutionForward");
}

// Inputs dy, filter, x; output dx.
void conv2dBackpropInput(KernelContext& ctx) {
  const Tensor &dy = ctx.input(0), &filter = ctx.input(1), &x = ctx.input(2);
  Tensor& dx = ctx.output(0);
  requireFloating(ctx, x.dtype());
  if (dx.numel() == 0) return;
  if (dy.numel() == 0) {
    WEFT_CUDA_CHECK(cudaMemsetAsync(dx.raw(), 0, dx.bytes(), streamOf(ctx)));
    return;
  }
  const ConvPlan& p = planFor(ctx, x.shape(), filter.shape());
  const Tensor space = workspace(ctx, p.backwardDataBytes);
  const Scalars s;
  checkDnn(
      cudnnConvolutionBackwardData(boundHandle(ctx), s.one(x.dtype()), p.filter, filter.raw(), p.y, dy.raw(), p.conv,
                                   p.backwardData, space.raw(), p.backwardDataBytes, s.zero(x.dtype()), p.x, dx.raw()),
      "cudnnConvolutionBackwardData");
}

// Inputs x, dy, filter; output dfilter.
void conv2dBackpropFilter(KernelContext& ctx) {
  const Tensor &x = ctx.input(0), &dy = ctx.input(1), &filter = ctx.input(2);
  Tensor& df = ctx.output(0);
  requireFloating(ctx, x.dtype());
  if (df.numel() == 0) return;
  if (dy.numel() == 0 || x.numel() == 0) {
    WEFT_CUDA_CHECK(cudaMemsetAsync(df.raw(), 0, df.bytes(), streamOf(ctx)));
    return;
  }
  const ConvPlan& p = planFor(ctx, x.shape(), filter.shape());
  const Tensor space = workspace(ctx, p.backwardFilterBytes);
  const Scalars s;
  checkDnn(cudnnConvolutionBackwardFilter(boundHandle(ctx), s.one(x.dtype()), p.x, x.raw(), p.y, dy.raw(), p.conv,
                                          p.backwardFilter, space.raw(), p.backwardFilterBytes, s.zero(x.dtype()),
                                          p.filter, df.raw()),
           "cudnnConvolutionBackwardFilter");
}

}  // namespace weft::cudaops
