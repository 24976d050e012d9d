// The order of work of the fused recurrent ops (LSTM, LSTMGrad and its two halves, GRUCell,
// GRUCellGrad), shared by their CPU kernels (ops/Rnn.cpp) and CUDA kernels (ops/cuda/Rnn.cpp),
// which differ only in how they multiply matrices and run the gate math. Formulas and layouts are documented in
// ops/Rnn.cpp. A backend for element type T provides:
//   gemm(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc)  row-major C = op(A) op(B) + beta C
//   pack(tb, k, n, b, ldb): op(B) prepared for many products (the recurrent weight, used at
//     every step); gemm(m, a, lda, packed, beta, c, ldc) multiplies A (m x k) by it
//   lstmStep(batch, hidden, bias, cPrev, gates, c, h)
//   lstmStepGrad(batch, hidden, gates, c, cPrev, dy, dh, dc, dGates)
//   gruStep(batch, hidden, bx, bh, h, gates, hn, hNew)
//   gruStepGrad(batch, hidden, gates, hn, h, dhNew, dGx, dGh, dh)
//   copy(src, dst, n), zero(dst, n), columnSums(rows, cols, src, dst)
//   scratch(n): n elements that live until the op returns
#pragma once

#include "core/OpRegistry.h"

namespace weft::rnn {

// Inputs x (T, B, I), h0, c0, wx, wh, b; outputs y, hLast, cLast, gates (T, B, 4H), cells.
template <class T, class Backend>
void lstmForward(const KernelContext& ctx, Backend& be) {
  const Shape& xs = ctx.input(0).shape();
  const int64_t steps = xs[0], batch = xs[1], input = xs[2], hidden = ctx.input(1).shape()[1];
  const int64_t g4 = 4 * hidden, state = batch * hidden;
  const T *h0 = ctx.in<T>(1), *c0 = ctx.in<T>(2), *wh = ctx.in<T>(4), *bias = ctx.in<T>(5);
  T *y = ctx.out<T>(0), *gates = ctx.out<T>(3), *cells = ctx.out<T>(4);
  // The input projection of every step at once: gates (T*B, 4H) = x (T*B, I) wx (I, 4H).
  be.gemm(false, false, steps * batch, g4, input, ctx.in<T>(0), input, ctx.in<T>(3), g4, T(0), gates, g4);
  const auto recurrent = be.pack(false, hidden, g4, wh, g4);
  for (int64_t t = 0; t < steps; ++t) {
    const T* hPrev = t == 0 ? h0 : y + (t - 1) * state;
    const T* cPrev = t == 0 ? c0 : cells + (t - 1) * state;
    T* gt = gates + t * batch * g4;
    be.gemm(batch, hPrev, hidden, recurrent, T(1), gt, g4);
    be.lstmStep(batch, hidden, bias, cPrev, gt, cells + t * state, y + t * state);
  }
  be.copy(steps == 0 ? h0 : y + (steps - 1) * state, ctx.out<T>(1), state);
  be.copy(steps == 0 ? c0 : cells + (steps - 1) * state, ctx.out<T>(2), state);
}

// Inputs x, h0, c0, wx, wh, gates, cells, y, dy, dhLast, dcLast (LSTMGrad's). The pass back
// through time: dh0 and dc0 into outputs 1 and 2, dx into output 0, and dG (T*B, 4H), the
// pre-activation gate gradients of every step, with dh_{t-1} = dG_t wh^T and dx = dG wx^T.
template <class T, class Backend>
void lstmGatesBackward(const KernelContext& ctx, Backend& be, T* dG) {
  const Shape& xs = ctx.input(0).shape();
  const int64_t steps = xs[0], batch = xs[1], input = xs[2], hidden = ctx.input(1).shape()[1];
  const int64_t g4 = 4 * hidden, state = batch * hidden, rows = steps * batch;
  const T *c0 = ctx.in<T>(2), *wx = ctx.in<T>(3), *wh = ctx.in<T>(4), *gates = ctx.in<T>(5), *cells = ctx.in<T>(6),
          *dy = ctx.in<T>(8);
  // dh0 and dc0 carry the running gradients of h_t and c_t back through the steps.
  T *dh = ctx.out<T>(1), *dc = ctx.out<T>(2);
  be.copy(ctx.in<T>(9), dh, state);
  be.copy(ctx.in<T>(10), dc, state);
  const auto recurrentT = be.pack(true, g4, hidden, wh, g4);
  for (int64_t t = steps - 1; t >= 0; --t) {
    const T* cPrev = t == 0 ? c0 : cells + (t - 1) * state;
    T* dg = dG + t * batch * g4;
    be.lstmStepGrad(batch, hidden, gates + t * batch * g4, cells + t * state, cPrev, dy + t * state, dh, dc, dg);
    be.gemm(batch, dg, g4, recurrentT, T(0), dh, hidden);
  }
  be.gemm(false, true, rows, input, g4, dG, g4, wx, g4, T(0), ctx.out<T>(0), input);
}

// The weight gradients from dG (steps of `batch` rows):  dwx = x^T dG;  dwh = sum_t h_{t-1}^T dG_t
// (h_{-1} = h0, h_t = y_t);  db = rows of dG summed.
template <class T, class Backend>
void lstmWeightProducts(Backend& be, int64_t steps, int64_t batch, int64_t input, int64_t hidden, const T* x,
                        const T* h0, const T* y, const T* dG, T* dwx, T* dwh, T* db) {
  const int64_t g4 = 4 * hidden, rows = steps * batch;
  be.gemm(true, false, input, g4, rows, x, input, dG, g4, T(0), dwx, g4);
  if (steps == 0) {
    be.zero(dwh, hidden * g4);
  } else {
    be.gemm(true, false, hidden, g4, batch, h0, hidden, dG, g4, T(0), dwh, g4);
    be.gemm(true, false, hidden, g4, rows - batch, y, hidden, dG + batch * g4, g4, T(1), dwh, g4);
  }
  be.columnSums(rows, g4, dG, db);
}

// LSTMGrad: inputs as lstmGatesBackward's; outputs dx, dh0, dc0, dwx, dwh, db.
template <class T, class Backend>
void lstmBackward(const KernelContext& ctx, Backend& be) {
  const Shape& xs = ctx.input(0).shape();
  const int64_t steps = xs[0], batch = xs[1], input = xs[2], hidden = ctx.input(1).shape()[1];
  T* dG = be.scratch(steps * batch * 4 * hidden);  // (T, B, 4H)
  lstmGatesBackward<T>(ctx, be, dG);
  lstmWeightProducts<T>(be, steps, batch, input, hidden, ctx.in<T>(0), ctx.in<T>(1), ctx.in<T>(7), dG,
                        ctx.out<T>(3), ctx.out<T>(4), ctx.out<T>(5));
}

// LSTMInputGrad: LSTMGrad without the weight gradients, which a pipeline's zero-bubble schedule
// runs apart (LSTMWeightGrad); outputs dx, dh0, dc0 and dG (T, B, 4H).
template <class T, class Backend>
void lstmInputBackward(const KernelContext& ctx, Backend& be) {
  lstmGatesBackward<T>(ctx, be, ctx.out<T>(3));
}

// LSTMWeightGrad: inputs x (T, B, I), h0 (B, H), y (T, B, H), dG (T, B, 4H); outputs dwx, dwh, db.
template <class T, class Backend>
void lstmWeightBackward(const KernelContext& ctx, Backend& be) {
  const Shape& xs = ctx.input(0).shape();
  lstmWeightProducts<T>(be, xs[0], xs[1], xs[2], ctx.input(1).shape()[1], ctx.in<T>(0), ctx.in<T>(1),
                        ctx.in<T>(2), ctx.in<T>(3), ctx.out<T>(0), ctx.out<T>(1), ctx.out<T>(2));
}

// Inputs x (B, I), h, wx, wh, bx, bh; outputs h', gates (B, 3H), hn (B, H).
template <class T, class Backend>
void gruForward(const KernelContext& ctx, Backend& be) {
  const int64_t batch = ctx.input(0).shape()[0], input = ctx.input(0).shape()[1];
  const int64_t hidden = ctx.input(1).shape()[1], g3 = 3 * hidden;
  const T *h = ctx.in<T>(1), *wh = ctx.in<T>(3);
  T *gates = ctx.out<T>(1), *hn = ctx.out<T>(2);
  // gates = x wx; gates[:, r and z] += h wh[:, r and z]; hn = h wh[:, n] (n needs it apart).
  be.gemm(false, false, batch, g3, input, ctx.in<T>(0), input, ctx.in<T>(2), g3, T(0), gates, g3);
  be.gemm(false, false, batch, 2 * hidden, hidden, h, hidden, wh, g3, T(1), gates, g3);
  be.gemm(false, false, batch, hidden, hidden, h, hidden, wh + 2 * hidden, g3, T(0), hn, hidden);
  be.gruStep(batch, hidden, ctx.in<T>(4), ctx.in<T>(5), h, gates, hn, ctx.out<T>(0));
}

// Inputs x, h, wx, wh, gates, hn, dh'; outputs dx, dh, dwx, dwh, dbx, dbh. With dGx and dGh the
// gradients of x wx + bx and h wh + bh:  dx = dGx wx^T;  dwx = x^T dGx;  dbx = rows of dGx
// summed; likewise for h, wh, bh, plus h's direct path dh' z (written by the step).
template <class T, class Backend>
void gruGatesBackward(const KernelContext& ctx, Backend& be, T* dGx, T* dGh) {
  const int64_t batch = ctx.input(0).shape()[0], input = ctx.input(0).shape()[1];
  const int64_t hidden = ctx.input(1).shape()[1], g3 = 3 * hidden;
  T* dh = ctx.out<T>(1);
  be.gruStepGrad(batch, hidden, ctx.in<T>(4), ctx.in<T>(5), ctx.in<T>(1), ctx.in<T>(6), dGx, dGh, dh);
  be.gemm(false, true, batch, input, g3, dGx, g3, ctx.in<T>(2), g3, T(0), ctx.out<T>(0), input);
  be.gemm(false, true, batch, hidden, g3, dGh, g3, ctx.in<T>(3), g3, T(1), dh, hidden);
}

template <class T, class Backend>
void gruWeightProducts(Backend& be, int64_t batch, int64_t input, int64_t hidden, const T* x, const T* h,
                       const T* dGx, const T* dGh, T* dwx, T* dwh, T* dbx, T* dbh) {
  const int64_t g3 = 3 * hidden;
  be.gemm(true, false, input, g3, batch, x, input, dGx, g3, T(0), dwx, g3);
  be.gemm(true, false, hidden, g3, batch, h, hidden, dGh, g3, T(0), dwh, g3);
  be.columnSums(batch, g3, dGx, dbx);
  be.columnSums(batch, g3, dGh, dbh);
}

template <class T, class Backend>
void gruBackward(const KernelContext& ctx, Backend& be) {
  const int64_t batch = ctx.input(0).shape()[0], input = ctx.input(0).shape()[1];
  const int64_t hidden = ctx.input(1).shape()[1], g3 = 3 * hidden;
  T* dGx = be.scratch(2 * batch * g3);
  T* dGh = dGx + batch * g3;
  gruGatesBackward<T>(ctx, be, dGx, dGh);
  gruWeightProducts<T>(be, batch, input, hidden, ctx.in<T>(0), ctx.in<T>(1), dGx, dGh, ctx.out<T>(2),
                       ctx.out<T>(3), ctx.out<T>(4), ctx.out<T>(5));
}

// GRUCellInputGrad: GRUCellGrad without the weight gradients (GRUCellWeightGrad); outputs dx,
// dh, dGx and dGh (B, 3H).
template <class T, class Backend>
void gruInputBackward(const KernelContext& ctx, Backend& be) {
  gruGatesBackward<T>(ctx, be, ctx.out<T>(2), ctx.out<T>(3));
}

// GRUCellWeightGrad: inputs x (B, I), h (B, H), dGx, dGh (B, 3H); outputs dwx, dwh, dbx, dbh.
template <class T, class Backend>
void gruWeightBackward(const KernelContext& ctx, Backend& be) {
  gruWeightProducts<T>(be, ctx.input(0).shape()[0], ctx.input(0).shape()[1], ctx.input(1).shape()[1], ctx.in<T>(0),
                       ctx.in<T>(1), ctx.in<T>(2), ctx.in<T>(3), ctx.out<T>(0), ctx.out<T>(1), ctx.out<T>(2),
                       ctx.out<T>(3));
}

}  // namespace weft::rnn
