// Fused recurrent layers: a whole-sequence LSTM and a GRU cell. Each is one forward op that also
// outputs the activations its backward needs, plus one fused backward op (BPTT for the LSTM).
// Matrix products go through OpenBLAS (single-threaded calls split across weft's pool); the
// pointwise gate math runs on Eigen arrays so that sigmoid and tanh vectorise.
#include "ops/OpUtil.h"
#include "ops/cuda/Kernels.h"

#include <Eigen/Core>
#include <cblas.h>

#include <algorithm>

namespace weft {
namespace {

using detail::addOp;

template <class T>
using Vec = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using ConstVec = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// ---- matrix helpers ------------------------------------------------------------------------

/// C (m x n) = op(A) op(B) + beta C, row-major, as one single-threaded BLAS call.
template <class T>
void blasGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
              int64_t ldb, T beta, T* c, int64_t ldc) {
  const auto opA = ta ? CblasTrans : CblasNoTrans, opB = tb ? CblasTrans : CblasNoTrans;
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, opA, opB, i(m), i(n), i(k), 1.0f, a, i(lda), b, i(ldb), beta, c, i(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, opA, opB, i(m), i(n), i(k), 1.0, a, i(lda), b, i(ldb), beta, c, i(ldc));
  }
}

/// The same product with C split into blocks of rows (or columns, when wider than tall) across
/// the pool. A (m x k) is stored k x m when ta; B (k x n) is stored n x k when tb.
template <class T>
void gemm(const KernelContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == T(0)) {
      for (int64_t r = 0; r < m; ++r) std::fill(c + r * ldc, c + r * ldc + n, T(0));
    }
    return;
  }
  const bool splitRows = m >= n;
  const int64_t extent = splitRows ? m : n;
  const int64_t align = 16;  // keep blocks a multiple of the kernels' register tiles
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(ctx.pool->numThreads(), extent / align));
  const int64_t per = (extent + blocks - 1) / blocks;
  ctx.parallelFor(blocks, m * n * k / blocks, [&](int64_t lo, int64_t hi) {
    for (int64_t blk = lo; blk < hi; ++blk) {
      const int64_t begin = blk * per, len = std::min(extent, begin + per) - begin;
      if (len <= 0) continue;
      if (splitRows) {
        blasGemm(ta, tb, len, n, k, ta ? a + begin : a + begin * lda, lda, b, ldb, beta, c + begin * ldc, ldc);
      } else {
        blasGemm(ta, tb, m, len, k, a, lda, tb ? b + begin * ldb : b + begin, ldb, beta, c + begin, ldc);
      }
    }
  });
}

/// out (cols) = sum over the rows of src (rows, cols), split by columns across the pool.
template <class T>
void columnSums(const KernelContext& ctx, int64_t rows, int64_t cols, const T* src, T* out) {
  ctx.parallelFor(cols, rows, [&](int64_t lo, int64_t hi) {
    std::fill(out + lo, out + hi, T(0));
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = src + r * cols;
      for (int64_t j = lo; j < hi; ++j) out[j] += row[j];
    }
  });
}

/// Calls f(row, col, len) over contiguous spans covering a (rows, cols) grid, in parallel:
/// the pointwise gate math works on spans of one batch row's hidden units.
template <class F>
void forEachSpan(const KernelContext& ctx, int64_t rows, int64_t cols, int64_t cost, F f) {
  ctx.parallelFor(rows * cols, cost, [&](int64_t lo, int64_t hi) {
    for (int64_t idx = lo; idx < hi;) {
      const int64_t r = idx / cols, j = idx % cols, len = std::min(cols - j, hi - idx);
      f(r, j, len);
      idx += len;
    }
  });
}

// ---- shape functions -----------------------------------------------------------------------

/// Where an RNN op's inputs sit and what they are called in messages.
struct RnnLayout {
  int gates;                 // 4 (LSTM) or 3 (GRU)
  int xRank;                 // 3: x is (T, B, I); 2: x is (B, I)
  std::vector<int> states;   // inputs shaped (B, H)
  int wx, wh;                // (I, gates*H), (H, gates*H)
  std::vector<int> biases;   // inputs shaped (gates*H)
  std::vector<const char*> names;
};

