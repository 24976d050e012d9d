// Mixed precision: the 16-bit conversions against an exhaustive nearest-value search, Cast,
// bf16/f16 matrix products and convolutions, the mixed-precision scope, conditional ops,
// AllFinite, loss scaling, and convergence of the MLP and the LM in bf16 and f16.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "data/GaussianMixture.h"
#include "models/Lm.h"
#include "models/Mlp.h"
#include "models/ZooModel.h"
#include "optim/Optimizer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <set>

using namespace weft;
using weft::testing::evaluate;
using weft::testing::randomTensor;

namespace {

/// The value of a 16-bit pattern with `exponentBits` exponent bits, from IEEE's definition.
double decodeBits(uint16_t bits, int exponentBits) {
  const int mantissaBits = 15 - exponentBits, bias = (1 << (exponentBits - 1)) - 1;
  const int exponent = (bits >> mantissaBits) & ((1 << exponentBits) - 1), mantissa = bits & ((1 << mantissaBits) - 1);
  const double sign = (bits >> 15) ? -1.0 : 1.0;
  if (exponent == (1 << exponentBits) - 1) return mantissa ? std::nan("") : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, 1 - bias - mantissaBits);
  return sign * std::ldexp((1 << mantissaBits) + mantissa, exponent - bias - mantissaBits);
}

double decodeBFloat16(uint16_t bits) { return decodeBits(bits, 8); }
double decodeFloat16(uint16_t bits) { return decodeBits(bits, 5); }

/// Round to nearest, ties to the even pattern, by searching all non-negative finite patterns;
/// infinity stands at the next power of two above the largest finite value (IEEE overflow).
class NearestValue {
 public:
  NearestValue(double (*decode)(uint16_t), double infinityAt) {
    for (uint32_t b = 0; b < 0x8000; ++b) {
      const double v = decode(static_cast<uint16_t>(b));
      if (std::isfinite(v)) table_.push_back({v, static_cast<uint16_t>(b)});
      if (std::isinf(v)) table_.push_back({infinityAt, static_cast<uint16_t>(b)});
    }
    std::sort(table_.begin(), table_.end());
  }

  uint16_t operator()(double x) const {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(x);
    auto hi = std::lower_bound(table_.begin(), table_.end(), std::make_pair(a, uint16_t{0}));
    if (hi == table_.end()) return sign | table_.back().second;  // beyond infinity's place
    if (hi == table_.begin() || hi->first == a) return sign | hi->second;
    const auto lo = hi - 1;
    const double dLo = a - lo->first, dHi = hi->first - a;
    if (dLo != dHi) return sign | (dLo < dHi ? lo->second : hi->second);
    return sign | ((lo->second & 1) == 0 ? lo->second : hi->second);
  }

 private:
  std::vector<std::pair<double, uint16_t>> table_;
};

/// Floats over the whole exponent range, plus values exactly halfway between neighbours.
std::vector<float> probeFloats(double (*decode)(uint16_t)) {
  std::mt19937 rng(7);
  std::vector<float> xs;
  for (int i = 0; i < 20000; ++i) {
    const float mantissa = std::uniform_real_distribution<float>(1.0f, 2.0f)(rng);
    const int exponent = std::uniform_int_distribution<int>(-149, 127)(rng);
    const float x = std::ldexp(mantissa, exponent);
    if (std::isfinite(x)) xs.push_back(i % 2 ? -x : x);
  }
  for (uint32_t b = 0; b + 1 < 0x7C00; b += 97) {
    const double a = decode(static_cast<uint16_t>(b)), c = decode(static_cast<uint16_t>(b + 1));
    if (std::isfinite(a) && std::isfinite(c)) xs.push_back(static_cast<float>((a + c) / 2));  // exact in float
  }
  return xs;
}

template <class Half>
void checkRounding(double (*decode)(uint16_t), double infinityAt) {
  const NearestValue nearest(decode, infinityAt);
  int mismatches = 0;
  for (const float x : probeFloats(decode)) {
    const uint16_t got = Half(x).bits, want = nearest(x);
    if (got != want && ++mismatches <= 5) {
      FAIL_CHECK(fmt::format("{:a} rounds to {:#06x}, the nearest is {:#06x}", x, got, want));
    }
  }
  CHECK(mismatches == 0);
}

Tensor halfTensor(DType dtype, const Tensor& f32Values) {
  Graph g;
  return evaluate(g, cast(g.constant(f32Values), dtype));
}

/// C = A B in double, from inputs rounded to `dtype` (the reference of a 16-bit product).
std::vector<double> referenceProduct(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t k,
                                     int64_t n) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += a[static_cast<size_t>(i * k + p)] * b[static_cast<size_t>(p * n + j)];
      c[static_cast<size_t>(i * n + j)] = s;
    }
  }
  return c;
}

int countOps(const Graph& g, const std::string& op) {
  return static_cast<int>(
      std::count_if(g.nodes().begin(), g.nodes().end(), [&](const auto& n) { return n->op == op; }));
}

/// Matrix products and convolutions that compute in `dtype`.
int productsIn(const Graph& g, DType dtype) {
  return static_cast<int>(std::count_if(g.nodes().begin(), g.nodes().end(), [&](const auto& n) {
    return (n->op == "MatMul" || n->op == "BatchMatMul" || n->op == "Conv2D") && n->outputs[0].dtype == dtype;
  }));
}

}  // namespace

TEST_CASE("bfloat16 conversion rounds every float to the nearest value, ties to even") {
  checkRounding<BFloat16>(decodeBFloat16, std::ldexp(1.0, 128));
}

TEST_CASE("float16 conversion rounds to the nearest value, subnormals and overflow included") {
  checkRounding<Float16>(decodeFloat16, 65536.0);
  CHECK(Float16(65519.0f).bits == 0x7BFF);  // just under halfway to 2^16: the largest finite
  CHECK(Float16(65520.0f).bits == 0x7C00);  // halfway: ties to even, which is infinity
  CHECK(Float16(std::ldexp(1.0f, -25)).bits == 0);  // half the smallest subnormal rounds to 0
  CHECK(Float16(std::ldexp(1.5f, -25)).bits == 1);
}

