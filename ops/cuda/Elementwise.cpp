// The CUDA kernels of the elementwise ops (ops/Elementwise.cpp defines the ops): shape handling
// and dtype dispatch here, the device code in ops/cuda/Elementwise.cu.
#include "ops/ElementwiseFunctors.h"
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

#include <algorithm>

namespace weft::cudaops {

BroadcastMap broadcastMap(const Shape& out, const Shape& in) {
  WEFT_CHECK(out.rank() <= kMaxRank, "CUDA kernels broadcast tensors of rank up to {}, got shape {}", kMaxRank,
             out.str());
  BroadcastMap m;
  m.rank = std::max(out.rank(), 1);
  int64_t stride = 1;
  for (int d = m.rank - 1; d >= 0; --d) {
    const int outAxis = out.rank() - (m.rank - d), inAxis = in.rank() - (m.rank - d);
    const int64_t outDim = outAxis >= 0 ? out[outAxis] : 1;
    const int64_t inDim = inAxis >= 0 ? in[inAxis] : 1;
    m.dims[d] = outDim;
    m.strides[d] = (inDim == 1 && outDim != 1) ? 0 : stride;
    stride *= inDim;
  }
  return m;
}

void copyOnDevice(const KernelContext& ctx, const Tensor& src, Tensor& dst) {
  if (src.raw() == dst.raw() || src.bytes() == 0) return;
  WEFT_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.bytes(), cudaMemcpyDeviceToDevice, streamOf(ctx)));
}

namespace {

void unaryOp(KernelContext& ctx, launch::Unary op) {
  const Tensor& x = ctx.input(0);
  if (x.numel() == 0) return;
  dispatchFloatingOrHalf(x.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::unary<T>(op, x.data<T>(), ctx.output(0).data<T>(), x.numel(), streamOf(ctx)));
  });
}

void activationGradOp(KernelContext& ctx, launch::ActivationGrad op) {
  const int64_t n = ctx.output(0).numel();
  if (n == 0) return;
  dispatchFloatingOrHalf(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::activationGrad<T>(op, ctx.input(0).data<T>(), ctx.input(1).data<T>(),
                                              ctx.output(0).data<T>(), n, streamOf(ctx)));
  });
}

}  // namespace

template <class F>
void binary(KernelContext& ctx) {
  const Tensor &a = ctx.input(0), &b = ctx.input(1);
  Tensor& out = ctx.output(0);
  const int64_t n = out.numel();
  if (n == 0) return;
  const bool same = a.numel() == n && b.numel() == n;
  const BroadcastMap ma = same ? BroadcastMap{} : broadcastMap(out.shape(), a.shape());
  const BroadcastMap mb = same ? BroadcastMap{} : broadcastMap(out.shape(), b.shape());
  dispatchAllOrHalf(a.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::binary<F, T>(a.data<T>(), b.data<T>(), out.data<T>(), n, same ? nullptr : &ma,
                                         same ? nullptr : &mb, streamOf(ctx)));
  });
}
template void binary<functors::Add>(KernelContext&);
template void binary<functors::Sub>(KernelContext&);
template void binary<functors::Mul>(KernelContext&);
template void binary<functors::Max>(KernelContext&);
template void binary<functors::Min>(KernelContext&);
template void binary<functors::Pow>(KernelContext&);
template void binary<functors::Less>(KernelContext&);
template void binary<functors::LessEqual>(KernelContext&);
template void binary<functors::Greater>(KernelContext&);
template void binary<functors::GreaterEqual>(KernelContext&);
template void binary<functors::Equal>(KernelContext&);
template void binary<functors::NotEqual>(KernelContext&);

// Integer division by zero has no value; it is reported (naming the op) when the step ends.
void div(KernelContext& ctx) {
  const Tensor& b = ctx.input(1);
  if (isInteger(b.dtype()) && b.numel()) {
    dispatchIds(b.dtype(), [&](auto z) {
      using T = decltype(z);
      WEFT_CUDA_CHECK(launch::checkDivisors<T>(b.data<T>(), b.numel(), errorSink(ctx), streamOf(ctx)));
    });
  }
  binary<functors::Div>(ctx);
}

