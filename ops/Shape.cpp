// Layout ops: Reshape, ExpandDims, Squeeze, Transpose, Concat, Split, Slice, Pad,
// ReverseSequence, and the backward helpers that undo them using the forward input's run-time
// shape (ReshapeLike, ConcatGrad, SliceGrad, PadGrad).
#include "ops/OpUtil.h"
#include "ops/cuda/Kernels.h"

#include <fmt/ranges.h>

#include <cstring>
#include <numeric>

namespace weft {
namespace {

using detail::addOp1;

std::vector<int64_t> ints(const Attrs& a, const char* name) { return a.get<std::vector<int64_t>>(name); }

/// Row-major copy of a block: `outer` runs of `bytes` from src (stride srcStride) to dst.
void copyBlocks(const KernelContext& ctx, int64_t outer, size_t bytes, const char* src, size_t srcStride,
                char* dst, size_t dstStride) {
  ctx.parallelFor(outer, static_cast<int64_t>(bytes / 4 + 1), [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o) std::memcpy(dst + o * dstStride, src + o * srcStride, bytes);
  });
}

/// Product of dims [from, to).
int64_t prod(const Shape& s, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; ++i) p *= s[i];
  return p;
}

// ---- Reshape, ExpandDims, Squeeze: same bytes, new shape ---------------------------------

std::vector<TensorType> reshapeInfer(const InferContext& c) {
  std::vector<int64_t> dims = ints(c.attrs(), "shape");
  int unknown = -1;
  int64_t known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      c.check(unknown < 0, "at most one -1 in target shape {}", Shape(dims).str());
      unknown = static_cast<int>(i);
    } else {
      c.check(dims[i] >= 0, "invalid dimension {} in target shape", dims[i]);
      known *= dims[i];
    }
  }
  const int64_t n = c.shape(0).numel();
  if (unknown >= 0) {
    if (n >= 0) {
      c.check(known != 0 ? n % known == 0 : n == 0, "cannot reshape {} elements to {}", n, Shape(dims).str());
      dims[static_cast<size_t>(unknown)] = known != 0 ? n / known : 0;
    }
  } else {
    c.check(n < 0 || n == known, "cannot reshape {} elements to {}", n, Shape(dims).str());
  }
  return {{c.dtype(0), Shape(std::move(dims))}};
}

std::vector<TensorType> reshapeLikeInfer(const InferContext& c) {
  c.check(c.shape(0).numel() < 0 || c.shape(1).numel() < 0 || c.shape(0).numel() == c.shape(1).numel(),
          "element counts differ");
  return {{c.dtype(0), c.shape(1)}};
}

std::vector<TensorType> expandDimsInfer(const InferContext& c) {
  const int64_t a = c.attrs().getInt("axis");
  const int r = c.shape(0).rank();
  c.check(a >= -r - 1 && a <= r, "axis {} is out of range for rank {}", a, r);
  std::vector<int64_t> dims = c.shape(0).dims();
  dims.insert(dims.begin() + (a < 0 ? a + r + 1 : a), 1);
  return {{c.dtype(0), Shape(std::move(dims))}};
}

std::vector<TensorType> squeezeInfer(const InferContext& c) {
  const Shape& x = c.shape(0);
  const std::vector<int> axes = detail::normaliseAxes(c, ints(c.attrs(), "axes"), x.rank());
  std::vector<int64_t> dims;
  for (int i = 0; i < x.rank(); ++i) {
    if (std::find(axes.begin(), axes.end(), i) == axes.end()) {
      dims.push_back(x[i]);
    } else {
      c.check(x[i] == 1 || x[i] < 0, "cannot squeeze axis {} of size {}", i, x[i]);
    }
  }
  return {{c.dtype(0), Shape(std::move(dims))}};
}

std::vector<Grad> reshapeGrad(GradContext& c) {
  return {addOp1(c.graph(), "ReshapeLike", {c.dy(), c.x(0)})};
}

// ---- Transpose ---------------------------------------------------------------------------

std::vector<TensorType> transposeInfer(const InferContext& c) {
  const std::vector<int64_t> perm = ints(c.attrs(), "perm");
  const Shape& x = c.shape(0);
  c.check(static_cast<int>(perm.size()) == x.rank(), "permutation of length {} for rank {}", perm.size(), x.rank());
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    c.check(sorted[i] == static_cast<int64_t>(i), "[{}] is not a permutation", fmt::join(perm, ", "));
  }
  std::vector<int64_t> dims;
  for (int64_t p : perm) dims.push_back(x[static_cast<int>(p)]);
  return {{c.dtype(0), Shape(std::move(dims))}};
}

void transposeKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.output(0);
  const std::vector<int64_t> perm = ints(ctx.attrs(), "perm");
  const int r = x.rank();
  const std::vector<int64_t> inStrides = contiguousStrides(x.shape());
  std::vector<int64_t> srcStride(static_cast<size_t>(r));  // input stride of each output axis
  for (int i = 0; i < r; ++i)
    srcStride[static_cast<size_t>(i)] = inStrides[static_cast<size_t>(perm[static_cast<size_t>(i)])];
  const int64_t inner = r ? out.shape()[r - 1] : 1;
  const int64_t rows = inner ? out.numel() / inner : 0;
  const int64_t innerStride = r ? srcStride.back() : 1;
  dispatchDType(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* px = static_cast<const T*>(x.raw());
    T* po = static_cast<T*>(out.raw());
    ctx.parallelFor(rows, inner, [&](int64_t lo, int64_t hi) {
      for (int64_t row = lo; row < hi; ++row) {
        int64_t off = 0, rem = row;
        for (int d = r - 2; d >= 0; --d) {
          const int64_t n = out.shape()[d];
          off += (rem % n) * srcStride[static_cast<size_t>(d)];
          rem /= n;
        }
        T* o = po + row * inner;
        for (int64_t j = 0; j < inner; ++j) o[j] = px[off + j * innerStride];
      }
    });
  });
}

// ---- Concat and Split ---------------------------------------------------------------------

std::vector<TensorType> concatInfer(const InferContext& c) {
  const Shape& first = c.shape(0);
  c.check(first.rank() > 0, "cannot concatenate scalars");
  const int64_t a = c.attrs().getInt("axis");
  c.check(a >= -first.rank() && a < first.rank(), "axis {} is out of range for rank {}", a, first.rank());
  const int axis = static_cast<int>(a < 0 ? a + first.rank() : a);
  Shape out = first;
  for (int i = 1; i < c.numInputs(); ++i) {
    detail::requireSameDType(c, 0, i);
    const Shape& s = c.shape(i);
    c.check(s.rank() == first.rank(), "input {} has rank {}, input 0 rank {}", i, s.rank(), first.rank());
    for (int d = 0; d < s.rank(); ++d) {
      if (d == axis) {
        out[d] = (out[d] < 0 || s[d] < 0) ? -1 : out[d] + s[d];
      } else {
        c.check(s[d] < 0 || first[d] < 0 || s[d] == first[d], "input {} differs in dimension {}: {} vs {}", i, d,
                s[d], first[d]);
        if (out[d] < 0) out[d] = s[d];
      }
    }
  }
  return {{c.dtype(0), out}};
}

int concatAxis(const KernelContext& ctx, const Shape& s) { return s.axis(ctx.attrs().getInt("axis")); }

void concatKernel(KernelContext& ctx) {
  Tensor& out = ctx.output(0);
  const int axis = concatAxis(ctx, out.shape());
  const int64_t outer = prod(out.shape(), 0, axis);
  const size_t elem = dtypeSize(out.dtype());
  const size_t outRow = static_cast<size_t>(prod(out.shape(), axis, out.rank())) * elem;
  size_t offset = 0;
  for (int i = 0; i < ctx.numInputs(); ++i) {
    const Tensor& x = ctx.input(i);
    const size_t row = static_cast<size_t>(prod(x.shape(), axis, x.rank())) * elem;
    copyBlocks(ctx, outer, row, static_cast<const char*>(x.raw()), row, static_cast<char*>(out.raw()) + offset, outRow);
    offset += row;
  }
}

/// Outputs are the pieces of input 0 along `axis`, each the size of its matching output.
void splitPieces(KernelContext& ctx, const Tensor& x, int axis) {
  const int64_t outer = prod(x.shape(), 0, axis);
  const size_t elem = dtypeSize(x.dtype());
  const size_t inRow = static_cast<size_t>(prod(x.shape(), axis, x.rank())) * elem;
  size_t offset = 0;
  for (Tensor* piece : ctx.outputs) {
    const size_t row = static_cast<size_t>(prod(piece->shape(), axis, piece->rank())) * elem;
    copyBlocks(ctx, outer, row, static_cast<const char*>(x.raw()) + offset, inRow, static_cast<char*>(piece->raw()),
               row);
    offset += row;
  }
}