TEST_CASE("every 16-bit pattern widens to its exact value") {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const double wantB = decodeBFloat16(bits), wantH = decodeFloat16(bits);
    BFloat16 b16;
    Float16 f16;
    b16.bits = f16.bits = bits;
    const float gotB = static_cast<float>(b16), gotH = static_cast<float>(f16);
    if (std::isnan(wantB) ? !std::isnan(gotB) : gotB != wantB) FAIL_CHECK(fmt::format("bf16 {:#06x}", b));
    if (std::isnan(wantH) ? !std::isnan(gotH) : gotH != wantH) FAIL_CHECK(fmt::format("f16 {:#06x}", b));
  }
}

TEST_CASE("NaN stays NaN, infinities and signed zeros keep their sign") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  CHECK(std::isnan(static_cast<float>(BFloat16(nan))));
  CHECK(std::isnan(static_cast<float>(Float16(nan))));
  CHECK(static_cast<float>(BFloat16(-inf)) == -inf);
  CHECK(static_cast<float>(Float16(inf)) == inf);
  CHECK(std::signbit(static_cast<float>(Float16(-0.0f))));
  CHECK(BFloat16(-0.0f).bits == 0x8000);
}

TEST_CASE("Cast converts between f32, f64, integers and the 16-bit types") {
  for (const DType low : {bf16, f16}) {
    // The probes (all exponents, halfway points) in bulk, through the vectorised conversions.
    std::vector<float> probes = probeFloats(low == bf16 ? decodeBFloat16 : decodeFloat16);
    probes.insert(probes.end(), {0.0f, -0.0f, INFINITY, -INFINITY, 65520.0f, std::ldexp(1.0f, -25)});
    const Tensor x = Tensor::fromVector(probes, {static_cast<int64_t>(probes.size())});
    Graph g;
    const Output c = g.constant(x);
    const Tensor down = evaluate(g, cast(c, low));
    CHECK(down.dtype() == low);
    std::vector<double> want;
    for (const double v : x.toDoubles()) {
      const float f = static_cast<float>(v);
      want.push_back(low == bf16 ? static_cast<float>(BFloat16(f)) : static_cast<float>(Float16(f)));
    }
    CHECK_CLOSE(down, want, 0.0);
    CHECK_CLOSE(evaluate(g, cast(cast(c, low), f64)), want, 0.0);
    // Integers go through float: 1000 is exact in both formats, 1001 is not in bf16.
    const Tensor ints =
        evaluate(g, cast(cast(g.constant(Tensor::fromVector<int32_t>({1000, 1001, -7}, {3})), low), i64));
    CHECK_CLOSE(ints, (std::vector<double>{1000, low == bf16 ? 1000.0 : 1001.0, -7}), 0.0);
  }
}

TEST_CASE("a 16-bit matrix product matches the double product of the rounded inputs") {
  for (const DType low : {bf16, f16}) {
    CAPTURE(dtypeName(low));
    for (const auto& [ta, tb] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
      const int64_t m = 9, k = 70, n = 13;
      const Tensor a = halfTensor(low, randomTensor(f32, ta ? Shape{k, m} : Shape{m, k}, 1));
      const Tensor b = halfTensor(low, randomTensor(f32, tb ? Shape{n, k} : Shape{k, n}, 2));
      std::vector<double> ra = a.toDoubles(), rb = b.toDoubles();
      auto transpose = [](const std::vector<double>& x, int64_t rows, int64_t cols) {
        std::vector<double> t(x.size());
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < cols; ++j)
            t[static_cast<size_t>(j * rows + i)] = x[static_cast<size_t>(i * cols + j)];
        }
        return t;
      };
      if (ta) ra = transpose(ra, k, m);
      if (tb) rb = transpose(rb, n, k);
      Graph g;
      const Tensor c = evaluate(g, matmul(g.constant(a), g.constant(b), ta, tb));
      CHECK(c.dtype() == low);
      // Products accumulate in f32; the result is rounded once to 8 (bf16) or 11 (f16) bits.
      CHECK_CLOSE(c, referenceProduct(ra, rb, m, k, n), low == bf16 ? 1.0 / 128 : 1.0 / 1024);
    }
  }
}

TEST_CASE("a batched 16-bit product matches per-matrix products") {
  const Tensor a = halfTensor(bf16, randomTensor(f32, {3, 4, 6}, 4));
  const Tensor b = halfTensor(bf16, randomTensor(f32, {3, 6, 5}, 5));
  const std::vector<double> ra = a.toDoubles(), rb = b.toDoubles();
  std::vector<double> want;
  for (int64_t i = 0; i < 3; ++i) {
    const std::vector<double> ai(ra.begin() + i * 24, ra.begin() + (i + 1) * 24),
        bi(rb.begin() + i * 30, rb.begin() + (i + 1) * 30);
    for (double v : referenceProduct(ai, bi, 4, 6, 5)) want.push_back(v);
  }
  Graph g;
  CHECK_CLOSE(evaluate(g, batchMatmul(g.constant(a), g.constant(b))), want, 1.0 / 128);
}

TEST_CASE("the mixed-precision scope casts f32 products down and their results back") {
  Graph g;
  const Output x = g.constant(randomTensor(f32, {5, 8}, 6)), w = g.constant(randomTensor(f32, {8, 3}, 7));
  Output y;
  {
    auto mixed = g.mixedPrecision(bf16);
    CHECK(g.computePrecision().dtype == bf16);
    y = matmul(x, w);
  }
  CHECK(g.computePrecision().dtype == f32);
  CHECK(y.dtype() == f32);
  CHECK(y.node()->op == "Cast");
  CHECK(y.node()->inputs[0].node()->op == "MatMul");
  CHECK(y.node()->inputs[0].dtype() == bf16);
  CHECK(countOps(g, "Cast") == 3);
  const Tensor exact = evaluate(g, matmul(x, w));  // built outside the scope: f32
  CHECK(countOps(g, "Cast") == 3);
  CHECK_CLOSE(evaluate(g, y), exact.toDoubles(), 1.0 / 64);
  {
    // f64 values are the user's explicit choice and stay as they are.
    auto mixed = g.mixedPrecision(f16);
    CHECK(matmul(cast(x, f64), cast(w, f64)).node()->op == "MatMul");
  }
  CHECK_THROWS_AS(g.mixedPrecision(i32), Error);
}