void neg(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Neg); }
void exp(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Exp); }
void log(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Log); }
void tanh(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Tanh); }
void sigmoid(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Sigmoid); }
void relu(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Relu); }
void sqrt(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Sqrt); }
void rsqrt(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Rsqrt); }
void abs(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Abs); }
void square(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Square); }
void reciprocal(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Reciprocal); }
void sign(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Sign); }
void sin(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Sin); }
void cos(KernelContext& ctx) { unaryOp(ctx, launch::Unary::Cos); }
void reluGrad(KernelContext& ctx) { activationGradOp(ctx, launch::ActivationGrad::Relu); }
void sigmoidGrad(KernelContext& ctx) { activationGradOp(ctx, launch::ActivationGrad::Sigmoid); }
void tanhGrad(KernelContext& ctx) { activationGradOp(ctx, launch::ActivationGrad::Tanh); }

void where(KernelContext& ctx) {
  Tensor& out = ctx.output(0);
  const int64_t n = out.numel();
  if (n == 0) return;
  const BroadcastMap mc = broadcastMap(out.shape(), ctx.input(0).shape());
  const BroadcastMap ma = broadcastMap(out.shape(), ctx.input(1).shape());
  const BroadcastMap mb = broadcastMap(out.shape(), ctx.input(2).shape());
  dispatchAll(out.dtype(), [&](auto z) {
    using T = decltype(z);
    dispatchAll(ctx.input(0).dtype(), [&](auto zc) {
      using C = decltype(zc);
      WEFT_CUDA_CHECK(launch::where<C, T>(ctx.input(0).data<C>(), ctx.input(1).data<T>(), ctx.input(2).data<T>(),
                                          out.data<T>(), n, mc, ma, mb, streamOf(ctx)));
    });
  });
}

void castOnDevice(const KernelContext& ctx, const Tensor& from, Tensor& to) {
  WEFT_CHECK(from.numel() == to.numel(), "castOnDevice: {} elements into {}", from.numel(), to.numel());
  if (from.numel() == 0) return;
  dispatchStorage(from.dtype(), [&](auto zs) {
    using S = decltype(zs);
    dispatchStorage(to.dtype(), [&](auto zd) {
      using D = decltype(zd);
      WEFT_CUDA_CHECK(launch::cast<S, D>(from.data<S>(), to.data<D>(), from.numel(), streamOf(ctx)));
    });
  });
}

void cast(KernelContext& ctx) { castOnDevice(ctx, ctx.input(0), ctx.output(0)); }

// One pass over every input (launch::kMaxAddends at a time), summed in input order as on the CPU.
void addN(KernelContext& ctx) {
  Tensor& out = ctx.output(0);
  const int64_t n = out.numel();
  if (n == 0) return;
  dispatchAllOrHalf(out.dtype(), [&](auto z) {
    using T = decltype(z);
    for (int first = 0; first < ctx.numInputs(); first += launch::kMaxAddends) {
      launch::Addends addends{};
      addends.count = std::min(launch::kMaxAddends, ctx.numInputs() - first);
      for (int k = 0; k < addends.count; ++k) addends.x[k] = ctx.input(first + k).raw();
      WEFT_CUDA_CHECK(launch::addN<T>(addends, out.data<T>(), n, first > 0, streamOf(ctx)));
    }
  });
}

void copy(KernelContext& ctx) { copyOnDevice(ctx, ctx.input(0), ctx.output(0)); }

void zeros(KernelContext& ctx) {
  Tensor& out = ctx.output(0);
  if (out.bytes()) WEFT_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, out.bytes(), streamOf(ctx)));
}

void ones(KernelContext& ctx) { fillOnDevice(ctx, ctx.output(0), 1.0); }

void broadcastLike(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.output(0);
  if (out.numel() == 0) return;
  const BroadcastMap m = broadcastMap(out.shape(), x.shape());
  dispatchAll(x.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::spread<T>(x.data<T>(), out.data<T>(), out.numel(), m, 1.0, streamOf(ctx)));
  });
}

}  // namespace weft::cudaops