struct RnnDims {
  int64_t batch, input, hidden;  // -1 where unknown
};

int64_t firstKnown(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) {
    if (d >= 0) return d;
  }
  return -1;
}

int64_t times(int64_t k, int64_t d) { return d < 0 ? -1 : k * d; }

/// H from a dimension that should be gates*H (-1 when unknown).
int64_t hiddenFrom(const InferContext& c, const RnnLayout& l, int input, int axis) {
  const int64_t d = c.shape(input)[axis];
  if (d < 0) return -1;
  c.check(d % l.gates == 0, "{}'s dimension {} ({}) must be {}H, a multiple of {}", l.names[input], axis, d,
          l.gates, l.gates);
  return d / l.gates;
}

void expectShape(const InferContext& c, const RnnLayout& l, int input, const std::string& form,
                 const Shape& expected) {
  c.check(c.shape(input).compatibleWith(expected), "{} must be {} = {}, got {}", l.names[input], form,
          expected.str(), c.shape(input).str());
}

/// Checks dtypes, ranks and the agreement of B, I and H across the inputs.
RnnDims checkRnnInputs(const InferContext& c, const RnnLayout& l) {
  detail::requireFloat(c, 0);
  for (int i = 1; i < c.numInputs(); ++i) detail::requireSameDType(c, 0, i);
  auto requireRank = [&](int i, int rank) {
    c.check(c.shape(i).rank() == rank, "{} must have rank {}, got shape {}", l.names[i], rank, c.shape(i).str());
  };
  requireRank(0, l.xRank);
  for (int s : l.states) requireRank(s, 2);
  requireRank(l.wx, 2);
  requireRank(l.wh, 2);
  for (int b : l.biases) requireRank(b, 1);

  const Shape& x = c.shape(0);
  RnnDims d{x[l.xRank - 2], x[l.xRank - 1], -1};
  for (int s : l.states) d.batch = firstKnown({d.batch, c.shape(s)[0]});
  for (int s : l.states) d.hidden = firstKnown({d.hidden, c.shape(s)[1]});
  d.hidden = firstKnown({d.hidden, c.shape(l.wh)[0], hiddenFrom(c, l, l.wh, 1), hiddenFrom(c, l, l.wx, 1)});
  for (int b : l.biases) d.hidden = firstKnown({d.hidden, hiddenFrom(c, l, b, 0)});

  const int64_t gh = times(l.gates, d.hidden);
  const std::string ghName = fmt::format("{}H", l.gates);
  for (int s : l.states) expectShape(c, l, s, "(B, H)", {d.batch, d.hidden});
  expectShape(c, l, l.wx, fmt::format("(I, {})", ghName), {d.input, gh});
  expectShape(c, l, l.wh, fmt::format("(H, {})", ghName), {d.hidden, gh});
  for (int b : l.biases) expectShape(c, l, b, fmt::format("({})", ghName), {gh});
  return d;
}

const RnnLayout kLstmLayout{4, 3, {1, 2}, 3, 4, {5}, {"x", "h0", "c0", "wx", "wh", "b"}};
const RnnLayout kGruLayout{3, 2, {1}, 2, 3, {4, 5}, {"x", "h", "wx", "wh", "bx", "bh"}};

// outputs: y (T, B, H), hLast (B, H), cLast (B, H), gates (T, B, 4H) after activation,
// cells (T, B, H)
std::vector<TensorType> lstmInfer(const InferContext& c) {
  const RnnDims d = checkRnnInputs(c, kLstmLayout);
  const int64_t steps = c.shape(0)[0];
  const DType t = c.dtype(0);
  return {{t, {steps, d.batch, d.hidden}},
          {t, {d.batch, d.hidden}},
          {t, {d.batch, d.hidden}},
          {t, {steps, d.batch, times(4, d.hidden)}},
          {t, {steps, d.batch, d.hidden}}};
}