TEST_CASE("a scope that rounds in products marks f32 products and leaves convolutions in f32") {
  Graph g;
  const Output x = g.constant(randomTensor(f32, {2, 3, 6, 6}, 8)), f = g.constant(randomTensor(f32, {4, 3, 3, 3}, 9));
  const Output w = g.variable("w", f32, {2, 5}, Initializer::uniform(-1, 1));
  Output y, z;
  {
    auto mixed = g.mixedPrecision(bf16, Graph::MixedOps::RoundInProducts);
    CHECK(g.computePrecision().ops == Graph::MixedOps::RoundInProducts);
    y = conv2d(x, f, {{1, 1}, {1, 1}});
    z = matmul(reshape(y, {-1, 2}), w);
    // f64 values are the user's explicit choice and stay as they are.
    CHECK(!matmul(cast(w, f64), cast(w, f64), true).node()->attrs.has("round_operands_to"));
  }
  CHECK(y.node()->op == "Conv2D");
  CHECK(y.dtype() == f32);
  CHECK(z.node()->op == "MatMul");
  CHECK(z.dtype() == f32);
  CHECK(z.node()->attrs.get<DType>("round_operands_to") == bf16);
  CHECK(countOps(g, "Cast") == 2);  // the two to f64
  // The gradient's products round their operands as the forward product does.
  const Output dw = gradients(sum(square(z)), {w})[0].dense;
  CHECK(dw.node()->op == "MatMul");
  CHECK(dw.node()->attrs.get<DType>("round_operands_to") == bf16);
  CHECK(countOps(g, "Cast") == 2);
}

namespace {

/// x rounded to `low` and widened back, in double.
std::vector<double> roundedTo(const Tensor& x, DType low) {
  std::vector<double> out;
  for (const double v : x.toDoubles()) {
    const float f = static_cast<float>(v);
    out.push_back(low == bf16 ? static_cast<float>(BFloat16(f)) : static_cast<float>(Float16(f)));
  }
  return out;
}

}  // namespace

TEST_CASE("a product that rounds its operands is the f32-accumulated product of the rounded operands") {
  for (const DType low : {bf16, f16}) {
    for (const auto& [ta, tb] : {std::pair{false, false}, {false, true}, {true, false}, {true, true}}) {
      CAPTURE(dtypeName(low));
      CAPTURE(ta);
      CAPTURE(tb);
      // A batch of 3 products of (37 x 530) and (530 x 45): tile and depth-block edges, an even
      // depth; and 41 x 65 x 7, an odd one.
      for (const auto& [m, k, n] : {std::tuple{37, 530, 45}, {41, 7, 65}}) {
        const Tensor a = randomTensor(f32, ta ? Shape{3, k, m} : Shape{3, m, k}, 11);
        const Tensor b = randomTensor(f32, tb ? Shape{3, n, k} : Shape{3, k, n}, 12);
        Graph g;
        Output y;
        {
          auto mixed = g.mixedPrecision(low, Graph::MixedOps::RoundInProducts);
          y = batchMatmul(g.constant(a), g.constant(b), ta, tb);
        }
        const Tensor got = evaluate(g, y);
        const std::vector<double> ra = roundedTo(a, low), rb = roundedTo(b, low), c = got.toDoubles();
        for (int64_t p = 0; p < 3; ++p) {
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double exact = 0, magnitude = 0;
              for (int64_t q = 0; q < k; ++q) {
                const double x = ra[static_cast<size_t>(p * m * k + (ta ? q * m + i : i * k + q))];
                const double z = rb[static_cast<size_t>(p * k * n + (tb ? j * k + q : q * n + j))];
                exact += x * z;
                magnitude += std::abs(x * z);
              }
              // Exact products summed in f32: at most k roundings of the running sum.
              const double bound = static_cast<double>(k + 2) * std::numeric_limits<float>::epsilon() * magnitude;
              const double value = c[static_cast<size_t>((p * m + i) * n + j)];
              if (std::abs(value - exact) > bound) {
                FAIL_CHECK("C[" << p << ", " << i << ", " << j << "] = " << value << ", expected " << exact);
                return;
              }
            }
          }
        }
      }
    }
  }
}

namespace {

/// v rounded to `low` (as f32 rounds it) and widened back; v itself for f32.
double roundTo(double v, DType low) {
  const float f = static_cast<float>(v);
  if (low == bf16) return static_cast<float>(BFloat16(f));
  if (low == f16) return static_cast<float>(Float16(f));
  return v;
}

/// C (m x n) = op(A) op(B) in double, every operand element rounded to `low` first: A is (m x k),
/// or (k x m) when ta; B is (k x n), or (n x k) when tb.
std::vector<double> roundedProduct(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t k,
                                   int64_t n, bool ta, bool tb, DType low) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t q = 0; q < k; ++q) {
        sum += roundTo(a[static_cast<size_t>(ta ? q * m + i : i * k + q)], low) *
               roundTo(b[static_cast<size_t>(tb ? j * k + q : q * n + j)], low);
      }
      c[static_cast<size_t>(i * n + j)] = sum;
    }
  }
  return c;
}

std::vector<double> slice(const std::vector<double>& v, int64_t at, int64_t count) {
  return {v.begin() + at, v.begin() + at + count};
}

double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