void splitKernel(KernelContext& ctx) { splitPieces(ctx, ctx.input(0), concatAxis(ctx, ctx.input(0).shape())); }

std::vector<TensorType> splitInfer(const InferContext& c) {
  const Shape& x = c.shape(0);
  const int64_t a = c.attrs().getInt("axis");
  c.check(a >= -x.rank() && a < x.rank(), "axis {} is out of range for rank {}", a, x.rank());
  const int axis = static_cast<int>(a < 0 ? a + x.rank() : a);
  std::vector<int64_t> sizes = ints(c.attrs(), "sizes");
  int64_t known = 0;
  int unknown = -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1) {
      c.check(unknown < 0, "at most one size may be -1");
      unknown = static_cast<int>(i);
    } else {
      c.check(sizes[i] >= 0, "invalid split size {}", sizes[i]);
      known += sizes[i];
    }
  }
  if (x[axis] >= 0) {
    if (unknown >= 0) {
      c.check(known <= x[axis], "split sizes {} exceed dimension {}", known, x[axis]);
      sizes[static_cast<size_t>(unknown)] = x[axis] - known;
    } else {
      c.check(known == x[axis], "split sizes sum to {}, dimension {} is {}", known, axis, x[axis]);
    }
  }
  std::vector<TensorType> out;
  for (int64_t s : sizes) {
    Shape piece = x;
    piece[axis] = s;
    out.push_back({c.dtype(0), piece});
  }
  return out;
}

// ConcatGrad(dy, x0, x1, ...): pieces of dy shaped like each x.
std::vector<TensorType> concatGradInfer(const InferContext& c) {
  return std::vector<TensorType>(c.inputs.begin() + 1, c.inputs.end());
}

void concatGradKernel(KernelContext& ctx) { splitPieces(ctx, ctx.input(0), concatAxis(ctx, ctx.input(0).shape())); }

// ---- Slice and Pad ------------------------------------------------------------------------

/// Begin and size of a slice of `x`, resolving size -1 ("to the end"); checks bounds if known.
std::pair<std::vector<int64_t>, std::vector<int64_t>> sliceBounds(const Shape& x, const Attrs& a,
                                                                  const std::function<void(const std::string&)>& fail) {
  std::vector<int64_t> begin = ints(a, "begin"), size = ints(a, "size");
  if (static_cast<int>(begin.size()) != x.rank() || static_cast<int>(size.size()) != x.rank()) {
    fail(fmt::format("begin and size need {} entries, got {} and {}", x.rank(), begin.size(), size.size()));
  }
  for (int d = 0; d < x.rank(); ++d) {
    const auto u = static_cast<size_t>(d);
    if (begin[u] < 0 || (x[d] >= 0 && begin[u] > x[d])) {
      fail(fmt::format("begin {} is out of range [0, {}] for axis {}", begin[u], x[d], d));
    }
    if (size[u] == -1) size[u] = x[d] < 0 ? -1 : x[d] - begin[u];
    if (size[u] < -1 || (x[d] >= 0 && begin[u] + size[u] > x[d])) {
      fail(fmt::format("slice [{}, {}) is out of range for axis {} of size {}", begin[u], begin[u] + size[u], d, x[d]));
    }
  }
  return {begin, size};
}

std::vector<TensorType> sliceInfer(const InferContext& c) {
  auto [begin, size] = sliceBounds(c.shape(0), c.attrs(), [&](const std::string& m) { c.failMessage(m); });
  return {{c.dtype(0), Shape(size)}};
}