// inputs: x, h0, c0, wx, wh, gates, cells, y, dy, dhLast, dcLast
// outputs: dx, dh0, dc0, dwx, dwh, db, shaped like x, h0, c0, wx, wh, b
std::vector<TensorType> lstmGradInfer(const InferContext& c) {
  c.check(c.shape(8).compatibleWith(c.shape(7)) && c.shape(9).compatibleWith(c.shape(1)) &&
              c.shape(10).compatibleWith(c.shape(2)),
          "output gradients must match y, hLast and cLast");
  return {c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4], {c.dtype(0), {c.shape(4)[1]}}};
}

// outputs: h' (B, H), gates (B, 3H) holding r, z, n after activation, hn = h wh_n + bh_n (B, H)
std::vector<TensorType> gruCellInfer(const InferContext& c) {
  const RnnDims d = checkRnnInputs(c, kGruLayout);
  const DType t = c.dtype(0);
  return {{t, {d.batch, d.hidden}}, {t, {d.batch, times(3, d.hidden)}}, {t, {d.batch, d.hidden}}};
}

// inputs: x, h, wx, wh, gates, hn, dh'
// outputs: dx, dh, dwx, dwh, dbx, dbh, shaped like x, h, wx, wh, bx, bh
std::vector<TensorType> gruCellGradInfer(const InferContext& c) {
  c.check(c.shape(6).compatibleWith(c.shape(1)), "the output gradient must match h");
  const TensorType bias{c.dtype(0), {c.shape(3)[1]}};
  return {c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], bias, bias};
}

// ---- LSTM kernels --------------------------------------------------------------------------

/// One step's gate math. `gates` (B, 4H) holds x_t wx + h_{t-1} wh without the bias on entry
/// and the activations i, f, g, o on exit; c = f c_{t-1} + i g; h = o tanh(c).
template <class T>
void lstmStep(const KernelContext& ctx, int64_t batch, int64_t hidden, const T* bias, const T* cPrev,
              T* gates, T* c, T* h) {
  forEachSpan(ctx, batch, hidden, 40, [&](int64_t r, int64_t j, int64_t len) {
    T* g = gates + r * 4 * hidden + j;
    Vec<T> gi(g, len), gf(g + hidden, len), gg(g + 2 * hidden, len), go(g + 3 * hidden, len);
    gi = (gi + ConstVec<T>(bias + j, len)).logistic();
    gf = (gf + ConstVec<T>(bias + hidden + j, len)).logistic();
    gg = (gg + ConstVec<T>(bias + 2 * hidden + j, len)).tanh();
    go = (go + ConstVec<T>(bias + 3 * hidden + j, len)).logistic();
    const int64_t at = r * hidden + j;
    Vec<T> cv(c + at, len);
    cv = gf * ConstVec<T>(cPrev + at, len) + gi * gg;
    Vec<T>(h + at, len) = go * cv.tanh();
  });
}

void lstmKernel(KernelContext& ctx) {
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const Shape& xs = ctx.input(0).shape();
    const int64_t steps = xs[0], batch = xs[1], input = xs[2], hidden = ctx.input(1).shape()[1];
    const int64_t g4 = 4 * hidden, state = batch * hidden;
    const T *h0 = ctx.in<T>(1), *c0 = ctx.in<T>(2), *wh = ctx.in<T>(4), *bias = ctx.in<T>(5);
    T *y = ctx.out<T>(0), *gates = ctx.out<T>(3), *cells = ctx.out<T>(4);
    // The input projection of every step at once: gates (T*B, 4H) = x (T*B, I) wx (I, 4H).
    gemm(ctx, false, false, steps * batch, g4, input, ctx.in<T>(0), input, ctx.in<T>(3), g4, T(0), gates, g4);
    for (int64_t t = 0; t < steps; ++t) {
      const T* hPrev = t == 0 ? h0 : y + (t - 1) * state;
      const T* cPrev = t == 0 ? c0 : cells + (t - 1) * state;
      T* gt = gates + t * batch * g4;
      gemm(ctx, false, false, batch, g4, hidden, hPrev, hidden, wh, g4, T(1), gt, g4);
      lstmStep(ctx, batch, hidden, bias, cPrev, gt, cells + t * state, y + t * state);
    }
    const T* hLast = steps == 0 ? h0 : y + (steps - 1) * state;
    const T* cLast = steps == 0 ? c0 : cells + (steps - 1) * state;
    std::copy(hLast, hLast + state, ctx.out<T>(1));
    std::copy(cLast, cLast + state, ctx.out<T>(2));
  });
}

