// The CUDA kernels of the fused LSTM and GRU ops (ops/Rnn.cpp defines the ops and the formulas):
// matrix products through cuBLAS (ops/cuda/Blas.h), the gate math of each step in
// ops/cuda/Rnn.cu, laid out exactly as the CPU kernels lay it out.
#include "ops/cuda/Blas.h"
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

namespace weft::cudaops {
namespace {

/// out (cols) = the sum of the rows of src (rows, cols).
template <class T>
void columnSums(const KernelContext& ctx, int64_t rows, int64_t cols, const T* src, T* dst) {
  if (cols == 0) return;
  ReducePlan plan;
  plan.kept.rank = 1;
  plan.kept.dims[0] = cols;
  plan.kept.strides[0] = 1;
  plan.reduced.rank = 1;
  plan.reduced.dims[0] = std::max<int64_t>(rows, 1);
  plan.reduced.strides[0] = cols;
  plan.outputs = cols;
  plan.count = rows;
  WEFT_CUDA_CHECK(launch::reduce<T>(Reduction::Sum, src, dst, plan, streamOf(ctx)));
}

template <class T>
void copyDevice(const KernelContext& ctx, const T* src, T* dst, int64_t n) {
  if (n && src != dst) {
    WEFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(T), cudaMemcpyDeviceToDevice, streamOf(ctx)));
  }
}

}  // namespace

void lstm(KernelContext& ctx) {
  dispatchFloating(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const Shape& xs = ctx.input(0).shape();
    const int64_t steps = xs[0], batch = xs[1], input = xs[2], hidden = ctx.input(1).shape()[1];
    const int64_t g4 = 4 * hidden, state = batch * hidden;
    const T *h0 = ctx.in<T>(1), *c0 = ctx.in<T>(2), *wh = ctx.in<T>(4), *bias = ctx.in<T>(5);
    T *y = ctx.out<T>(0), *gates = ctx.out<T>(3), *cells = ctx.out<T>(4);
    // The input projection of every step at once: gates (T*B, 4H) = x (T*B, I) wx (I, 4H).
    gemm<T>(ctx, false, false, steps * batch, g4, input, ctx.in<T>(0), input, ctx.in<T>(3), g4, T(0), gates, g4);
    for (int64_t t = 0; t < steps; ++t) {
      const T* hPrev = t == 0 ? h0 : y + (t - 1) * state;
      const T* cPrev = t == 0 ? c0 : cells + (t - 1) * state;
      T* gt = gates + t * batch * g4;
      gemm<T>(ctx, false, false, batch, g4, hidden, hPrev, hidden, wh, g4, T(1), gt, g4);
      if (state) {
        WEFT_CUDA_CHECK(launch::lstmStep<T>(batch, hidden, bias, cPrev, gt, cells + t * state, y + t * state,
                                            streamOf(ctx)));
      }
    }
    copyDevice<T>(ctx, steps == 0 ? h0 : y + (steps - 1) * state, ctx.out<T>(1), state);
    copyDevice<T>(ctx, steps == 0 ? c0 : cells + (steps - 1) * state, ctx.out<T>(2), state);
  });
}