/// Copies the box `small` (shape of the smaller tensor) between it and a larger tensor at
/// per-axis offsets `begin`; toSmall picks the direction.
void boxCopy(const KernelContext& ctx, const Tensor& large, const Tensor& small, const std::vector<int64_t>& begin,
             bool toSmall) {
  const int r = large.rank();
  if (small.numel() == 0) return;
  if (r == 0) {
    std::memcpy(toSmall ? small.raw() : large.raw(), toSmall ? large.raw() : small.raw(), dtypeSize(large.dtype()));
    return;
  }
  const std::vector<int64_t> ls = contiguousStrides(large.shape());
  const size_t elem = dtypeSize(large.dtype());
  const int64_t inner = small.shape()[r - 1];
  const int64_t rows = small.numel() / inner;
  ctx.parallelFor(rows, inner, [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      int64_t off = begin[static_cast<size_t>(r - 1)], rem = row;
      for (int d = r - 2; d >= 0; --d) {
        const int64_t n = small.shape()[d];
        off += (rem % n + begin[static_cast<size_t>(d)]) * ls[static_cast<size_t>(d)];
        rem /= n;
      }
      char* l = static_cast<char*>(large.raw()) + off * static_cast<int64_t>(elem);
      char* s = static_cast<char*>(small.raw()) + row * inner * static_cast<int64_t>(elem);
      std::memcpy(toSmall ? s : l, toSmall ? l : s, static_cast<size_t>(inner) * elem);
    }
  });
}

void sliceKernel(KernelContext& ctx) {
  auto [begin, size] =
      sliceBounds(ctx.input(0).shape(), ctx.attrs(), [&](const std::string& m) { ctx.failMessage(m); });
  boxCopy(ctx, ctx.input(0), ctx.output(0), begin, true);
}

// SliceGrad(dy, x): zeros shaped like x with dy at the slice.
void sliceGradKernel(KernelContext& ctx) {
  Tensor& out = ctx.output(0);
  out.fill(0);
  auto [begin, size] = sliceBounds(out.shape(), ctx.attrs(), [&](const std::string& m) { ctx.failMessage(m); });
  boxCopy(ctx, out, ctx.input(0), begin, false);
}

std::vector<int64_t> padBefore(const Attrs& a) {
  const std::vector<int64_t> p = ints(a, "paddings");
  std::vector<int64_t> before;
  for (size_t i = 0; i < p.size(); i += 2) before.push_back(p[i]);
  return before;
}

std::vector<TensorType> padInfer(const InferContext& c) {
  const std::vector<int64_t> p = ints(c.attrs(), "paddings");
  const Shape& x = c.shape(0);
  c.check(static_cast<int>(p.size()) == 2 * x.rank(), "paddings need 2 x rank = {} entries, got {}", 2 * x.rank(),
          p.size());
  Shape out = x;
  for (int d = 0; d < x.rank(); ++d) {
    c.check(p[2 * d] >= 0 && p[2 * d + 1] >= 0, "negative padding on axis {}", d);
    if (x[d] >= 0) out[d] = x[d] + p[2 * d] + p[2 * d + 1];
  }
  return {{c.dtype(0), out}};
}

void padKernel(KernelContext& ctx) {
  Tensor& out = ctx.output(0);
  out.fill(ctx.attrs().getFloat("value"));
  boxCopy(ctx, out, ctx.input(0), padBefore(ctx.attrs()), false);
}

// PadGrad(dy, x): the interior of dy, shaped like x.
void padGradKernel(KernelContext& ctx) { boxCopy(ctx, ctx.input(0), ctx.output(0), padBefore(ctx.attrs()), true); }

// ---- ReverseSequence ----------------------------------------------------------------------

std::vector<TensorType> reverseSequenceInfer(const InferContext& c) {
  const Shape& x = c.shape(0);
  const int64_t s = c.attrs().getInt("seq_axis"), b = c.attrs().getInt("batch_axis");
  c.check(s >= 0 && s < x.rank() && b >= 0 && b < x.rank() && s != b, "invalid seq_axis {} / batch_axis {} for rank {}",
          s, b, x.rank());
  c.check(isInteger(c.dtype(1)) && c.shape(1).rank() == 1, "lengths must be an integer vector");
  c.check(c.shape(1)[0] < 0 || x[static_cast<int>(b)] < 0 || c.shape(1)[0] == x[static_cast<int>(b)],
          "{} lengths for a batch of {}", c.shape(1)[0], x[static_cast<int>(b)]);
  return {c.inputs[0]};
}

void reverseSequenceKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.output(0);
  const int seqAxis = static_cast<int>(ctx.attrs().getInt("seq_axis"));
  const int batchAxis = static_cast<int>(ctx.attrs().getInt("batch_axis"));
  const int64_t seqLen = x.shape()[seqAxis];
  std::vector<int64_t> lengths(static_cast<size_t>(x.shape()[batchAxis]));
  dispatchIndex(ctx.input(1).dtype(), [&](auto z) {
    using I = decltype(z);
    const I* p = ctx.input(1).data<I>();
    for (size_t b = 0; b < lengths.size(); ++b) {
      if (p[b] < 0 || p[b] > seqLen)
        ctx.fail("length {} of sequence {} is outside [0, {}]", static_cast<int64_t>(p[b]), b, seqLen);
      lengths[b] = static_cast<int64_t>(p[b]);
    }
  });
  const std::vector<int64_t> strides = contiguousStrides(x.shape());
  const size_t elem = dtypeSize(x.dtype());
  const char* src = static_cast<const char*>(x.raw());
  char* dst = static_cast<char*>(out.raw());
  // Elements move in runs: the dimensions after both axes stay together.
  const int64_t run = strides[static_cast<size_t>(std::max(seqAxis, batchAxis))];
  const int64_t runs = run == 0 ? 0 : x.numel() / run;
  const auto bytes = static_cast<int64_t>(elem);
  ctx.parallelFor(runs, run + 8, [&](int64_t lo, int64_t hi) {
    for (int64_t q = lo; q < hi; ++q) {
      const int64_t i = q * run;
      const int64_t t = (i / strides[static_cast<size_t>(seqAxis)]) % seqLen;
      const int64_t b = (i / strides[static_cast<size_t>(batchAxis)]) % x.shape()[batchAxis];
      const int64_t len = lengths[static_cast<size_t>(b)];
      const int64_t j = t < len ? i + (len - 1 - 2 * t) * strides[static_cast<size_t>(seqAxis)] : i;
      std::memcpy(dst + i * bytes, src + j * bytes, static_cast<size_t>(run * bytes));
    }
  });
}

}  // namespace

// ---- builders -------------------------------------------------------------------------------

Output reshape(Output x, std::vector<int64_t> shape) {
  return addOp1(x.graph(), "Reshape", {x}, {{"shape", std::move(shape)}});
}
Output expandDims(Output x, int64_t axis) { return addOp1(x.graph(), "ExpandDims", {x}, {{"axis", axis}}); }
Output squeeze(Output x, std::vector<int64_t> axes) {
  return addOp1(x.graph(), "Squeeze", {x}, {{"axes", std::move(axes)}});
}
Output transpose(Output x, std::vector<int64_t> perm) {
  return addOp1(x.graph(), "Transpose", {x}, {{"perm", std::move(perm)}});
}
Output concat(const std::vector<Output>& xs, int64_t axis) {
  WEFT_CHECK(!xs.empty(), "concat of no tensors");
  if (xs.size() == 1) return xs[0];
  return addOp1(xs[0].graph(), "Concat", xs, {{"axis", axis}});
}
std::vector<Output> split(Output x, std::vector<int64_t> sizes, int64_t axis) {
  Node* n = detail::addOp(x.graph(), "Split", {x}, {{"sizes", std::move(sizes)}, {"axis", axis}});
  std::vector<Output> out;
  for (size_t i = 0; i < n->outputs.size(); ++i) out.push_back(n->output(static_cast<int>(i)));
  return out;
}
Output slice(Output x, std::vector<int64_t> begin, std::vector<int64_t> size) {
  return addOp1(x.graph(), "Slice", {x}, {{"begin", std::move(begin)}, {"size", std::move(size)}});
}
Output pad(Output x, std::vector<int64_t> paddings, double value) {
  return addOp1(x.graph(), "Pad", {x}, {{"paddings", std::move(paddings)}, {"value", value}});
}
Output reverseSequence(Output x, Output lengths, int64_t seqAxis, int64_t batchAxis) {
  return addOp1(x.graph(), "ReverseSequence", {x, lengths}, {{"seq_axis", seqAxis}, {"batch_axis", batchAxis}});
}

// ---- registration ---------------------------------------------------------------------------