/// One step of BPTT through the cell. On entry dh and dc hold the gradients reaching h_t and c_t
/// from later steps (dh without dy_t); on exit dc holds the gradient reaching c_{t-1} and dh is
/// spent. Writes the pre-activation gate gradients to dGates (B, 4H):
///   dh += dy_t;  dc += dh o (1 - tanh(c)^2)
///   di = dc g i (1 - i);  df = dc c_{t-1} f (1 - f);  dg = dc i (1 - g^2)
///   do = dh tanh(c) o (1 - o);  dc_{t-1} = dc f
template <class T>
void lstmStepGrad(const KernelContext& ctx, int64_t batch, int64_t hidden, const T* gates, const T* c,
                  const T* cPrev, const T* dy, T* dh, T* dc, T* dGates) {
  forEachSpan(ctx, batch, hidden, 40, [&](int64_t r, int64_t j, int64_t len) {
    const int64_t at = r * hidden + j, gAt = r * 4 * hidden + j;
    const T* g = gates + gAt;
    ConstVec<T> gi(g, len), gf(g + hidden, len), gg(g + 2 * hidden, len), go(g + 3 * hidden, len);
    T* d = dGates + gAt;
    Vec<T> di(d, len), df(d + hidden, len), dg(d + 2 * hidden, len), dout(d + 3 * hidden, len);
    Vec<T> dhv(dh + at, len), dcv(dc + at, len);
    dout = ConstVec<T>(c + at, len).tanh();  // tanh(c), replaced by do below
    dhv += ConstVec<T>(dy + at, len);
    dcv += dhv * go * (1 - dout.square());
    di = dcv * gg * gi * (1 - gi);
    df = dcv * ConstVec<T>(cPrev + at, len) * gf * (1 - gf);
    dg = dcv * gi * (1 - gg.square());
    dout = dhv * dout * go * (1 - go);
    dcv *= gf;
  });
}

// With dG (T*B, 4H) the pre-activation gate gradients of every step and dh_{t-1} = dG_t wh^T:
//   dx = dG wx^T;  dwx = x^T dG;  dwh = sum_t h_{t-1}^T dG_t;  db = sum of dG's rows.
void lstmGradKernel(KernelContext& ctx) {
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const Shape& xs = ctx.input(0).shape();
    const int64_t steps = xs[0], batch = xs[1], input = xs[2], hidden = ctx.input(1).shape()[1];
    const int64_t g4 = 4 * hidden, state = batch * hidden, rows = steps * batch;
    const T *x = ctx.in<T>(0), *h0 = ctx.in<T>(1), *c0 = ctx.in<T>(2), *wx = ctx.in<T>(3),
            *wh = ctx.in<T>(4), *gates = ctx.in<T>(5), *cells = ctx.in<T>(6), *y = ctx.in<T>(7),
            *dy = ctx.in<T>(8);
    // dh0 and dc0 carry the running gradients of h_t and c_t back through the steps.
    T *dh = ctx.out<T>(1), *dc = ctx.out<T>(2), *dwh = ctx.out<T>(4);
    std::copy(ctx.in<T>(9), ctx.in<T>(9) + state, dh);
    std::copy(ctx.in<T>(10), ctx.in<T>(10) + state, dc);
    std::vector<T> dGates(static_cast<size_t>(rows * g4));  // (T, B, 4H)
    for (int64_t t = steps - 1; t >= 0; --t) {
      const T* cPrev = t == 0 ? c0 : cells + (t - 1) * state;
      T* dg = dGates.data() + t * batch * g4;
      lstmStepGrad(ctx, batch, hidden, gates + t * batch * g4, cells + t * state, cPrev, dy + t * state, dh,
                   dc, dg);
      gemm(ctx, false, true, batch, hidden, g4, static_cast<const T*>(dg), g4, wh, g4, T(0), dh, hidden);
    }
    const T* dG = dGates.data();
    gemm(ctx, false, true, rows, input, g4, dG, g4, wx, g4, T(0), ctx.out<T>(0), input);
    gemm(ctx, true, false, input, g4, rows, x, input, dG, g4, T(0), ctx.out<T>(3), g4);
    if (steps == 0) {
      ctx.output(4).fill(0);
    } else {
      gemm(ctx, true, false, hidden, g4, batch, h0, hidden, dG, g4, T(0), dwh, g4);
      gemm(ctx, true, false, hidden, g4, rows - batch, y, hidden, dG + batch * g4, g4, T(1), dwh, g4);
    }
    columnSums(ctx, rows, g4, dG, ctx.out<T>(5));
  });
}