/// Largest |got - want| relative to the largest |want|.
double relativeError(const Tensor& got, const std::vector<double>& want) {
  const std::vector<double> g = got.toDoubles();
  REQUIRE(g.size() == want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    diff = std::max(diff, std::abs(g[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / scale;
}

struct LstmCase {
  int64_t steps = 4, batch = 5, input = 24, hidden = 16;
  Tensor x = randomTensor(f32, {steps, batch, input}, 21), h0 = randomTensor(f32, {batch, hidden}, 22),
         c0 = randomTensor(f32, {batch, hidden}, 23), wx = randomTensor(f32, {input, 4 * hidden}, 24, -0.4, 0.4),
         wh = randomTensor(f32, {hidden, 4 * hidden}, 25, -0.4, 0.4), b = randomTensor(f32, {4 * hidden}, 26),
         r = randomTensor(f32, {steps, batch, hidden}, 27);  // the loss is sum(y * r)
};

/// y and the gradients of sum(y * r) with respect to x, h0, c0, wx, wh and b: the LSTM of
/// ops/Rnn.cpp in double, every matrix product's operands rounded to `low`.
std::vector<std::vector<double>> lstmReference(const LstmCase& p, DType low) {
  const int64_t B = p.batch, I = p.input, H = p.hidden, G = 4 * H;
  const std::vector<double> x = p.x.toDoubles(), wx = p.wx.toDoubles(), wh = p.wh.toDoubles(), b = p.b.toDoubles(),
                            r = p.r.toDoubles();
  std::vector<std::vector<double>> h{p.h0.toDoubles()}, c{p.c0.toDoubles()}, gates;
  for (int64_t t = 0; t < p.steps; ++t) {
    std::vector<double> pre = roundedProduct(slice(x, t * B * I, B * I), wx, B, I, G, false, false, low);
    const std::vector<double> recurrent = roundedProduct(h[t], wh, B, H, G, false, false, low);
    std::vector<double> hNew(static_cast<size_t>(B * H)), cNew(hNew.size());
    for (int64_t i = 0; i < B; ++i) {
      for (int64_t j = 0; j < H; ++j) {
        double* g = &pre[static_cast<size_t>(i * G + j)];
        for (int64_t q = 0; q < 4; ++q)
          g[q * H] += recurrent[static_cast<size_t>(i * G + q * H + j)] + b[static_cast<size_t>(q * H + j)];
        g[0] = sigmoid(g[0]), g[H] = sigmoid(g[H]), g[2 * H] = std::tanh(g[2 * H]), g[3 * H] = sigmoid(g[3 * H]);
        const size_t at = static_cast<size_t>(i * H + j);
        cNew[at] = g[H] * c[t][at] + g[0] * g[2 * H];
        hNew[at] = g[3 * H] * std::tanh(cNew[at]);
      }
    }
    gates.push_back(pre);
    h.push_back(hNew);
    c.push_back(cNew);
  }
  std::vector<double> y, dx(x.size()), dwx(wx.size(), 0.0), dwh(wh.size(), 0.0), db(b.size(), 0.0);
  for (int64_t t = 0; t < p.steps; ++t) y.insert(y.end(), h[t + 1].begin(), h[t + 1].end());
  std::vector<double> dh(static_cast<size_t>(B * H), 0.0), dc = dh;
  for (int64_t t = p.steps - 1; t >= 0; --t) {
    std::vector<double> dG(static_cast<size_t>(B * G));
    for (int64_t i = 0; i < B; ++i) {
      for (int64_t j = 0; j < H; ++j) {
        const size_t at = static_cast<size_t>(i * H + j);
        const double* g = &gates[static_cast<size_t>(t)][static_cast<size_t>(i * G + j)];
        const double tc = std::tanh(c[t + 1][at]);
        dh[at] += r[static_cast<size_t>(t * B * H) + at];
        dc[at] += dh[at] * g[3 * H] * (1 - tc * tc);
        double* d = &dG[static_cast<size_t>(i * G + j)];
        d[0] = dc[at] * g[2 * H] * g[0] * (1 - g[0]);
        d[H] = dc[at] * c[t][at] * g[H] * (1 - g[H]);
        d[2 * H] = dc[at] * g[0] * (1 - g[2 * H] * g[2 * H]);
        d[3 * H] = dh[at] * tc * g[3 * H] * (1 - g[3 * H]);
        dc[at] *= g[H];
      }
    }
    dh = roundedProduct(dG, wh, B, G, H, false, true, low);
    const std::vector<double> dxt = roundedProduct(dG, wx, B, G, I, false, true, low);
    std::copy(dxt.begin(), dxt.end(), dx.begin() + t * B * I);
    const std::vector<double> dwxt = roundedProduct(slice(x, t * B * I, B * I), dG, I, B, G, true, false, low);
    const std::vector<double> dwht = roundedProduct(h[t], dG, H, B, G, true, false, low);
    for (size_t q = 0; q < dwx.size(); ++q) dwx[q] += dwxt[q];
    for (size_t q = 0; q < dwh.size(); ++q) dwh[q] += dwht[q];
    for (int64_t q = 0; q < B * G; ++q) db[static_cast<size_t>(q % G)] += dG[static_cast<size_t>(q)];
  }
  return {y, dx, dh, dc, dwx, dwh, db};
}

/// The output of `build` on constants holding `inputs`, built in a scope that rounds products'
/// operands to `low` (none for f32), and the gradients of sum(output * r) with respect to the
/// inputs, built outside it; `marked` tells whether the op and its gradient op carry the rounding.
std::vector<Tensor> recurrentFromOps(const std::vector<Tensor>& inputs, const Tensor& r, DType low,
                                     const std::function<Output(const std::vector<Output>&)>& build,
                                     bool* marked = nullptr) {
  Graph g;
  std::vector<Output> in;
  for (const Tensor& t : inputs) in.push_back(g.constant(t));
  std::optional<Graph::PrecisionScope> scope;
  if (low != f32) scope.emplace(g, low, Graph::MixedOps::RoundInProducts);
  const Output out = build(in);
  scope.reset();
  std::vector<Output> wanted{out};
  for (const Grad& d : gradients(sum(mul(out, g.constant(r))), in)) wanted.push_back(d.dense);
  if (marked != nullptr) {
    const auto rounding = [](const Output& o) { return o.node()->attrs.get<DType>("round_operands_to", f32); };
    *marked = rounding(out) == low && rounding(wanted[1]) == low;
  }
  Session s(g, SessionOptions{.threads = 2});
  return s.run(wanted);
}

std::vector<Tensor> lstmFromOps(const LstmCase& p, DType low, bool* marked = nullptr) {
  return recurrentFromOps(
      {p.x, p.h0, p.c0, p.wx, p.wh, p.b}, p.r, low,
      [](const std::vector<Output>& in) { return lstm(in[0], in[1], in[2], in[3], in[4], in[5]).y; }, marked);
}

}  // namespace

namespace {

struct GruCase {
  int64_t batch = 6, input = 20, hidden = 16;
  Tensor x = randomTensor(f32, {batch, input}, 31), h = randomTensor(f32, {batch, hidden}, 32),
         wx = randomTensor(f32, {input, 3 * hidden}, 33, -0.4, 0.4),
         wh = randomTensor(f32, {hidden, 3 * hidden}, 34, -0.4, 0.4), bx = randomTensor(f32, {3 * hidden}, 35),
         bh = randomTensor(f32, {3 * hidden}, 36), r = randomTensor(f32, {batch, hidden}, 37);  // loss sum(h' r)
};

/// h' and the gradients of sum(h' * r) with respect to x, h, wx, wh, bx and bh: the GRU cell of
/// ops/Rnn.cpp in double, every matrix product's operands rounded to `low`.
std::vector<std::vector<double>> gruReference(const GruCase& p, DType low) {
  const int64_t B = p.batch, I = p.input, H = p.hidden, G = 3 * H;
  const std::vector<double> x = p.x.toDoubles(), h = p.h.toDoubles(), wx = p.wx.toDoubles(), wh = p.wh.toDoubles(),
                            bx = p.bx.toDoubles(), bh = p.bh.toDoubles(), r = p.r.toDoubles();
  const std::vector<double> xw = roundedProduct(x, wx, B, I, G, false, false, low);
  const std::vector<double> hw = roundedProduct(h, wh, B, H, G, false, false, low);
  std::vector<double> hNew(static_cast<size_t>(B * H)), dGx(static_cast<size_t>(B * G)), dGh(dGx.size()),
      dh(hNew.size());
  for (int64_t i = 0; i < B; ++i) {
    for (int64_t j = 0; j < H; ++j) {
      const auto at = [&](int64_t gate) { return static_cast<size_t>(i * G + gate * H + j); };
      const size_t s = static_cast<size_t>(i * H + j);
      const double rg = sigmoid(xw[at(0)] + bx[at(0) % G] + hw[at(0)] + bh[at(0) % G]);
      const double zg = sigmoid(xw[at(1)] + bx[at(1) % G] + hw[at(1)] + bh[at(1) % G]);
      const double hn = hw[at(2)] + bh[at(2) % G];
      const double ng = std::tanh(xw[at(2)] + bx[at(2) % G] + rg * hn);
      hNew[s] = (1 - zg) * ng + zg * h[s];
      const double dout = r[s];
      dGx[at(2)] = dout * (1 - zg) * (1 - ng * ng);
      dGx[at(1)] = dout * (h[s] - ng) * zg * (1 - zg);
      dGx[at(0)] = dGx[at(2)] * hn * rg * (1 - rg);
      dGh[at(0)] = dGx[at(0)];
      dGh[at(1)] = dGx[at(1)];
      dGh[at(2)] = dGx[at(2)] * rg;
      dh[s] = dout * zg;
    }
  }
  const std::vector<double> dhThroughWh = roundedProduct(dGh, wh, B, G, H, false, true, low);
  for (size_t q = 0; q < dh.size(); ++q) dh[q] += dhThroughWh[q];
  std::vector<double> dbx(static_cast<size_t>(G), 0.0), dbh = dbx;
  for (int64_t q = 0; q < B * G; ++q) {
    dbx[static_cast<size_t>(q % G)] += dGx[static_cast<size_t>(q)];
    dbh[static_cast<size_t>(q % G)] += dGh[static_cast<size_t>(q)];
  }
  return {hNew,
          roundedProduct(dGx, wx, B, G, I, false, true, low),
          dh,
          roundedProduct(x, dGx, I, B, G, true, false, low),
          roundedProduct(h, dGh, H, B, G, true, false, low),
          dbx,
          dbh};
}

std::vector<Tensor> gruFromOps(const GruCase& p, DType low, bool* marked = nullptr) {
  return recurrentFromOps(
      {p.x, p.h, p.wx, p.wh, p.bx, p.bh}, p.r, low,
      [](const std::vector<Output>& in) { return gruCell(in[0], in[1], in[2], in[3], in[4], in[5]); }, marked);
}

}  // namespace

namespace {

/// Checks an RNN op's output and gradients (fromOps) against its double reference in bf16 and
/// f16 within 1e-5 of each tensor's largest element, and that this bound tells rounded products
/// from exact ones: the f32 op misses the bf16 reference by far more.
void checkRoundedRecurrentOp(const std::vector<std::string>& names,
                             const std::function<std::vector<Tensor>(DType, bool*)>& fromOps,
                             const std::function<std::vector<std::vector<double>>(DType)>& reference) {
  for (const DType low : {bf16, f16}) {
    CAPTURE(dtypeName(low));
    bool marked = false;
    const std::vector<Tensor> got = fromOps(low, &marked);
    CHECK(marked);
    const auto want = reference(low);
    for (size_t i = 0; i < want.size(); ++i) {
      CAPTURE(names[i]);
      CHECK(relativeError(got[i], want[i]) < 1e-5);
    }
  }
  const std::vector<Tensor> exact = fromOps(f32, nullptr);
  const auto rounded = reference(bf16);
  for (size_t i = 0; i < rounded.size(); ++i) {
    CAPTURE(names[i]);
    CHECK(relativeError(exact[i], rounded[i]) > 1e-4);
  }
}

}  // namespace

TEST_CASE("a fused LSTM that rounds in products matches the double LSTM of rounded operands, with its gradients") {
  const LstmCase p;
  checkRoundedRecurrentOp({"y", "dx", "dh0", "dc0", "dwx", "dwh", "db"},
                          [&](DType low, bool* marked) { return lstmFromOps(p, low, marked); },
                          [&](DType low) { return lstmReference(p, low); });
}

TEST_CASE("a GRU cell that rounds in products matches the double GRU cell of rounded operands, with its gradients") {
  const GruCase p;
  checkRoundedRecurrentOp({"h'", "dx", "dh", "dwx", "dwh", "dbx", "dbh"},
                          [&](DType low, bool* marked) { return gruFromOps(p, low, marked); },
                          [&](DType low) { return gruReference(p, low); });
}

TEST_CASE("a product that rounds its operands is refused for other dtypes and rounding types") {
  registerAllOps();  // the nodes below are added directly, not through the op builders
  Graph g;
  const Output x = g.constant(randomTensor(f64, {2, 2}, 1));
  CHECK_THROWS_WITH_AS(
      g.addNode("MatMul", {x, x}, {{"transpose_a", false}, {"transpose_b", false}, {"round_operands_to", bf16}}),
                       doctest::Contains("rounds f32 operands to bf16, not f64"), Error);
  const Output y = g.constant(randomTensor(f32, {2, 2}, 1));
  CHECK_THROWS_WITH_AS(
      g.addNode("MatMul", {y, y}, {{"transpose_a", false}, {"transpose_b", false}, {"round_operands_to", i32}}),
                       doctest::Contains("round_operands_to is bf16 or f16, not i32"), Error);
  // The fused recurrent ops check it the same way.
  const Output x3 = g.constant(randomTensor(f64, {1, 2, 2}, 1)), b = g.constant(randomTensor(f64, {8}, 1));
  const Output w = g.constant(randomTensor(f64, {2, 8}, 1));
  CHECK_THROWS_WITH_AS(g.addNode("LSTM", {x3, x, x, w, w, b}, {{"round_operands_to", bf16}}),
                       doctest::Contains("rounds f32 operands to bf16, not f64"), Error);
}

TEST_CASE("every zoo model computes its products and convolutions in the scope's precision") {
  for (const std::string name : {"mlp", "lm", "nmt", "resnet", "gnn", "list_reduction"}) {
    CAPTURE(name);
    const auto model = models::makeZooModel(name);
    Graph g;
    {
      auto mixed = g.mixedPrecision(bf16);
      model->build(g, models::CommonOptions{8, 1, "", "f32"});
    }
    gradients(model->loss(), [&] {
      std::vector<Output> vars;
      for (Node* v : g.trainableVariables()) vars.push_back(v->output());
      return vars;
    }());
    CHECK(productsIn(g, bf16) > 0);
    CHECK(productsIn(g, f32) == 0);
  }
}

TEST_CASE("every zoo model's matrix products round their operands in a scope that rounds in products") {
  for (const std::string name : {"mlp", "lm", "nmt", "resnet", "gnn", "list_reduction"}) {
    CAPTURE(name);
    const auto model = models::makeZooModel(name);
    Graph g;
    {
      auto mixed = g.mixedPrecision(bf16, Graph::MixedOps::RoundInProducts);
      model->build(g, models::CommonOptions{8, 1, "", "f32"});
    }
    std::vector<Output> vars;
    for (Node* v : g.trainableVariables()) vars.push_back(v->output());
    gradients(model->loss(), vars);
    int rounded = 0, exact = 0;
    for (const auto& n : g.nodes()) {
      static const std::set<std::string> products{"MatMul",   "BatchMatMul", "LSTM",
                                                  "LSTMGrad", "GRUCell",     "GRUCellGrad"};
      if (products.count(n->op)) ++(n->attrs.has("round_operands_to") ? rounded : exact);
    }
    CHECK(exact == 0);
    CHECK(rounded > 0);
    CHECK(productsIn(g, bf16) == 0);
  }
}

TEST_CASE("gradients through a bf16 product are f32 and close to the f32 gradients") {
  Graph g;
  const Output w = g.variable("w", f32, {6, 4}, Initializer::uniform(-1, 1));
  const Output x = g.constant(randomTensor(f32, {10, 6}, 8));
  Output mixedLoss;
  {
    auto mixed = g.mixedPrecision(bf16);
    mixedLoss = sum(square(matmul(x, w)));
  }
  const Output exactLoss = sum(square(matmul(x, w)));
  const Output mixedGrad = gradients(mixedLoss, {w})[0].dense, exactGrad = gradients(exactLoss, {w})[0].dense;
  CHECK(mixedGrad.dtype() == f32);
  Session s(g);
  const auto values = s.run({mixedGrad, exactGrad});
  CHECK_CLOSE(values[0], values[1].toDoubles(), 2.0 / 128);
}

TEST_CASE("a convolution in the mixed-precision scope stays close to the f32 convolution") {
  for (const DType low : {bf16, f16}) {
    Graph g;
    const Output x = g.constant(randomTensor(f32, {2, 3, 7, 7}, 9)),
                 f = g.constant(randomTensor(f32, {4, 3, 3, 3}, 10));
    Conv2dOptions options;
    options.padding = {1, 1};
    Output y;
    {
      auto mixed = g.mixedPrecision(low);
      y = conv2d(x, f, options);
    }
    CHECK(y.dtype() == f32);
    CHECK(y.node()->inputs[0].dtype() == low);
    const Tensor exact = evaluate(g, conv2d(x, f, options));
    CHECK_CLOSE(evaluate(g, y), exact.toDoubles(), low == bf16 ? 4.0 / 128 : 4.0 / 1024);
    // The input and filter gradients run in `low` too, and come back as f32.
    const auto grads = gradients(sum(square(y)), {x, f});
    const auto exactGrads = gradients(sum(square(conv2d(x, f, options))), {x, f});
    Session s(g);
    const auto v = s.run({grads[0].dense, grads[1].dense, exactGrads[0].dense, exactGrads[1].dense});
    CHECK_CLOSE(v[0], v[2].toDoubles(), low == bf16 ? 8.0 / 128 : 8.0 / 1024);
    CHECK_CLOSE(v[1], v[3].toDoubles(), low == bf16 ? 8.0 / 128 : 8.0 / 1024);
  }
}

TEST_CASE("AllFinite is 1 for finite tensors and 0 when any element is NaN or infinite") {
  Graph g;
  const Output a = g.placeholder("a", f32, {-1}), b = g.placeholder("b", f64, {-1});
  const Output finite = allFinite({a, b});
  Session s(g);
  auto check = [&](std::vector<float> av, std::vector<double> bv) {
    const auto na = static_cast<int64_t>(av.size()), nb = static_cast<int64_t>(bv.size());
    return s.run({finite}, {{a, Tensor::fromVector(av, {na})}, {b, Tensor::fromVector(bv, {nb})}})[0].item();
  };
  CHECK(check({1, 2, 3}, {4}) == 1.0);
  CHECK(check({}, {}) == 1.0);
  CHECK(check({1, INFINITY, 3}, {4}) == 0.0);
  CHECK(check({1, 2}, {std::nan("")}) == 0.0);
  CHECK(check({-INFINITY}, {0}) == 0.0);
  CHECK_THROWS_AS(allFinite({g.placeholder("ids", i64, {3})}), Error);
  CHECK(contains(errorOf([&] { allFinite({g.placeholder("h", bf16, {3})}); }), "must be f32 or f64"));
}

TEST_CASE("an op made conditional runs only in steps where its condition is nonzero and not NaN") {
  Graph g;
  const Output counter = g.variable("counter", f32, {}, Initializer::zeros(), false);
  const Output condition = g.placeholder("condition", f32, {});
  Node* add = assignAdd(counter, g.scalar(1.0));
  g.runOnlyIf(add, condition);
  CHECK(contains(g.dump(), "if condition:0"));
  Session s(g);
  for (const float c : {1.0f, 0.0f, 2.0f, 0.0f, NAN}) s.run({}, {{condition, Tensor::scalar(f32, c)}}, {add});
  CHECK(s.variable("counter").item() == 2.0);
}

TEST_CASE("a computed condition runs before the op it gates") {
  Graph g;
  const Output counter = g.variable("counter", f32, {}, Initializer::zeros(), false);
  const Output x = g.placeholder("x", f32, {-1});
  Node* add = assignAdd(counter, g.scalar(1.0));
  g.runOnlyIf(add, allFinite({x}));
  Session s(g);
  s.run({}, {{x, Tensor::fromVector<float>({1, 2}, {2})}}, {add});
  s.run({}, {{x, Tensor::fromVector<float>({1, NAN}, {2})}}, {add});
  CHECK(s.variable("counter").item() == 1.0);
}

TEST_CASE("only scalar conditions on ops without outputs are accepted") {
  Graph g;
  const Output v = g.variable("v", f32, {2}, Initializer::zeros());
  Node* add = assignAdd(v, g.constant(Tensor::fromVector<float>({1, 1}, {2})));
  CHECK(contains(errorOf([&] { g.runOnlyIf(add, v); }), "must be a scalar"));
  CHECK(contains(errorOf([&] { g.runOnlyIf((v * 2.0).node(), g.scalar(1.0)); }), "has outputs"));
}

TEST_CASE("a power-of-two loss scale leaves an SGD step exactly unchanged") {
  auto step = [](std::optional<optim::LossScaling> scaling) {
    Graph g;
    const Output w = g.variable("w", f32, {4, 3}, Initializer::uniform(-1, 1));
    const Output x = g.constant(randomTensor(f32, {5, 4}, 11));
    optim::MinimizeOptions options;
    options.lossScaling = scaling;
    Node* train = optim::SGD(0.1).minimize(mean(square(matmul(x, w))), options);
    Session s(g);
    s.run(train);
    return s.variable("w").toDoubles();
  };
  CHECK(step(optim::LossScaling{}) == step(std::nullopt));
  CHECK(step(optim::LossScaling{1024, false, 1}) == step(std::nullopt));
}

TEST_CASE("an overflowing step updates nothing and halves the loss scale") {
  Graph g;
  const Output w = g.variable("w", f32, {3}, Initializer::constant(1.0));
  const Output x = g.placeholder("x", f32, {3});
  optim::MinimizeOptions options;
  options.lossScaling = optim::LossScaling{65536, true, 3};
  optim::Adam adam(0.1);
  Node* train = adam.minimize(sum(w * x), options);
  Session s(g);
  auto run = [&](float value) { s.run({}, {{x, Tensor::fromVector<float>({value, value, value}, {3})}}, {train}); };
  run(1e36f);  // 1e36 x 65536 overflows f32
  CHECK(s.variable("w").toDoubles() == std::vector<double>{1, 1, 1});
  CHECK(s.variable("Adam/w/m").toDoubles() == std::vector<double>{0, 0, 0});
  CHECK(s.variable("global_step").item() == 0);
  CHECK(s.variable("loss_scale").item() == 32768);
  CHECK(adam.lossScale().node()->name == "loss_scale");
  run(1.0f);
  CHECK(s.variable("global_step").item() == 1);
  CHECK(s.variable("w").toDoubles()[0] == doctest::Approx(0.9));  // Adam's first step: lr sign(g)
  CHECK(s.variable("loss_scale/good_steps").item() == 1);
  run(1.0f);
  run(1.0f);  // the third good step in a row doubles the scale
  CHECK(s.variable("loss_scale").item() == 65536);
  CHECK(s.variable("loss_scale/good_steps").item() == 0);
}

TEST_CASE("a fixed loss scale still skips overflowing steps but keeps its value") {
  Graph g;
  const Output w = g.variable("w", f32, {2}, Initializer::constant(1.0));
  const Output x = g.placeholder("x", f32, {2});
  optim::MinimizeOptions options;
  options.lossScaling = optim::LossScaling{128, false, 1};
  Node* train = optim::SGD(0.5).minimize(sum(w * x), options);
  Session s(g);
  s.run({}, {{x, Tensor::fromVector<float>({3e37f, 1}, {2})}}, {train});
  CHECK(s.variable("w").toDoubles() == std::vector<double>{1, 1});
  CHECK(s.variable("loss_scale").item() == 128);
  s.run({}, {{x, Tensor::fromVector<float>({1, 2}, {2})}}, {train});
  CHECK(s.variable("w").toDoubles() == std::vector<double>{0.5, 0});
}

TEST_CASE("a session checking numerics leaves an overflowing scaled gradient to the loss scale") {
  Graph g;
  const Output w = g.variable("w", f32, {2}, Initializer::constant(1.0));
  const Output x = g.placeholder("x", f32, {2});
  optim::MinimizeOptions options;
  options.lossScaling = optim::LossScaling{65536, true, 1};
  Node* train = optim::SGD(0.5).minimize(sum(w * x), options);
  SessionOptions checking;
  checking.checkNumerics = true;
  Session s(g, checking);
  s.run({}, {{x, Tensor::fromVector<float>({1e36f, 1}, {2})}}, {train});  // 1e36 x 65536 overflows
  CHECK(s.variable("w").toDoubles() == std::vector<double>{1, 1});
  CHECK(s.variable("loss_scale").item() == 32768);
  const std::string forward = errorOf([&] {
    s.run({}, {{x, Tensor::fromVector<float>({INFINITY, 1}, {2})}}, {train});
  });
  CHECK(contains(forward, "numerics check"));
  CHECK(contains(forward, "'Mul'"));
}

TEST_CASE("loss scaling rejects a scale outside [1, 2^24] and a second scaled minimize") {
  Graph g;
  const Output w = g.variable("w", f32, {2}, Initializer::constant(1.0));
  optim::MinimizeOptions options;
  options.lossScaling = optim::LossScaling{0.5, true, 10};
  CHECK(contains(errorOf([&] { optim::SGD(0.1).minimize(sum(w), options); }), "initial scale >= 1"));
  options.lossScaling = optim::LossScaling{std::ldexp(1.0, 25), true, 10};
  CHECK(contains(errorOf([&] { optim::SGD(0.1).minimize(sum(w), options); }), "above the largest"));
  options.lossScaling = optim::LossScaling{};
  optim::SGD(0.1).minimize(sum(w), options);
  auto scoped = g.scope("again");
  CHECK(contains(errorOf([&] { optim::SGD(0.1).minimize(sum(w), options); }), "already has a loss scale"));
}

TEST_CASE("a dynamic loss scale stops growing at 2^24") {
  Graph g;
  const Output w = g.variable("w", f32, {2}, Initializer::constant(1.0));
  optim::MinimizeOptions options;
  options.lossScaling = optim::LossScaling{std::ldexp(1.0, 23), true, 1};
  Node* train = optim::SGD(0.1).minimize(sum(w), options);
  Session s(g);
  for (int i = 0; i < 3; ++i) s.run(train);
  CHECK(s.variable("loss_scale").item() == std::ldexp(1.0, 24));
}

TEST_CASE("16-bit tensors read, fill and convert like the others") {
  CHECK(Tensor::scalar(bf16, 1.5).item() == 1.5);
  CHECK(Tensor::full(f16, {3}, 0.1).toDoubles()[2] == static_cast<float>(Float16(0.1f)));
  CHECK(Tensor::fromVector<float>({1, 1001}, {2}).cast(bf16).toDoubles() == std::vector<double>{1, 1000});
  Graph g;
  const Output v = g.variable("v", bf16, {4}, Initializer::constant(0.25));
  Session s(g);
  CHECK(s.run({v})[0].toDoubles() == std::vector<double>{0.25, 0.25, 0.25, 0.25});
}

TEST_CASE("the MLP trains in bf16 and in f16 with loss scaling as well as in f32") {
  data::GaussianMixtureSpec task;
  const auto train = data::gaussianMixture(task, 6400, 10);
  const auto test = data::gaussianMixture(task, 2000, 11);
  auto accuracyAfterTraining = [&](DType precision) {
    Graph g;
    models::MlpModel m;
    {
      auto mixed = g.mixedPrecision(precision);
      m = models::buildMlp(g, models::MlpConfig{});
    }
    CHECK(productsIn(g, precision) >= 3);
    optim::MinimizeOptions options;
    if (precision == f16) options.lossScaling = optim::LossScaling{};
    Node* step = optim::Adam(1e-3).minimize(m.loss, options);
    Session s(g, {2, false});
    for (int64_t b = 0; b < 150; ++b) {
      const auto batch = data::batchOf(train, (b % 50) * 128, 128);
      s.run({}, {{m.features, batch.features}, {m.labels, batch.labels}}, {step});
    }
    return s.run({m.accuracy}, {{m.features, test.features}, {m.labels, test.labels}})[0].item();
  };
  const double full = accuracyAfterTraining(f32);
  CHECK(full > 0.8);
  CHECK(accuracyAfterTraining(bf16) > full - 0.03);
  CHECK(accuracyAfterTraining(f16) > full - 0.03);
}

TEST_CASE("the LM trains in bf16 and f16 to nearly the f32 loss") {
  auto lossAfterTraining = [](DType precision) {
    models::LmModel model;
    model.config().vocab = 400;
    model.config().embed = 32;
    model.config().hidden = 48;
    model.config().sampled = 0;
    model.config().classes = 8;
    model.config().batchSize = 16;
    model.config().trainSentences = 400;
    model.config().heldoutSentences = 50;
    models::CommonOptions common;
    Graph g;
    {
      auto mixed = g.mixedPrecision(precision);
      model.build(g, common);
    }
    CHECK(productsIn(g, precision) >= 1);
    optim::MinimizeOptions options;
    options.clipGlobalNorm = 1.0;
    if (precision == f16) options.lossScaling = optim::LossScaling{};
    Node* step = optim::Adam(5e-3).minimize(model.loss(), options);
    Session s(g, {2, false});
    const double before = model.evaluate(s, 0).at("loss");
    for (int i = 0; i < 200; ++i) s.run({}, models::feedsFor(g, model.trainData().next()), {step});
    const double after = model.evaluate(s, 0).at("loss");
    CHECK(after < before - 0.7);
    return after;
  };
  const double full = lossAfterTraining(f32);
  CHECK(lossAfterTraining(bf16) == doctest::Approx(full).epsilon(0.03));
  CHECK(lossAfterTraining(f16) == doctest::Approx(full).epsilon(0.03));
}

TEST_CASE("every zoo model trains in bf16 to nearly the loss it reaches in f32") {
  // The same batches and initial values in both precisions; the mean loss over the last steps.
  constexpr int kSteps = 60, kLast = 15;
  auto meanLossAtEnd = [](const std::string& name, DType precision, double& first) {
    auto model = models::makeZooModel(name);
    Graph g;
    models::CommonOptions common;
    common.batchSize = 16;
    common.seed = 7;
    {
      // As `weft train --precision bf16` on a CPU.
      auto mixed = g.mixedPrecision(precision, Graph::MixedOps::RoundInProducts);
      model->build(g, common);
    }
    optim::MinimizeOptions options;
    options.clipGlobalNorm = 5.0;
    Node* step = optim::Adam(2e-3).minimize(model->loss(), options);
    Session s(g, {2, false});
    double sum = 0;
    for (int i = 0; i < kSteps; ++i) {
      const double loss = s.run({model->loss()}, models::feedsFor(g, model->trainData().next()), {step})[0].item();
      if (i == 0) first = loss;
      if (i >= kSteps - kLast) sum += loss;
    }
    return sum / kLast;
  };
  for (const std::string name : {"mlp", "lm", "nmt", "resnet", "gnn", "list_reduction"}) {
    CAPTURE(name);
    double firstF32 = 0, firstBf16 = 0;
    const double f32Loss = meanLossAtEnd(name, f32, firstF32);
    const double bf16Loss = meanLossAtEnd(name, bf16, firstBf16);
    MESSAGE(std::string(name) << ": first loss " << firstF32 << ", at the end " << f32Loss << " in f32, " << bf16Loss
                              << " in bf16");
    CHECK(f32Loss < firstF32);
    CHECK(bf16Loss < firstBf16);
    // Within 0.5% on the MLP and 0.01% on the recurrent and graph models. ResNet-20's batch
    // statistics over 16 images make its path chaotic: rounding alone moves its loss here by
    // several percent (its f32 run built for AVX2, whose convolutions round differently, ends
    // at 1.19 instead of 1.27; bf16 at 1.34 and 1.28), so it gets a looser bound.
    const double tolerance = name == "resnet" ? 0.15 : 0.02;
    CHECK(std::abs(bf16Loss - f32Loss) <= tolerance * f32Loss);
  }
}