void detail::registerShapeOps(OpRegistry& r) {
  r.add(OpDef("Reshape")
            .inputs(1)
            .infer(reshapeInfer)
            .cpu(detail::copyKernel)
            .cuda(WEFT_CUDA_KERNEL(copy))
            .view(0)
            .grad(reshapeGrad));
  r.add(OpDef("ExpandDims")
            .inputs(1)
            .infer(expandDimsInfer)
            .cpu(detail::copyKernel)
            .cuda(WEFT_CUDA_KERNEL(copy))
            .view(0)
            .grad(reshapeGrad));
  r.add(OpDef("Squeeze")
            .inputs(1)
            .infer(squeezeInfer)
            .cpu(detail::copyKernel)
            .cuda(WEFT_CUDA_KERNEL(copy))
            .view(0)
            .grad(reshapeGrad));
  r.add(OpDef("ReshapeLike")
            .inputs(2)
            .infer(reshapeLikeInfer)
            .cpu(detail::copyKernel)
            .cuda(WEFT_CUDA_KERNEL(copy))
            .view(0)
            .grad([](GradContext& c) -> std::vector<Grad> {
              return {addOp1(c.graph(), "ReshapeLike", {c.dy(), c.x(0)}), Grad()};
            }));
  r.add(OpDef("Transpose").inputs(1).infer(transposeInfer).cpu(transposeKernel).cuda(WEFT_CUDA_KERNEL(transpose))
            .grad([](GradContext& c) -> std::vector<Grad> {
              const std::vector<int64_t> perm = ints(c.attrs(), "perm");
              std::vector<int64_t> inverse(perm.size());
              for (size_t i = 0; i < perm.size(); ++i) inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
              return {transpose(c.dy(), inverse)};
            }));
  r.add(OpDef("Concat").inputs(1, -1).infer(concatInfer).cpu(concatKernel).cuda(WEFT_CUDA_KERNEL(concat))
            .grad([](GradContext& c) -> std::vector<Grad> {
              std::vector<Output> ins{c.dy()};
              for (const Output& x : c.node->inputs) ins.push_back(x);
              Node* g = detail::addOp(c.graph(), "ConcatGrad", ins, {{"axis", c.attrs().getInt("axis")}});
              std::vector<Grad> out;
              for (size_t i = 0; i < c.node->inputs.size(); ++i) out.emplace_back(g->output(static_cast<int>(i)));
              return out;
            }));
  r.add(OpDef("ConcatGrad")
            .inputs(2, -1)
            .infer(concatGradInfer)
            .cpu(concatGradKernel)
            .cuda(WEFT_CUDA_KERNEL(concatGrad))
            .noGradient());
  r.add(OpDef("Split").inputs(1).infer(splitInfer).cpu(splitKernel).cuda(WEFT_CUDA_KERNEL(split))
            .grad([](GradContext& c) -> std::vector<Grad> {
              std::vector<Output> pieces;
              for (size_t i = 0; i < c.node->outputs.size(); ++i) {
                pieces.push_back(c.dy(static_cast<int>(i)).valid() ? c.dy(static_cast<int>(i))
                                                                   : zerosLike(c.y(static_cast<int>(i))));
              }
              return {concat(pieces, c.attrs().getInt("axis"))};
            }));
  r.add(OpDef("Slice").inputs(1).infer(sliceInfer).cpu(sliceKernel).cuda(WEFT_CUDA_KERNEL(slice))
            .grad([](GradContext& c) -> std::vector<Grad> {
              return {addOp1(c.graph(), "SliceGrad", {c.dy(), c.x(0)}, c.attrs())};
            }));
  r.add(OpDef("SliceGrad")
            .inputs(2)
            .infer([](const InferContext& c) -> std::vector<TensorType> { return {c.inputs[1]}; })
            .cpu(sliceGradKernel)
            .cuda(WEFT_CUDA_KERNEL(sliceGrad))
            .noGradient());
  r.add(OpDef("Pad").inputs(1).infer(padInfer).cpu(padKernel).cuda(WEFT_CUDA_KERNEL(pad))
            .grad([](GradContext& c) -> std::vector<Grad> {
              return {addOp1(c.graph(), "PadGrad", {c.dy(), c.x(0)}, c.attrs())};
            }));
  r.add(OpDef("PadGrad").inputs(2).infer([](const InferContext& c) -> std::vector<TensorType> { return {c.inputs[1]}; })
            .cpu(padGradKernel).cuda(WEFT_CUDA_KERNEL(padGrad)).noGradient());
  // Reversing the same prefixes again undoes it, so the operation is its own adjoint.
  r.add(OpDef("ReverseSequence")
            .inputs(2)
            .infer(reverseSequenceInfer)
            .cpu(reverseSequenceKernel)
            .cuda(WEFT_CUDA_KERNEL(reverseSequence))
            .grad([](GradContext& c) -> std::vector<Grad> {
              return {reverseSequence(c.dy(), c.x(1), c.attrs().getInt("seq_axis"), c.attrs().getInt("batch_axis")),
                      Grad()};
            }));
}

}  // namespace weft