// ---- GRU kernels ---------------------------------------------------------------------------

void gruCellKernel(KernelContext& ctx) {
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const int64_t batch = ctx.input(0).shape()[0], input = ctx.input(0).shape()[1];
    const int64_t hidden = ctx.input(1).shape()[1], g3 = 3 * hidden;
    const T *h = ctx.in<T>(1), *wh = ctx.in<T>(3), *bx = ctx.in<T>(4), *bh = ctx.in<T>(5);
    T *hNew = ctx.out<T>(0), *gates = ctx.out<T>(1), *hn = ctx.out<T>(2);
    // gates = x wx; gates[:, r and z] += h wh[:, r and z]; hn = h wh[:, n] (n needs it apart).
    gemm(ctx, false, false, batch, g3, input, ctx.in<T>(0), input, ctx.in<T>(2), g3, T(0), gates, g3);
    gemm(ctx, false, false, batch, 2 * hidden, hidden, h, hidden, wh, g3, T(1), gates, g3);
    gemm(ctx, false, false, batch, hidden, hidden, h, hidden, wh + 2 * hidden, g3, T(0), hn, hidden);
    forEachSpan(ctx, batch, hidden, 40, [&](int64_t r, int64_t j, int64_t len) {
      T* g = gates + r * g3 + j;
      Vec<T> gr(g, len), gz(g + hidden, len), gn(g + 2 * hidden, len);
      const int64_t at = r * hidden + j;
      Vec<T> hnv(hn + at, len);
      gr = (gr + ConstVec<T>(bx + j, len) + ConstVec<T>(bh + j, len)).logistic();
      gz = (gz + ConstVec<T>(bx + hidden + j, len) + ConstVec<T>(bh + hidden + j, len)).logistic();
      hnv += ConstVec<T>(bh + 2 * hidden + j, len);
      gn = (gn + ConstVec<T>(bx + 2 * hidden + j, len) + gr * hnv).tanh();
      Vec<T>(hNew + at, len) = (1 - gz) * gn + gz * ConstVec<T>(h + at, len);
    });
  });
}