// With dG (T*B, 4H) the pre-activation gate gradients of every step and dh_{t-1} = dG_t wh^T:
//   dx = dG wx^T;  dwx = x^T dG;  dwh = sum_t h_{t-1}^T dG_t;  db = sum of dG's rows.
void lstmGrad(KernelContext& ctx) {
  dispatchFloating(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const Shape& xs = ctx.input(0).shape();
    const int64_t steps = xs[0], batch = xs[1], input = xs[2], hidden = ctx.input(1).shape()[1];
    const int64_t g4 = 4 * hidden, state = batch * hidden, rows = steps * batch;
    const T *x = ctx.in<T>(0), *h0 = ctx.in<T>(1), *c0 = ctx.in<T>(2), *wx = ctx.in<T>(3),
            *wh = ctx.in<T>(4), *gates = ctx.in<T>(5), *cells = ctx.in<T>(6), *y = ctx.in<T>(7),
            *dy = ctx.in<T>(8);
    T *dh = ctx.out<T>(1), *dc = ctx.out<T>(2), *dwh = ctx.out<T>(4);
    copyDevice<T>(ctx, ctx.in<T>(9), dh, state);
    copyDevice<T>(ctx, ctx.in<T>(10), dc, state);
    const Tensor dGatesTensor(ctx.input(0).dtype(), {std::max<int64_t>(rows * g4, 1)}, ctx.device);  // (T, B, 4H)
    T* dGates = dGatesTensor.data<T>();
    for (int64_t t = steps - 1; t >= 0; --t) {
      const T* cPrev = t == 0 ? c0 : cells + (t - 1) * state;
      T* dg = dGates + t * batch * g4;
      if (state) {
        WEFT_CUDA_CHECK(launch::lstmStepGrad<T>(batch, hidden, gates + t * batch * g4, cells + t * state, cPrev,
                                                dy + t * state, dh, dc, dg, streamOf(ctx)));
      }
      gemm<T>(ctx, false, true, batch, hidden, g4, dg, g4, wh, g4, T(0), dh, hidden);
    }
    gemm<T>(ctx, false, true, rows, input, g4, dGates, g4, wx, g4, T(0), ctx.out<T>(0), input);
    gemm<T>(ctx, true, false, input, g4, rows, x, input, dGates, g4, T(0), ctx.out<T>(3), g4);
    if (steps == 0) {
      if (ctx.output(4).bytes()) WEFT_CUDA_CHECK(cudaMemsetAsync(dwh, 0, ctx.output(4).bytes(), streamOf(ctx)));
    } else {
      gemm<T>(ctx, true, false, hidden, g4, batch, h0, hidden, dGates, g4, T(0), dwh, g4);
      gemm<T>(ctx, true, false, hidden, g4, rows - batch, y, hidden, dGates + batch * g4, g4, T(1), dwh, g4);
    }
    columnSums<T>(ctx, rows, g4, dGates, ctx.out<T>(5));
  });
}

void gruCell(KernelContext& ctx) {
  dispatchFloating(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const int64_t batch = ctx.input(0).shape()[0], input = ctx.input(0).shape()[1];
    const int64_t hidden = ctx.input(1).shape()[1], g3 = 3 * hidden;
    const T *h = ctx.in<T>(1), *wh = ctx.in<T>(3);
    T *gates = ctx.out<T>(1), *hn = ctx.out<T>(2);
    // gates = x wx; gates[:, r and z] += h wh[:, r and z]; hn = h wh[:, n] (n needs it apart).
    gemm<T>(ctx, false, false, batch, g3, input, ctx.in<T>(0), input, ctx.in<T>(2), g3, T(0), gates, g3);
    gemm<T>(ctx, false, false, batch, 2 * hidden, hidden, h, hidden, wh, g3, T(1), gates, g3);
    gemm<T>(ctx, false, false, batch, hidden, hidden, h, hidden, wh + 2 * hidden, g3, T(0), hn, hidden);
    if (batch * hidden) {
      WEFT_CUDA_CHECK(launch::gruCell<T>(batch, hidden, ctx.in<T>(4), ctx.in<T>(5), h, gates, hn, ctx.out<T>(0),
                                         streamOf(ctx)));
    }
  });
}

void gruCellGrad(KernelContext& ctx) {
  dispatchFloating(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const int64_t batch = ctx.input(0).shape()[0], input = ctx.input(0).shape()[1];
    const int64_t hidden = ctx.input(1).shape()[1], g3 = 3 * hidden;
    const T *x = ctx.in<T>(0), *h = ctx.in<T>(1), *wx = ctx.in<T>(2), *wh = ctx.in<T>(3);
    T* dh = ctx.out<T>(1);
    const Tensor scratch(ctx.input(0).dtype(), {std::max<int64_t>(2 * batch * g3, 1)}, ctx.device);
    T *dGx = scratch.data<T>(), *dGh = dGx + batch * g3;
    if (batch * hidden) {
      WEFT_CUDA_CHECK(launch::gruCellGrad<T>(batch, hidden, ctx.in<T>(4), ctx.in<T>(5), h, ctx.in<T>(6), dGx, dGh,
                                             dh, streamOf(ctx)));
    }
    gemm<T>(ctx, false, true, batch, input, g3, dGx, g3, wx, g3, T(0), ctx.out<T>(0), input);
    gemm<T>(ctx, false, true, batch, hidden, g3, dGh, g3, wh, g3, T(1), dh, hidden);
    gemm<T>(ctx, true, false, input, g3, batch, x, input, dGx, g3, T(0), ctx.out<T>(2), g3);
    gemm<T>(ctx, true, false, hidden, g3, batch, h, hidden, dGh, g3, T(0), ctx.out<T>(3), g3);
    columnSums<T>(ctx, batch, g3, dGx, ctx.out<T>(4));
    columnSums<T>(ctx, batch, g3, dGh, ctx.out<T>(5));
  });
}

}  // namespace weft::cudaops
