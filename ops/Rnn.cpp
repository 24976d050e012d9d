// Fused recurrent layers: a whole-sequence LSTM and a GRU cell. Each is one forward op that also
// outputs the activations its backward needs, plus one fused backward op (BPTT for the LSTM).
// Matrix products go through ops/Blas.h (single-threaded calls split across weft's pool; the
// recurrent weight packed once per op); the pointwise gate math runs on Eigen arrays so that
// sigmoid and tanh vectorise. Built in a scope that rounds in products
// (Graph::MixedOps::RoundInProducts), an op and its gradient carry "round_operands_to" as MatMul
// does: every product rounds its f32 operands to bf16 or f16 and sums in f32; the gate math and
// the states stay f32.
#include "ops/Blas.h"
#include "ops/OpUtil.h"
#include "ops/RnnSequence.h"
#include "ops/cuda/Kernels.h"

#include <Eigen/Core>

#include <algorithm>
#include <memory>

namespace weft {
namespace {

using detail::addOp;

template <class T>
using Vec = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using ConstVec = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// ---- matrix helpers ------------------------------------------------------------------------

/// out (cols) = sum over the rows of src (rows, cols), split by columns across the pool.
template <class T>
void sumColumns(const KernelContext& ctx, int64_t rows, int64_t cols, const T* src, T* out) {
  ctx.parallelFor(cols, rows, [&](int64_t lo, int64_t hi) {
    std::fill(out + lo, out + hi, T(0));
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = src + r * cols;
      for (int64_t j = lo; j < hi; ++j) out[j] += row[j];
    }
  });
}

/// Calls f(row) for each row of a step's (rows, hidden) gate math, in parallel. A row is never
/// cut: Eigen runs the tail of a span, and its head up to an aligned address, in scalar code that
/// may round differently from its vector code (in double), so cuts that moved with the thread
/// count would move the results.
template <class F>
void forEachRow(const KernelContext& ctx, int64_t rows, int64_t hidden, int64_t costPerUnit, F f) {
  ctx.parallelFor(rows, hidden * costPerUnit, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) f(r);
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
  detail::checkProductRounding(c);
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
  detail::checkProductRounding(c);
  c.check(c.shape(8).compatibleWith(c.shape(7)) && c.shape(9).compatibleWith(c.shape(1)) &&
              c.shape(10).compatibleWith(c.shape(2)),
          "output gradients must match y, hLast and cLast");
  return {c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4], {c.dtype(0), {c.shape(4)[1]}}};
}

// LSTMInputGrad: LSTMGrad's inputs; outputs dx, dh0, dc0, and dG (T, B, 4H), the gates'
// gradients, from which LSTMWeightGrad (inputs x, h0, y, dG) makes dwx, dwh, db: LSTMGrad in two
// ops, so that a pipeline's zero-bubble schedule can run the weight gradients apart.
std::vector<TensorType> lstmInputGradInfer(const InferContext& c) {
  std::vector<TensorType> out = lstmGradInfer(c);
  const Shape& x = c.shape(0);
  out.resize(3);
  out.push_back({c.dtype(0), {x[0], x[1], c.shape(3)[1]}});
  return out;
}

std::vector<TensorType> lstmWeightGradInfer(const InferContext& c) {
  detail::checkProductRounding(c);
  const Shape &x = c.shape(0), &h0 = c.shape(1), &y = c.shape(2), &dG = c.shape(3);
  c.check(x.rank() == 3 && h0.rank() == 2 && y.rank() == 3 && dG.rank() == 3,
          "x, h0, y and dG must be (T, B, I), (B, H), (T, B, H) and (T, B, 4H)");
  c.check(y.compatibleWith(Shape{x[0], x[1], h0[1]}) && dG.compatibleWith(Shape{x[0], x[1], times(4, h0[1])}),
          "y {} and dG {} do not fit x {} and h0 {}", y.str(), dG.str(), x.str(), h0.str());
  const DType t = c.dtype(0);
  return {{t, {x[2], dG[2]}}, {t, {h0[1], dG[2]}}, {t, {dG[2]}}};
}

// outputs: h' (B, H), gates (B, 3H) holding r, z, n after activation, hn = h wh_n + bh_n (B, H)
std::vector<TensorType> gruCellInfer(const InferContext& c) {
  const RnnDims d = checkRnnInputs(c, kGruLayout);
  detail::checkProductRounding(c);
  const DType t = c.dtype(0);
  return {{t, {d.batch, d.hidden}}, {t, {d.batch, times(3, d.hidden)}}, {t, {d.batch, d.hidden}}};
}