// With dh' the output gradient and a_* the pre-activations:
//   da_n = dh' (1 - z) (1 - n^2);  da_z = dh' (h - n) z (1 - z);  da_r = da_n hn r (1 - r)
//   dGx = [da_r, da_z, da_n] (gradient of x wx + bx);  dGh = [da_r, da_z, da_n r] (of h wh + bh)
//   dx = dGx wx^T;  dwx = x^T dGx;  dbx = rows of dGx summed;  likewise for h, wh, bh, plus
//   dh += dh' z for h's direct path.
void gruCellGradKernel(KernelContext& ctx) {
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const int64_t batch = ctx.input(0).shape()[0], input = ctx.input(0).shape()[1];
    const int64_t hidden = ctx.input(1).shape()[1], g3 = 3 * hidden;
    const T *x = ctx.in<T>(0), *h = ctx.in<T>(1), *wx = ctx.in<T>(2), *wh = ctx.in<T>(3),
            *gates = ctx.in<T>(4), *hn = ctx.in<T>(5), *dhNew = ctx.in<T>(6);
    T* dh = ctx.out<T>(1);
    std::vector<T> scratch(static_cast<size_t>(2 * batch * g3));
    T *dGx = scratch.data(), *dGh = scratch.data() + batch * g3;
    forEachSpan(ctx, batch, hidden, 20, [&](int64_t r, int64_t j, int64_t len) {
      const T* g = gates + r * g3 + j;
      ConstVec<T> gr(g, len), gz(g + hidden, len), gn(g + 2 * hidden, len);
      const int64_t at = r * hidden + j;
      ConstVec<T> dho(dhNew + at, len), hv(h + at, len);
      Vec<T> dxr(dGx + r * g3 + j, len), dxz(dxr.data() + hidden, len), dxn(dxr.data() + 2 * hidden, len);
      Vec<T> dhr(dGh + r * g3 + j, len), dhz(dhr.data() + hidden, len), dhn(dhr.data() + 2 * hidden, len);
      dxn = dho * (1 - gz) * (1 - gn.square());
      dxz = dho * (hv - gn) * gz * (1 - gz);
      dxr = dxn * ConstVec<T>(hn + at, len) * gr * (1 - gr);
      dhr = dxr;
      dhz = dxz;
      dhn = dxn * gr;
      Vec<T>(dh + at, len) = dho * gz;
    });
    const T *cdGx = dGx, *cdGh = dGh;
    gemm(ctx, false, true, batch, input, g3, cdGx, g3, wx, g3, T(0), ctx.out<T>(0), input);
    gemm(ctx, false, true, batch, hidden, g3, cdGh, g3, wh, g3, T(1), dh, hidden);
    gemm(ctx, true, false, input, g3, batch, x, input, cdGx, g3, T(0), ctx.out<T>(2), g3);
    gemm(ctx, true, false, hidden, g3, batch, h, hidden, cdGh, g3, T(0), ctx.out<T>(3), g3);
    columnSums(ctx, batch, g3, cdGx, ctx.out<T>(4));
    columnSums(ctx, batch, g3, cdGh, ctx.out<T>(5));
  });
}

// ---- gradients -----------------------------------------------------------------------------

/// The gradient of forward output i, zeros where none flows (e.g. y unused, only hLast).
Output outputGrad(GradContext& c, int i) { return c.dy(i).valid() ? c.dy(i) : zerosLike(c.y(i)); }

std::vector<Grad> lstmGrad(GradContext& c) {
  Node* n = addOp(c.graph(), "LSTMGrad",
                  {c.x(0), c.x(1), c.x(2), c.x(3), c.x(4), c.y(3), c.y(4), c.y(0), outputGrad(c, 0),
                   outputGrad(c, 1), outputGrad(c, 2)});
  return {n->output(0), n->output(1), n->output(2), n->output(3), n->output(4), n->output(5)};
}

std::vector<Grad> gruCellGrad(GradContext& c) {
  Node* n = addOp(c.graph(), "GRUCellGrad", {c.x(0), c.x(1), c.x(2), c.x(3), c.y(1), c.y(2), outputGrad(c, 0)});
  return {n->output(0), n->output(1), n->output(2), n->output(3), n->output(4), n->output(5)};
}

}  // namespace

LstmOutputs lstm(Output x, Output h0, Output c0, Output wx, Output wh, Output b) {
  Node* n = addOp(x.graph(), "LSTM", {x, h0, c0, wx, wh, b});
  return {n->output(0), n->output(1), n->output(2)};
}

Output gruCell(Output x, Output h, Output wx, Output wh, Output bx, Output bh) {
  return addOp(x.graph(), "GRUCell", {x, h, wx, wh, bx, bh})->output(0);
}

void detail::registerRnnOps(OpRegistry& r) {
  r.add(OpDef("LSTM").inputs(6).infer(lstmInfer).cpu(lstmKernel).cuda(WEFT_CUDA_KERNEL(lstm)).grad(lstmGrad));
  r.add(OpDef("LSTMGrad").inputs(11).infer(lstmGradInfer).cpu(lstmGradKernel).cuda(WEFT_CUDA_KERNEL(lstmGrad)).noGradient());
  r.add(OpDef("GRUCell").inputs(6).infer(gruCellInfer).cpu(gruCellKernel).cuda(WEFT_CUDA_KERNEL(gruCell)).grad(gruCellGrad));
  r.add(OpDef("GRUCellGrad").inputs(7).infer(gruCellGradInfer).cpu(gruCellGradKernel).cuda(WEFT_CUDA_KERNEL(gruCellGrad)).noGradient());
}

}  // namespace weft
