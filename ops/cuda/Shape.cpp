// The CUDA kernels of the shape ops (ops/Shape.cpp defines them): each is one or more box copies
// (ops/cuda/Shape.cu) between strided views; Reshape and its kin are plain copies
// (ops/cuda/Elementwise.cpp).
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

#include <functional>
#include <vector>

namespace weft::cudaops {
namespace {

/// A strided view: dims of the box, the strides that walk it in some tensor, and where it starts.
struct View {
  BroadcastMap map;
  int64_t base = 0;
};

/// Walks a box of `dims` through a tensor with row-major strides `strides`, starting at `begin`
/// (per-axis offsets; empty: the origin).
View viewOf(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
            const std::vector<int64_t>& begin = {}) {
  WEFT_CHECK(dims.size() <= static_cast<size_t>(kMaxRank), "CUDA shape ops take tensors of rank up to {}, got {}",
             kMaxRank, dims.size());
  View v;
  v.map.rank = std::max<int>(static_cast<int>(dims.size()), 1);
  v.map.dims[0] = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    v.map.dims[d] = dims[d];
    v.map.strides[d] = strides[d];
    if (!begin.empty()) v.base += begin[d] * strides[d];
  }
  return v;
}

void copyBox(const KernelContext& ctx, DType dtype, const void* src, const View& from, void* dst, const View& to,
             int64_t n) {
  if (n == 0) return;
  WEFT_CUDA_CHECK(launch::boxCopy(dtypeSize(dtype), src, from.base, from.map, dst, to.base, to.map, n, streamOf(ctx)));
}

/// Copies `small` (whole) to or from the box of the same shape at `begin` in `large`.
void boxBetween(const KernelContext& ctx, const Tensor& large, const Tensor& small, const std::vector<int64_t>& begin,
                bool toSmall) {
  const std::vector<int64_t>& dims = small.shape().dims();
  const View inLarge = viewOf(dims, contiguousStrides(large.shape()), begin);
  const View inSmall = viewOf(dims, contiguousStrides(small.shape()));
  if (toSmall) copyBox(ctx, large.dtype(), large.raw(), inLarge, small.raw(), inSmall, small.numel());
  else copyBox(ctx, large.dtype(), small.raw(), inSmall, large.raw(), inLarge, small.numel());
}

/// Offsets of each piece along `axis` when tensors are cut into or joined from `pieces`.
void forEachPiece(const std::vector<const Tensor*>& pieces, int axis,
                  const std::function<void(const Tensor&, std::vector<int64_t>)>& f) {
  int64_t offset = 0;
  for (const Tensor* p : pieces) {
    std::vector<int64_t> begin(static_cast<size_t>(p->rank()), 0);
    begin[static_cast<size_t>(axis)] = offset;
    f(*p, begin);
    offset += p->shape()[axis];
  }
}

/// Outputs are the pieces of `x` along the op's axis.
void splitInto(KernelContext& ctx, const Tensor& x) {
  const int axis = x.shape().axis(ctx.attrs().getInt("axis"));
  std::vector<const Tensor*> pieces(ctx.outputs.begin(), ctx.outputs.end());
  forEachPiece(pieces, axis,
               [&](const Tensor& piece, std::vector<int64_t> begin) { boxBetween(ctx, x, piece, begin, true); });
}

std::vector<int64_t> ints(const KernelContext& ctx, const char* name) {
  return ctx.attrs().get<std::vector<int64_t>>(name);
}

/// The padding before each axis.
std::vector<int64_t> padBefore(const KernelContext& ctx) {
  const std::vector<int64_t> p = ints(ctx, "paddings");
  std::vector<int64_t> before;
  for (size_t i = 0; i < p.size(); i += 2) before.push_back(p[i]);
  return before;
}

}  // namespace

void transpose(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.output(0);
  const std::vector<int64_t> perm = ints(ctx, "perm");
  const std::vector<int64_t> inStrides = contiguousStrides(x.shape());
  std::vector<int64_t> walk;  // the input stride of each output axis
  for (int64_t p : perm) walk.push_back(inStrides[static_cast<size_t>(p)]);
  copyBox(ctx, x.dtype(), x.raw(), viewOf(out.shape().dims(), walk), out.raw(),
          viewOf(out.shape().dims(), contiguousStrides(out.shape())), out.numel());
}

void concat(KernelContext& ctx) {
  Tensor& out = ctx.output(0);
  const int axis = out.shape().axis(ctx.attrs().getInt("axis"));
  forEachPiece(ctx.inputs, axis,
               [&](const Tensor& piece, std::vector<int64_t> begin) { boxBetween(ctx, out, piece, begin, false); });
}

void split(KernelContext& ctx) { splitInto(ctx, ctx.input(0)); }
void concatGrad(KernelContext& ctx) { splitInto(ctx, ctx.input(0)); }

void slice(KernelContext& ctx) { boxBetween(ctx, ctx.input(0), ctx.output(0), ints(ctx, "begin"), true); }

void sliceGrad(KernelContext& ctx) {
  Tensor& out = ctx.output(0);
  if (out.bytes()) WEFT_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, out.bytes(), streamOf(ctx)));
  boxBetween(ctx, out, ctx.input(0), ints(ctx, "begin"), false);
}

void pad(KernelContext& ctx) {
  Tensor& out = ctx.output(0);
  fillOnDevice(ctx, out, ctx.attrs().getFloat("value"));
  boxBetween(ctx, out, ctx.input(0), padBefore(ctx), false);
}

void reverseSequence(KernelContext& ctx) {
  const Tensor &x = ctx.input(0), &lengths = ctx.input(1);
  const int seqAxis = static_cast<int>(ctx.attrs().getInt("seq_axis"));
  const int batchAxis = static_cast<int>(ctx.attrs().getInt("batch_axis"));
  const std::vector<int64_t> strides = contiguousStrides(x.shape());
  if (x.numel() == 0) return;
  dispatchIds(lengths.dtype(), [&](auto zi) {
    using I = decltype(zi);
    WEFT_CUDA_CHECK(launch::reverseSequence<I>(dtypeSize(x.dtype()), x.raw(), ctx.output(0).raw(), x.numel(),
                                               strides[static_cast<size_t>(seqAxis)], x.shape()[seqAxis],
                                               strides[static_cast<size_t>(batchAxis)], x.shape()[batchAxis],
                                               lengths.data<I>(), errorSink(ctx), streamOf(ctx)));
  });
}

void padGrad(KernelContext& ctx) { boxBetween(ctx, ctx.input(0), ctx.output(0), padBefore(ctx), true); }

}  // namespace weft::cudaops