// inputs: x, h, wx, wh, gates, hn, dh'
// outputs: dx, dh, dwx, dwh, dbx, dbh, shaped like x, h, wx, wh, bx, bh
std::vector<TensorType> gruCellGradInfer(const InferContext& c) {
  detail::checkProductRounding(c);
  c.check(c.shape(6).compatibleWith(c.shape(1)), "the output gradient must match h");
  const TensorType bias{c.dtype(0), {c.shape(3)[1]}};
  return {c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], bias, bias};
}

// GRUCellInputGrad: GRUCellGrad's inputs; outputs dx, dh, and dGx, dGh (B, 3H), the gradients of
// x wx + bx and h wh + bh, from which GRUCellWeightGrad (inputs x, h, dGx, dGh) makes dwx, dwh,
// dbx, dbh: GRUCellGrad in two ops, as LSTMGrad.
std::vector<TensorType> gruCellInputGradInfer(const InferContext& c) {
  std::vector<TensorType> out = gruCellGradInfer(c);
  const TensorType gates{c.dtype(0), {c.shape(0)[0], c.shape(3)[1]}};
  return {out[0], out[1], gates, gates};
}

std::vector<TensorType> gruCellWeightGradInfer(const InferContext& c) {
  detail::checkProductRounding(c);
  const Shape &x = c.shape(0), &h = c.shape(1), &dGx = c.shape(2), &dGh = c.shape(3);
  c.check(x.rank() == 2 && h.rank() == 2 && dGx.rank() == 2 && dGh.rank() == 2,
          "x, h, dGx and dGh must be (B, I), (B, H), (B, 3H) and (B, 3H)");
  const Shape gates{x[0], times(3, h[1])};
  c.check(h.compatibleWith(Shape{x[0], h[1]}) && dGx.compatibleWith(gates) && dGh.compatibleWith(gates),
          "h {}, dGx {} and dGh {} do not fit x {}", h.str(), dGx.str(), dGh.str(), x.str());
  const DType t = c.dtype(0);
  const TensorType bias{t, {gates[1]}};
  return {{t, {x[1], gates[1]}}, {t, {h[1], gates[1]}}, bias, bias};
}

// ---- LSTM kernels --------------------------------------------------------------------------

/// One step's gate math. `gates` (B, 4H) holds x_t wx + h_{t-1} wh without the bias on entry
/// and the activations i, f, g, o on exit; c = f c_{t-1} + i g; h = o tanh(c).
template <class T>
void lstmGateStep(const KernelContext& ctx, int64_t batch, int64_t hidden, const T* bias, const T* cPrev,
              T* gates, T* c, T* h) {
  const int64_t len = hidden;
  forEachRow(ctx, batch, hidden, 40, [&](int64_t r) {
    T* g = gates + r * 4 * hidden;
    Vec<T> gi(g, len), gf(g + hidden, len), gg(g + 2 * hidden, len), go(g + 3 * hidden, len);
    gi = (gi + ConstVec<T>(bias, len)).logistic();
    gf = (gf + ConstVec<T>(bias + hidden, len)).logistic();
    gg = (gg + ConstVec<T>(bias + 2 * hidden, len)).tanh();
    go = (go + ConstVec<T>(bias + 3 * hidden, len)).logistic();
    const int64_t at = r * hidden;
    Vec<T> cv(c + at, len);
    cv = gf * ConstVec<T>(cPrev + at, len) + gi * gg;
    Vec<T>(h + at, len) = go * cv.tanh();
  });
}

/// One step of BPTT through the cell. On entry dh and dc hold the gradients reaching h_t and c_t
/// from later steps (dh without dy_t); on exit dc holds the gradient reaching c_{t-1} and dh is
/// spent. Writes the pre-activation gate gradients to dGates (B, 4H):
///   dh += dy_t;  dc += dh o (1 - tanh(c)^2)
///   di = dc g i (1 - i);  df = dc c_{t-1} f (1 - f);  dg = dc i (1 - g^2)
///   do = dh tanh(c) o (1 - o);  dc_{t-1} = dc f
template <class T>
void lstmGateStepGrad(const KernelContext& ctx, int64_t batch, int64_t hidden, const T* gates, const T* c,
                  const T* cPrev, const T* dy, T* dh, T* dc, T* dGates) {
  const int64_t len = hidden;
  forEachRow(ctx, batch, hidden, 40, [&](int64_t r) {
    const int64_t at = r * hidden, gAt = r * 4 * hidden;
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

// ---- GRU kernels ---------------------------------------------------------------------------

/// The gate math of one GRU step: gates (B, 3H) hold x wx with h wh added on r and z on entry
/// and r, z, n on exit; hn (B, H) holds h wh_n on entry and + bh_n on exit.
template <class T>
void gruGateStep(const KernelContext& ctx, int64_t batch, int64_t hidden, const T* bx, const T* bh, const T* h,
                 T* gates, T* hn, T* hNew) {
  const int64_t g3 = 3 * hidden;
  const int64_t len = hidden;
  forEachRow(ctx, batch, hidden, 40, [&](int64_t r) {
    T* g = gates + r * g3;
    Vec<T> gr(g, len), gz(g + hidden, len), gn(g + 2 * hidden, len);
    const int64_t at = r * hidden;
    Vec<T> hnv(hn + at, len);
    gr = (gr + ConstVec<T>(bx, len) + ConstVec<T>(bh, len)).logistic();
    gz = (gz + ConstVec<T>(bx + hidden, len) + ConstVec<T>(bh + hidden, len)).logistic();
    hnv += ConstVec<T>(bh + 2 * hidden, len);
    gn = (gn + ConstVec<T>(bx + 2 * hidden, len) + gr * hnv).tanh();
    Vec<T>(hNew + at, len) = (1 - gz) * gn + gz * ConstVec<T>(h + at, len);
  });
}

// The gate math of the GRU's backward step. With dh' the output gradient and a_* the
// pre-activations:
//   da_n = dh' (1 - z) (1 - n^2);  da_z = dh' (h - n) z (1 - z);  da_r = da_n hn r (1 - r)
//   dGx = [da_r, da_z, da_n] (gradient of x wx + bx);  dGh = [da_r, da_z, da_n r] (of h wh + bh)
//   dh = dh' z (h's direct path; ops/RnnSequence.h adds the path through wh)
template <class T>
void gruGateStepGrad(const KernelContext& ctx, int64_t batch, int64_t hidden, const T* gates, const T* hn, const T* h,
                     const T* dhNew, T* dGx, T* dGh, T* dh) {
  const int64_t g3 = 3 * hidden;
  const int64_t len = hidden;
  forEachRow(ctx, batch, hidden, 20, [&](int64_t r) {
    const T* g = gates + r * g3;
    ConstVec<T> gr(g, len), gz(g + hidden, len), gn(g + 2 * hidden, len);
    const int64_t at = r * hidden;
    ConstVec<T> dho(dhNew + at, len), hv(h + at, len);
    Vec<T> dxr(dGx + r * g3, len), dxz(dxr.data() + hidden, len), dxn(dxr.data() + 2 * hidden, len);
    Vec<T> dhr(dGh + r * g3, len), dhz(dhr.data() + hidden, len), dhn(dhr.data() + 2 * hidden, len);
    dxn = dho * (1 - gz) * (1 - gn.square());
    dxz = dho * (hv - gn) * gz * (1 - gz);
    dxr = dxn * ConstVec<T>(hn + at, len) * gr * (1 - gr);
    dhr = dxr;
    dhz = dxz;
    dhn = dxn * gr;
    Vec<T>(dh + at, len) = dho * gz;
  });
}

/// The CPU side of ops/RnnSequence.h: products through ops/Blas.h split across the pool, gate math on
/// Eigen arrays. Products marked to round their f32 operands to bf16 run on the bf16 kernel where
/// the CPU has one, which rounds as it packs; otherwise on rounded copies.
template <class T>
struct CpuBackend {
  const KernelContext& ctx;
  DType low;  // what the products round f32 operands to (f32: nothing)
  std::unique_ptr<T[]> scratchStore;
  std::vector<T> packedSource;  // the rounded copy a packed operand reads, where it keeps B's address

  bool onBf16Kernel() const { return std::is_same_v<T, float> && low == bf16 && blas::haveBf16Gemm(); }

  /// A stored matrix of `rows` rows of `cols`, rows `ld` apart, with its elements rounded to low
  /// into `copy` where the product will not round them itself; x itself otherwise.
  const T* operand(const T* x, int64_t rows, int64_t cols, int64_t ld, std::vector<T>& copy) const {
    if (low == f32 || onBf16Kernel() || rows == 0 || cols == 0) return x;
    copy.assign(x, x + (rows - 1) * ld + cols);
    if constexpr (std::is_same_v<T, float>) {
      for (T& v : copy) v = low == bf16 ? static_cast<float>(BFloat16(v)) : static_cast<float>(Float16(v));
    }
    return copy.data();
  }

  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
            T beta, T* c, int64_t ldc) {
    if constexpr (std::is_same_v<T, float>) {
      if (onBf16Kernel()) return blas::parallelGemmBf16(ctx, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
    }
    std::vector<T> roundedA, roundedB;
    blas::parallelGemm(ctx, ta, tb, m, n, k, operand(a, ta ? k : m, ta ? m : k, lda, roundedA), lda,
                       operand(b, tb ? n : k, tb ? k : n, ldb, roundedB), ldb, beta, c, ldc);
  }
  blas::PackedOperand<T> pack(bool tb, int64_t k, int64_t n, const T* b, int64_t ldb) {
    return {ctx, tb, k, n, operand(b, tb ? n : k, tb ? k : n, ldb, packedSource), ldb, onBf16Kernel()};
  }
  void gemm(int64_t m, const T* a, int64_t lda, const blas::PackedOperand<T>& b, T beta, T* c, int64_t ldc) {
    std::vector<T> roundedA;
    blas::parallelGemm(ctx, false, m, operand(a, m, b.k, lda, roundedA), lda, b, beta, c, ldc);
  }
  void lstmStep(int64_t batch, int64_t hidden, const T* bias, const T* cPrev, T* gates, T* c, T* h) {
    lstmGateStep(ctx, batch, hidden, bias, cPrev, gates, c, h);
  }
  void lstmStepGrad(int64_t batch, int64_t hidden, const T* gates, const T* c, const T* cPrev, const T* dy, T* dh,
                    T* dc, T* dGates) {
    lstmGateStepGrad(ctx, batch, hidden, gates, c, cPrev, dy, dh, dc, dGates);
  }
  void gruStep(int64_t batch, int64_t hidden, const T* bx, const T* bh, const T* h, T* gates, T* hn, T* hNew) {
    gruGateStep(ctx, batch, hidden, bx, bh, h, gates, hn, hNew);
  }
  void gruStepGrad(int64_t batch, int64_t hidden, const T* gates, const T* hn, const T* h, const T* dhNew, T* dGx,
                   T* dGh, T* dh) {
    gruGateStepGrad(ctx, batch, hidden, gates, hn, h, dhNew, dGx, dGh, dh);
  }
  void copy(const T* src, T* dst, int64_t n) { std::copy(src, src + n, dst); }
  void zero(T* dst, int64_t n) { std::fill(dst, dst + n, T(0)); }
  void columnSums(int64_t rows, int64_t cols, const T* src, T* dst) { sumColumns(ctx, rows, cols, src, dst); }
  T* scratch(int64_t n) {
    scratchStore = std::make_unique_for_overwrite<T[]>(static_cast<size_t>(n));  // every element is written first
    return scratchStore.get();
  }
};

#define WEFT_CPU_RNN_KERNEL(Name, sequence)         \
  void Name(KernelContext& ctx) {                    \
    dispatchFloat(ctx.input(0).dtype(), [&](auto z) { \
      using T = decltype(z);                         \
      CpuBackend<T> backend{ctx, detail::productRounding(ctx.attrs()), {}, {}}; \
      rnn::sequence<T>(ctx, backend);                \
    });                                              \
  }
WEFT_CPU_RNN_KERNEL(lstmKernel, lstmForward)
WEFT_CPU_RNN_KERNEL(lstmGradKernel, lstmBackward)
WEFT_CPU_RNN_KERNEL(lstmInputGradKernel, lstmInputBackward)
WEFT_CPU_RNN_KERNEL(lstmWeightGradKernel, lstmWeightBackward)
WEFT_CPU_RNN_KERNEL(gruCellKernel, gruForward)
WEFT_CPU_RNN_KERNEL(gruCellGradKernel, gruBackward)
WEFT_CPU_RNN_KERNEL(gruCellInputGradKernel, gruInputBackward)
WEFT_CPU_RNN_KERNEL(gruCellWeightGradKernel, gruWeightBackward)
#undef WEFT_CPU_RNN_KERNEL

// ---- gradients -----------------------------------------------------------------------------

/// The gradient of forward output i, zeros where none flows (e.g. y unused, only hLast).
Output outputGrad(GradContext& c, int i) { return c.dy(i).valid() ? c.dy(i) : zerosLike(c.y(i)); }

/// An RNN op's attributes: its products' rounding, which the gradient's products share.
Attrs rnnAttrs(DType low) {
  Attrs attrs;
  if (low != f32) attrs.set("round_operands_to", low);
  return attrs;
}

std::vector<Grad> lstmGrad(GradContext& c) {
  Node* n = addOp(c.graph(), "LSTMGrad",
                  {c.x(0), c.x(1), c.x(2), c.x(3), c.x(4), c.y(3), c.y(4), c.y(0), outputGrad(c, 0), outputGrad(c, 1),
                   outputGrad(c, 2)},
                  rnnAttrs(detail::productRounding(c.attrs())));
  return {n->output(0), n->output(1), n->output(2), n->output(3), n->output(4), n->output(5)};
}

std::vector<Grad> gruCellGrad(GradContext& c) {
  Node* n = addOp(c.graph(), "GRUCellGrad", {c.x(0), c.x(1), c.x(2), c.x(3), c.y(1), c.y(2), outputGrad(c, 0)},
                  rnnAttrs(detail::productRounding(c.attrs())));
  return {n->output(0), n->output(1), n->output(2), n->output(3), n->output(4), n->output(5)};
}

}  // namespace

LstmOutputs lstm(Output x, Output h0, Output c0, Output wx, Output wh, Output b) {
  std::vector<Output> inputs{x, h0, c0, wx, wh, b};
  const DType low = detail::productRounding(inputs);
  Node* n = addOp(x.graph(), "LSTM", std::move(inputs), rnnAttrs(low));
  return {n->output(0), n->output(1), n->output(2)};
}

Output gruCell(Output x, Output h, Output wx, Output wh, Output bx, Output bh) {
  std::vector<Output> inputs{x, h, wx, wh, bx, bh};
  const DType low = detail::productRounding(inputs);
  return addOp(x.graph(), "GRUCell", std::move(inputs), rnnAttrs(low))->output(0);
}

void detail::registerRnnOps(OpRegistry& r) {
  r.add(OpDef("LSTM").inputs(6).infer(lstmInfer).cpu(lstmKernel).cuda(WEFT_CUDA_KERNEL(lstm)).grad(lstmGrad));
  r.add(OpDef("LSTMGrad")
            .inputs(11)
            .infer(lstmGradInfer)
            .cpu(lstmGradKernel)
            .cuda(WEFT_CUDA_KERNEL(lstmGrad))
            .noGradient());
  r.add(OpDef("LSTMInputGrad")
            .inputs(11)
            .infer(lstmInputGradInfer)
            .cpu(lstmInputGradKernel)
            .cuda(WEFT_CUDA_KERNEL(lstmInputGrad))
            .noGradient());
  r.add(OpDef("LSTMWeightGrad")
            .inputs(4)
            .infer(lstmWeightGradInfer)
            .cpu(lstmWeightGradKernel)
            .cuda(WEFT_CUDA_KERNEL(lstmWeightGrad))
            .noGradient());
  r.add(OpDef("GRUCell")
            .inputs(6)
            .infer(gruCellInfer)
            .cpu(gruCellKernel)
            .cuda(WEFT_CUDA_KERNEL(gruCell))
            .grad(gruCellGrad));
  r.add(OpDef("GRUCellInputGrad")
            .inputs(7)
            .infer(gruCellInputGradInfer)
            .cpu(gruCellInputGradKernel)
            .cuda(WEFT_CUDA_KERNEL(gruCellInputGrad))
            .noGradient());
  r.add(OpDef("GRUCellWeightGrad")
            .inputs(4)
            .infer(gruCellWeightGradInfer)
            .cpu(gruCellWeightGradKernel)
            .cuda(WEFT_CUDA_KERNEL(gruCellWeightGrad))
            .noGradient());
  r.add(OpDef("GRUCellGrad")
            .inputs(7)
            .infer(gruCellGradInfer)
            .cpu(gruCellGradKernel)
            .cuda(WEFT_CUDA_KERNEL(gruCellGrad))
            .noGradient());
}

}  // namespace weft
