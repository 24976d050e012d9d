#include "ops/ConvWinograd.h"

#include "ops/Simd.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace weft::detail {
namespace {

using simd::load;
using simd::store;
using V = simd::Vec<float>;

constexpr int64_t kLanes = simd::kLanes<float>;
constexpr int kTile = 4;                  // outputs per side of a tile
constexpr int kAlpha = kTile + 2;         // inputs per side of a tile
constexpr int kPoints = kAlpha * kAlpha;  // positions of a transformed 6x6 tile

/// One sweep of a 3x3 window at stride 1 over images of `inC` (h, w) planes padded by (ph, pw),
/// to `outC` planes of (h + 2 ph - 2, w + 2 pw - 2). Images are laid out channels-last so that the
/// transforms run on vectors of kLanes channels, and processed in groups whose tiles together fill
/// the matrix products' rows.
struct Sweep {
  int64_t inC, outC, h, w, ph, pw;
  int64_t outH, outW, tilesH, tilesW, tiles;  // tiles per image: (tilesH, tilesW) of 4x4 outputs
  int64_t paddedH, paddedW;                   // the channels-last copy: 6x6 inputs for every tile
  int64_t wholeH, wholeW;                     // the channels-last outputs: 4x4 for every tile
  int64_t groupSize;                          // images per group
  int64_t bandRows;                           // tiles transformed and multiplied at a time

  Sweep(int64_t inC_, int64_t outC_, int64_t h_, int64_t w_, int64_t ph_, int64_t pw_)
      : inC(inC_), outC(outC_), h(h_), w(w_), ph(ph_), pw(pw_) {
    outH = h + 2 * ph - 2;
    outW = w + 2 * pw - 2;
    tilesH = (outH + kTile - 1) / kTile;
    tilesW = (outW + kTile - 1) / kTile;
    tiles = tilesH * tilesW;
    wholeH = kTile * tilesH;
    wholeW = kTile * tilesW;
    paddedH = wholeH + 2;
    paddedW = wholeW + 2;
    // Small planes are grouped so a product has more rows: 8x8 has 4 tiles, grouped by 8 images.
    // More would leave a batch too few groups to share among threads.
    groupSize = std::clamp<int64_t>((64 + tiles - 1) / tiles, 1, 8);
    // Large planes (56x56 has 196 tiles) are cut into bands of tiles whose transformed inputs
    // and products (36 x rows x (inC + outC) floats) take about 256 KiB, half a second-level
    // cache of the smallest CPUs measured. A band keeps at least 32 rows, so that each filter
    // value read is used 32 times: with 128 channels in and out, 32 rows take 1.1 MiB.
    const int64_t cached = (256 << 10) / (kPoints * (inC + outC) * int64_t(sizeof(float)));
    bandRows = std::min(groupSize * tiles, std::max<int64_t>(32, cached / 8 * 8));
  }

  /// Values of one image's channels-last outputs (or output gradients).
  int64_t wholeImage() const { return wholeH * wholeW * outC; }

  /// Floats from one point's transformed inputs to the next, for a band of `rows` tiles: a cache
  /// line more than they take, since 32 rows of 64 channels (or of 32) would put the 36 points
  /// 8 KiB (4 KiB) apart, and the input transform's 36 stores of a tile would then all fall in
  /// one set of the first-level cache.
  int64_t pointStride(int64_t rows) const { return rows * inC + 64 / int64_t(sizeof(float)); }
};

// ---- transforms: F(4x4, 3x3) -------------------------------------------------------------------
//
// Lavin and Gray's construction at the interpolation points 0, 1, -1, 1/2, -2 (and infinity).
// With the usual points 0, 1, -1, 2, -2, tiles of random values summed over 64 channels in float
// erred 3x as much at worst (1.6e-4 against 5e-5 absolute, outputs of about 10), for as many
// operations.

constexpr double G[kAlpha][3] = {{1, 0, 0},
                                 {1.0 / 3, 1.0 / 3, 1.0 / 3},
                                 {-1.0 / 3, 1.0 / 3, -1.0 / 3},
                                 {-16.0 / 15, -8.0 / 15, -4.0 / 15},
                                 {1.0 / 15, -2.0 / 15, 4.0 / 15},
                                 {0, 0, 1}};

/// x0 y0 + x1 y1 + x2 y2, each product added to the sum so far, starting from zero: where the CPU
/// fuses multiply-adds, each addition is one, in this order, rather than a pairing of the
/// compiler's choice.
[[gnu::always_inline]] inline double sumOfProducts(double x0, double y0, double x1, double y1, double x2, double y2) {
  double sum = 0;
  sum += x0 * y0;
  sum += x1 * y1;
  return sum + x2 * y2;
}

/// U[point][in][out] = (G g G^T)[point] of the 3x3 filter g = tap(out, in, .), in double, split
/// across the session's threads by input channel: a filter of 128 x 128 channels is 590k values of
/// U, which would otherwise cost as much as a small batch's products. Each input channel's taps
/// are first laid out by output channel, so that the sums run on vectors of output channels.
template <class Tap>
std::vector<float> transformFilter(const KernelContext& ctx, int64_t inC, int64_t outC, Tap tap) {
  std::vector<float> u(static_cast<size_t>(kPoints * inC * outC));
  ctx.parallelFor(inC, outC * kPoints * 12, [&](int64_t lo, int64_t hi) {
    std::vector<double> taps(static_cast<size_t>(9 * outC)), gg(static_cast<size_t>(kAlpha * 3 * outC));
    for (int64_t c = lo; c < hi; ++c) {
      for (int64_t o = 0; o < outC; ++o)
        for (int t = 0; t < 9; ++t) taps[static_cast<size_t>(t * outC + o)] = tap(o, c, t);
      for (int a = 0; a < kAlpha; ++a) {  // G g
        for (int j = 0; j < 3; ++j) {
          const double *g0 = &taps[static_cast<size_t>(j * outC)], *g1 = g0 + 3 * outC, *g2 = g1 + 3 * outC;
          double* out = &gg[static_cast<size_t>((a * 3 + j) * outC)];
          for (int64_t o = 0; o < outC; ++o) out[o] = sumOfProducts(G[a][0], g0[o], G[a][1], g1[o], G[a][2], g2[o]);
        }
      }
      for (int a = 0; a < kAlpha; ++a) {  // (G g) G^T
        const double *r0 = &gg[static_cast<size_t>(a * 3 * outC)], *r1 = r0 + outC, *r2 = r1 + outC;
        for (int b = 0; b < kAlpha; ++b) {
          float* out = &u[static_cast<size_t>(((a * kAlpha + b) * inC + c) * outC)];
          for (int64_t o = 0; o < outC; ++o)
            out[o] = static_cast<float>(sumOfProducts(r0[o], G[b][0], r1[o], G[b][1], r2[o], G[b][2]));
        }
      }
    }
  });
  return u;
}

/// The filter gradient from the gradient of U (36, out, in): dg = G^T dU G, in double (the columns
/// of dU, then its rows), split across the session's threads by output channel, on vectors of
/// input channels.
void untransformFilterGradient(const KernelContext& ctx, const float* du, int64_t inC, int64_t outC, float* dfilter) {
  ctx.parallelFor(outC, inC * kPoints * 5, [&](int64_t lo, int64_t hi) {
    std::vector<double> gd(static_cast<size_t>(3 * kAlpha * inC)), taps(static_cast<size_t>(9 * inC));
    for (int64_t o = lo; o < hi; ++o) {
      for (int i = 0; i < 3; ++i) {  // G^T dU
        for (int b = 0; b < kAlpha; ++b) {
          double* out = &gd[static_cast<size_t>((i * kAlpha + b) * inC)];
          std::fill(out, out + inC, 0.0);
          for (int a = 0; a < kAlpha; ++a) {
            const float* row = du + ((a * kAlpha + b) * outC + o) * inC;
            for (int64_t c = 0; c < inC; ++c) out[c] += G[a][i] * static_cast<double>(row[c]);
          }
        }
      }
      for (int i = 0; i < 3; ++i) {  // (G^T dU) G
        for (int j = 0; j < 3; ++j) {
          double* out = &taps[static_cast<size_t>((i * 3 + j) * inC)];
          std::fill(out, out + inC, 0.0);
          for (int b = 0; b < kAlpha; ++b) {
            const double* row = &gd[static_cast<size_t>((i * kAlpha + b) * inC)];
            for (int64_t c = 0; c < inC; ++c) out[c] += row[c] * G[b][j];
          }
        }
      }
      for (int64_t c = 0; c < inC; ++c)
        for (int t = 0; t < 9; ++t)
          dfilter[(o * inC + c) * 9 + t] = static_cast<float>(taps[static_cast<size_t>(t * inC + c)]);
    }
  });
}

// The transforms of a tile are two passes of a one-dimensional transform (transform2d below); each
// computes the sums that several of its outputs share once.

/// v = B^T d for B^T = [1 -3/2 -2 3/2 1 0; 0 -1 1/2 5/2 1 0; 0 1 -5/2 1/2 1 0;
///                      0 -2 -1 2 1 0; 0 1/2 -1 -1/2 1 0; 0 1 -3/2 -2 3/2 1].
[[gnu::always_inline]] inline void inputTransform(const V (&d)[kAlpha], V (&v)[kAlpha]) {
  const V d31 = d[3] - d[1], d42 = d[4] - d[2];
  v[0] = d[0] + d[4] - d[2] * 2.0f + d31 * 1.5f;
  v[1] = d[4] - d[1] + d[2] * 0.5f + d[3] * 2.5f;
  v[2] = d[4] + d[1] - d[2] * 2.5f + d[3] * 0.5f;
  v[3] = d42 + d31 * 2.0f;
  v[4] = d42 - d31 * 0.5f;
  v[5] = d[5] + d[1] - d[3] * 2.0f + d42 * 1.5f;
}

/// y = A^T m for A^T = [1 1 1 1 1 0; 0 1 -1 1/2 -2 0; 0 1 1 1/4 4 0; 0 1 -1 1/8 -8 1].
[[gnu::always_inline]] inline void outputTransform(const V (&m)[kAlpha], V (&y)[kTile]) {
  const V sum12 = m[1] + m[2], diff12 = m[1] - m[2];
  y[0] = m[0] + sum12 + m[3] + m[4];
  y[1] = diff12 + m[3] * 0.5f - m[4] * 2.0f;
  y[2] = sum12 + m[3] * 0.25f + m[4] * 4.0f;
  y[3] = diff12 + m[3] * 0.125f - m[4] * 8.0f + m[5];
}

/// z = A g, the transpose of outputTransform: the gradient of m from the gradient g of y.
[[gnu::always_inline]] inline void gradientTransform(const V (&g)[kTile], V (&z)[kAlpha]) {
  const V even = g[0] + g[2], odd = g[1] + g[3];
  z[0] = g[0];
  z[1] = even + odd;
  z[2] = even - odd;
  z[3] = g[0] + g[1] * 0.5f + g[2] * 0.25f + g[3] * 0.125f;
  z[4] = g[0] - g[1] * 2.0f + g[2] * 4.0f - g[3] * 8.0f;
  z[5] = g[3];
}

/// The 2-D transform T x T^T of a tile: `transform1d` (kIn values to kOut) down the columns of the
/// kIn x kIn block whose element (a, b) is get(a, b), then along the rows of the result; calls
/// put(a, b, value) for each element of the kOut x kOut result.
template <int kIn, int kOut, class Get, class Transform1d, class Put>
void transform2d(Get get, Transform1d transform1d, Put put) {
  V columns[kIn][kOut];  // (T x)[a][b], stored by b
  for (int b = 0; b < kIn; ++b) {
    V column[kIn];
    for (int a = 0; a < kIn; ++a) column[a] = get(a, b);
    transform1d(column, columns[b]);
  }
  for (int a = 0; a < kOut; ++a) {
    V row[kIn], out[kOut];
    for (int b = 0; b < kIn; ++b) row[b] = columns[b][a];
    transform1d(row, out);
    for (int b = 0; b < kOut; ++b) put(a, b, out[b]);
  }
}

/// v[point] = (B^T d B)[point] for the 6x6 block whose element (a, b) is load(at(a, b)).
template <class At>
void transformInput(At at, V v[kPoints]) {
  transform2d<kAlpha, kAlpha>([&](int a, int b) { return load(at(a, b)); }, inputTransform,
                              [&](int a, int b, V value) { v[a * kAlpha + b] = value; });
}

/// y = A^T m A, the 4x4 outputs of a tile from its 36 products.
void transformOutput(const V m[kPoints], V y[kTile][kTile]) {
  transform2d<kAlpha, kTile>([&](int a, int b) { return m[a * kAlpha + b]; }, outputTransform,
                             [&](int a, int b, V value) { y[a][b] = value; });
}

/// z = A dy A^T, the gradient of a tile's 36 products from the gradient of its 4x4 outputs.
void transformGradient(const V dy[kTile][kTile], V z[kPoints]) {
  transform2d<kTile, kAlpha>([&](int a, int b) { return dy[a][b]; }, gradientTransform,
                             [&](int a, int b, V value) { z[a * kAlpha + b] = value; });
}

// ---- layouts ---------------------------------------------------------------------------------

/// Where the positions of an (h, w) plane lie in a channels-last array: position (y, x) at
/// first + (y * rowStride + x) * channels, the index of its first channel.
struct PixelLayout {
  int64_t w, rowStride, channels, first;

  /// The indices of `count` positions from p, stepping along rows without a division per value.
  template <int64_t count>
  void indices(int64_t p, int64_t out[count]) const {
    int64_t y = p / w, x = p % w;
    for (int64_t l = 0; l < count; ++l) {
      out[l] = first + (y * rowStride + x) * channels;
      if (++x == w) x = 0, ++y;
    }
  }
};

/// Copies `channels` (a multiple of kLanes) planes of `positions` values from channels-first
/// `planes` to a channels-last array (kToChannelsLast), or back, in kLanes x kLanes blocks
/// transposed in registers; a ragged end of the positions goes value by value. The blocks of a
/// cache line of positions (16 floats, two blocks of AVX2's 8) run one after the other for each
/// chunk of channels, so that each line of a plane is read or written whole before the next
/// chunk's: planes of 1024 floats lie 4 KiB apart and share sets of the first-level cache. On
/// Zen 3 this made 16-channel convolutions on 32x32 planes 4-5% faster.
template <bool kToChannelsLast, class Planes, class Last>
void transposeChannels(Planes* planes, int64_t channels, int64_t positions, Last* last, const PixelLayout& at) {
  constexpr int64_t kLine = std::max<int64_t>(kLanes, 64 / sizeof(float));  // positions a step
  // The kLanes x kLanes block of channels [c0, c0 + kLanes) at positions [p, p + kLanes), the
  // positions' indices in `last` at `index`.
  auto block = [&](int64_t p, const int64_t* index, int64_t c0) {
    V v[kLanes];
    if constexpr (kToChannelsLast) {
      for (int r = 0; r < kLanes; ++r) v[r] = load(planes + (c0 + r) * positions + p);
      simd::transpose(v);
      for (int l = 0; l < kLanes; ++l) store(last + index[l] + c0, v[l]);
    } else {
      for (int l = 0; l < kLanes; ++l) v[l] = load(last + index[l] + c0);
      simd::transpose(v);
      for (int r = 0; r < kLanes; ++r) store(planes + (c0 + r) * positions + p, v[r]);
    }
  };
  int64_t p0 = 0;
  for (; p0 + kLine <= positions; p0 += kLine) {
    int64_t index[kLine];
    at.indices<kLine>(p0, index);
    for (int64_t c0 = 0; c0 < channels; c0 += kLanes) {
      for (int64_t sub = 0; sub < kLine; sub += kLanes) block(p0 + sub, index + sub, c0);
    }
  }
  for (; p0 + kLanes <= positions; p0 += kLanes) {
    int64_t index[kLanes];
    at.indices<kLanes>(p0, index);
    for (int64_t c0 = 0; c0 < channels; c0 += kLanes) block(p0, index, c0);
  }
  for (int64_t p = p0; p < positions; ++p) {
    int64_t index[1];
    at.indices<1>(p, index);
    for (int64_t c = 0; c < channels; ++c) {
      Planes& plane = planes[c * positions + p];
      Last& channel = last[index[0] + c];
      if constexpr (kToChannelsLast) {
        channel = plane;
      } else {
        plane = channel;
      }
    }
  }
}

// ---- the products ----------------------------------------------------------------------------

// A band's transformed inputs are laid out point after point, so that a point's product reads
// its rows as one contiguous run; its products keep a tile's 36 points side by side, so that the
// output transform reads them as contiguous runs of vectors:
//   transformed: point p, chunk q of kLanes input channels, row k (a tile), at
//                p Sweep::pointStride(rows) + (q rows + k) kLanes
//   products:    row k, point p, output channel o, at (k 36 + p) outC + o
constexpr int64_t kRowStride = kLanes;  // between rows of one point's chunk in `transformed`

/// acc[r][j] += sum over `steps` steps s of a[r kRowStep + s kStep] b[s bStep + kLanes j ..]: R rows
/// by NV vectors, accumulated in registers; each value of a is splat across a vector of b. The
/// strides of a are constants, so the inner loop reads every row through one pointer.
template <int R, int NV, int64_t kRowStep, int64_t kStep>
void multiplyAdd(const float* a, int64_t steps, const float* b, int64_t bStep, V (&acc)[R][NV]) {
  for (int64_t step = 0; step < steps; ++step, a += kStep, b += bStep) {
    V row[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) row[j] = load(b + j * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float x = a[r * kRowStep];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[r][j] += row[j] * x;
    }
  }
}

/// m[r][o0 ..) = sum over c of v[r][c] u[c][o0 ..] for R rows of one point and NV vectors of
/// outputs. The rows are kRowStride apart within a chunk of kLanes channels; chunks are
/// `chunkStride` apart.
template <int R, int NV>
void productTile(const float* v, int64_t chunks, int64_t chunkStride, const float* u, int64_t outC, float* m,
                 int64_t mRowStride) {
  V acc[R][NV] = {};
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    multiplyAdd<R, NV, kRowStride, 1>(v + chunk * chunkStride, kLanes, u + chunk * kLanes * outC, outC, acc);
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NV; ++j) store(m + r * mRowStride + j * kLanes, acc[r][j]);
  }
}

/// Rows [r0, rows) of one point's product for NV vectors of outputs from o0: tiles of R rows,
/// then the rest of a band in tiles of R / 2, R / 4, ... rows.
template <int R, int NV>
void productRows(const float* v, int64_t r0, int64_t rows, int64_t inC, const float* u, int64_t outC, float* m) {
  const int64_t chunks = inC / kLanes, chunkStride = rows * kRowStride, mRowStride = kPoints * outC;
  for (; r0 + R <= rows; r0 += R) {
    productTile<R, NV>(v + r0 * kRowStride, chunks, chunkStride, u, outC, m + r0 * mRowStride, mRowStride);
  }
  if constexpr (R > 1) productRows<R / 2, NV>(v, r0, rows, inC, u, outC, m);
}

/// One point's product: m (rows, outC) = v (rows, inC) x u (inC, outC), from the point's first
/// values in `transformed` and `products`, in tiles of R rows x NV vectors of outputs.
template <int R, int NV>
void product(const float* v, int64_t rows, int64_t inC, const float* u, int64_t outC, float* m) {
  for (int64_t o0 = 0; o0 < outC; o0 += NV * kLanes) productRows<R, NV>(v, 0, rows, inC, u + o0, outC, m + o0);
}

/// Accumulators of a register tile: as many as hide the multiply-add latency while the tile,
/// the NV vectors it loads and the splat value still fit the register file (16 of AVX-512's
/// 32 registers, 8 of AVX2's 16).
constexpr int kAccumulators = simd::kVectorRegisters >= 32 ? 16 : 8;

/// Calls f.template operator()<R, NV>() with the widest tile of outputs that divides outC, NV
/// vectors (4, 2 or 1), and R = kAccumulators / NV rows.
template <int NV = 4, class F>
void withOutputTile(int64_t outC, F f) {
  constexpr int R = kAccumulators / NV;
  if constexpr (NV == 1) {
    f.template operator()<R, 1>();
  } else {
    if (outC % (NV * kLanes) == 0) return f.template operator()<R, NV>();
    withOutputTile<NV / 2>(outC, f);
  }
}

/// The forward and input-gradient products: their rows are tiles, of which any number can share
/// a register tile, so with 16 registers a tile takes 12 accumulators, 6 rows by 2 vectors (with
/// the 2 vectors of the filter and the splat value, 15 registers), where withOutputTile's 8
/// left the multiply-adds waiting on loads. Each output is summed in the same order either way.
void product(const float* v, int64_t rows, int64_t inC, const float* u, int64_t outC, float* m) {
  if constexpr (simd::kVectorRegisters < 32) {
    if (outC % (2 * kLanes) == 0) return product<6, 2>(v, rows, inC, u, outC, m);
  }
  withOutputTile(outC, [&]<int R, int NV>() { product<R, NV>(v, rows, inC, u, outC, m); });
}

/// acc[o0 + r][c0 + kLanes j ..] += sum over rows k of z[k][o0 + r] v[k][c0 + kLanes j ..] for R
/// output channels by NV vectors of input channels: the filter gradient's product, summed over
/// tiles. The gradients' values are splat, the transformed inputs' chunks (`chunkStride` apart)
/// loaded.
template <int R, int NV>
void accumulateTile(const float* z, int64_t zRowStride, const float* v, int64_t chunkStride, int64_t rows, float* acc,
                    int64_t inC) {
  V sum[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NV; ++j) sum[r][j] = load(acc + r * inC + j * kLanes);
  }
  for (int64_t k = 0; k < rows; ++k, z += zRowStride, v += kRowStride) {
    V chunk[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) chunk[j] = load(v + j * chunkStride);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float x = z[r];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) sum[r][j] += chunk[j] * x;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NV; ++j) store(acc + r * inC + j * kLanes, sum[r][j]);
  }
}

/// Output channels [o0, outC) of one point's gradient product, in tiles of R output channels,
/// then the rest in tiles of R / 2, R / 4, ...
template <int R, int NV>
void accumulateChannels(const float* v, int64_t rows, int64_t inC, const float* z, int64_t o0, int64_t outC,
                        float* acc) {
  const int64_t chunkStride = rows * kRowStride, zRowStride = kPoints * outC;
  for (; o0 + R <= outC; o0 += R) {
    for (int64_t c0 = 0; c0 < inC; c0 += NV * kLanes) {
      accumulateTile<R, NV>(z + o0, zRowStride, v + c0 / kLanes * chunkStride, chunkStride, rows, acc + o0 * inC + c0,
                            inC);
    }
  }
  if constexpr (R > 1) accumulateChannels<R / 2, NV>(v, rows, inC, z, o0, outC, acc);
}

/// One point's gradient product: acc (outC, inC) += z (rows, outC)^T x v (rows, inC), from the
/// point's first values in `transformed` and the transformed gradients (laid out as products).
/// Its tiles run along the input channels, whose chunks of the transformed inputs are vectors:
/// 12 accumulators with 16 registers (6 output channels x 2 vectors), 16 with 32. A tile along
/// the output channels, with the inputs splat, would have to stay within a chunk of kLanes
/// input channels, and fit 8 accumulators in 16 registers.
void accumulate(const float* v, int64_t rows, int64_t inC, const float* z, int64_t outC, float* acc) {
  constexpr int R = simd::kVectorRegisters >= 32 ? 8 : 6;
  if (inC % (2 * kLanes) == 0) return accumulateChannels<R, 2>(v, rows, inC, z, 0, outC, acc);
  accumulateChannels<2 * R, 1>(v, rows, inC, z, 0, outC, acc);
}

// ---- one group of images -----------------------------------------------------------------------

/// A thread's buffers for one sweep, 64-byte aligned so that rows of whole vectors are aligned
/// vectors. They are kept from call to call: they take hundreds of kilobytes, and fresh ones would
/// cost page faults and zeroing on every call.
struct Workspace {
  float *padded, *transformed, *products, *outputs;

  explicit Workspace(const Sweep& s) {
    const int64_t paddedSize = s.groupSize * s.paddedH * s.paddedW * s.inC;
    const int64_t sizes[4] = {paddedSize, kPoints * s.pointStride(s.bandRows), kPoints * s.bandRows * s.outC,
                              s.groupSize * s.wholeImage()};
    constexpr int64_t kLine = 64 / sizeof(float);  // floats per 64 bytes, whatever the vector width
    const auto lines = [](int64_t size) { return (size + kLine - 1) / kLine * kLine; };
    thread_local std::vector<float> storage;
    int64_t total = kLine;  // room to align the start
    for (int64_t size : sizes) total += lines(size);
    if (static_cast<int64_t>(storage.size()) < total) storage.resize(static_cast<size_t>(total));
    const auto address = reinterpret_cast<uintptr_t>(storage.data());
    float* next = storage.data() + (64 - address % 64) % 64 / sizeof(float);
    float** parts[4] = {&padded, &transformed, &products, &outputs};
    for (int i = 0; i < 4; ++i) {
      *parts[i] = next;
      next += lines(sizes[i]);
    }
  }
};

/// Zeroes what lies outside the image in a padded channels-last copy: the rows above and below
/// it, and the columns left and right of it in its rows.
void zeroBorder(const Sweep& s, float* image) {
  const int64_t row = s.paddedW * s.inC, left = s.pw * s.inC, right = (s.paddedW - s.pw - s.w) * s.inC;
  std::fill(image, image + s.ph * row, 0.0f);
  std::fill(image + (s.ph + s.h) * row, image + s.paddedH * row, 0.0f);
  for (int64_t y = s.ph; y < s.ph + s.h; ++y) {
    std::fill(image + y * row, image + y * row + left, 0.0f);
    std::fill(image + (y + 1) * row - right, image + (y + 1) * row, 0.0f);
  }
}

/// One group's images, channels-last and padded: (count, paddedH, paddedW, inC).
void loadImages(const Sweep& s, const float* in, int64_t count, float* padded) {
  const int64_t paddedImage = s.paddedH * s.paddedW * s.inC;
  for (int64_t img = 0; img < count; ++img) {
    zeroBorder(s, padded + img * paddedImage);
    const PixelLayout at{s.w, s.paddedW, s.inC, img * paddedImage + (s.ph * s.paddedW + s.pw) * s.inC};
    transposeChannels<true>(in + img * s.inC * s.h * s.w, s.inC, s.h * s.w, padded, at);
  }
}

/// Rows [first, first + rows) of a group: its tiles, image after image, each by rows of tiles.
struct Band {
  int64_t first, rows;
};

/// Where a tile lies: its image in the group and its tile row and column.
struct TilePosition {
  int64_t img, ty, tx;
};
TilePosition tileAt(const Sweep& s, int64_t row) { return {row / s.tiles, row % s.tiles / s.tilesW, row % s.tilesW}; }

/// Where a tile's first output lies in the channels-last outputs (or output gradients).
int64_t outputCorner(const Sweep& s, const TilePosition& t) {
  return ((t.img * s.wholeH + kTile * t.ty) * s.wholeW + kTile * t.tx) * s.outC;
}

/// transformed (36 points, a band's rows, inC; in chunks of kLanes channels) from the padded
/// images.
void transformInputs(const Sweep& s, const float* padded, const Band& band, float* transformed) {
  const int64_t pointStride = s.pointStride(band.rows), rowStep = s.paddedW * s.inC;
  for (int64_t k = 0; k < band.rows; ++k) {
    const TilePosition t = tileAt(s, band.first + k);
    const float* corner = padded + ((t.img * s.paddedH + kTile * t.ty) * s.paddedW + kTile * t.tx) * s.inC;
    for (int64_t c = 0; c < s.inC; c += kLanes) {
      V v[kPoints];
      transformInput([&](int a, int b) { return corner + a * rowStep + b * s.inC + c; }, v);
      float* tile = transformed + (c / kLanes * band.rows + k) * kRowStride;
      for (int p = 0; p < kPoints; ++p) store(tile + p * pointStride, v[p]);
    }
  }
}

/// A band's outputs, channels-last in whole tiles, (4 tilesH, 4 tilesW, outC) per image, from its
/// products.
void transformOutputs(const Sweep& s, const float* products, const Band& band, float* outputs) {
  for (int64_t k = 0; k < band.rows; ++k) {
    float* corner = outputs + outputCorner(s, tileAt(s, band.first + k));
    for (int64_t o = 0; o < s.outC; o += kLanes) {
      V m[kPoints], y[kTile][kTile];
      for (int p = 0; p < kPoints; ++p) m[p] = load(products + (k * kPoints + p) * s.outC + o);
      transformOutput(m, y);
      for (int a = 0; a < kTile; ++a) {
        for (int b = 0; b < kTile; ++b) store(corner + (a * s.wholeW + b) * s.outC + o, y[a][b]);
      }
    }
  }
}

/// out (count, outC, outH, outW) from the channels-last outputs; rows and columns past (outH,
/// outW), the rest of partial tiles, are dropped.
void storeImages(const Sweep& s, const float* outputs, int64_t count, float* out) {
  for (int64_t img = 0; img < count; ++img) {
    const PixelLayout at{s.outW, s.wholeW, s.outC, img * s.wholeImage()};
    transposeChannels<false>(out + img * s.outC * s.outH * s.outW, s.outC, s.outH * s.outW, outputs, at);
  }
}

/// A group's output gradient channels-last in whole tiles, as transformOutputs lays out outputs,
/// with zeros past (outH, outW), where partial tiles have no outputs.
void loadGradients(const Sweep& s, const float* dy, int64_t count, float* last) {
  const int64_t row = s.wholeW * s.outC;
  for (int64_t img = 0; img < count; ++img) {
    float* image = last + img * s.wholeImage();
    std::fill(image + s.outH * row, image + s.wholeImage(), 0.0f);
    if (s.outW < s.wholeW) {
      for (int64_t y = 0; y < s.outH; ++y) std::fill(image + y * row + s.outW * s.outC, image + (y + 1) * row, 0.0f);
    }
    const PixelLayout at{s.outW, s.wholeW, s.outC, img * s.wholeImage()};
    transposeChannels<true>(dy + img * s.outC * s.outH * s.outW, s.outC, s.outH * s.outW, last, at);
  }
}

/// z (a band's rows, 36 points, outC; laid out as products) from the channels-last output
/// gradient.
void transformGradients(const Sweep& s, const float* last, const Band& band, float* z) {
  for (int64_t k = 0; k < band.rows; ++k) {
    const float* corner = last + outputCorner(s, tileAt(s, band.first + k));
    for (int64_t o = 0; o < s.outC; o += kLanes) {
      V dy[kTile][kTile], g[kPoints];
      for (int a = 0; a < kTile; ++a) {
        for (int b = 0; b < kTile; ++b) dy[a][b] = load(corner + (a * s.wholeW + b) * s.outC + o);
      }
      transformGradient(dy, g);
      for (int p = 0; p < kPoints; ++p) store(z + (k * kPoints + p) * s.outC + o, g[p]);
    }
  }
}

/// Calls f(band) for the bands of a group of `count` images, in order.
template <class F>
void forEachBand(const Sweep& s, int64_t count, F f) {
  const int64_t total = count * s.tiles;
  for (int64_t first = 0; first < total; first += s.bandRows) f(Band{first, std::min(s.bandRows, total - first)});
}

/// Runs `count` images from `in` (count, inC, h, w) to `out` (count, outC, outH, outW).
void sweepGroup(const Sweep& s, const std::vector<float>& u, const float* in, int64_t count, float* out,
                Workspace& ws) {
  loadImages(s, in, count, ws.padded);
  forEachBand(s, count, [&](const Band& band) {
    transformInputs(s, ws.padded, band, ws.transformed);
    for (int p = 0; p < kPoints; ++p) {
      product(ws.transformed + p * s.pointStride(band.rows), band.rows, s.inC, u.data() + p * s.inC * s.outC, s.outC,
              ws.products + p * s.outC);
    }
    transformOutputs(s, ws.products, band, ws.outputs);
  });
  storeImages(s, ws.outputs, count, out);
}

/// out (n, outC, ...) = in (n, inC, ...) swept by the transformed filter u, groups of images
/// split across the session's threads. Each output is summed in the same order whatever the
/// grouping, so results do not depend on the thread count.
void sweep(const KernelContext& ctx, int64_t n, const Sweep& s, const std::vector<float>& u, const float* in,
           float* out) {
  const int64_t groups = (n + s.groupSize - 1) / s.groupSize;
  const int64_t inSize = s.inC * s.h * s.w, outSize = s.outC * s.outH * s.outW;
  ctx.parallelFor(groups, s.groupSize * s.tiles * kPoints * s.inC * s.outC, [&](int64_t lo, int64_t hi) {
    Workspace ws(s);
    for (int64_t g = lo; g < hi; ++g) {
      const int64_t first = g * s.groupSize, count = std::min(s.groupSize, n - first);
      sweepGroup(s, u, in + first * inSize, count, out + first * outSize, ws);
    }
  });
}

/// Adds the gradient of U from images [first, end) to acc (36, o, c), group by group, band by band.
void accumulateImages(const Sweep& s, const float* x, const float* dy, int64_t first, int64_t end, Workspace& ws,
                      float* acc) {
  const int64_t inSize = s.inC * s.h * s.w, dySize = s.outC * s.outH * s.outW;
  for (; first < end; first += s.groupSize) {
    const int64_t count = std::min(s.groupSize, end - first);
    loadImages(s, x + first * inSize, count, ws.padded);
    loadGradients(s, dy + first * dySize, count, ws.outputs);
    forEachBand(s, count, [&](const Band& band) {
      transformInputs(s, ws.padded, band, ws.transformed);
      transformGradients(s, ws.outputs, band, ws.products);
      for (int p = 0; p < kPoints; ++p) {
        accumulate(ws.transformed + p * s.pointStride(band.rows), band.rows, s.inC, ws.products + p * s.outC, s.outC,
                   acc + p * s.inC * s.outC);
      }
    });
  }
}

/// partials[0 .. size) = the sum of `blocks` partial sums `size` apart, added in block order, a
/// vector at a time.
void sumBlocks(const KernelContext& ctx, float* partials, int64_t blocks, int64_t size) {
  ctx.parallelFor(size / kLanes, blocks * kLanes, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo * kLanes; i < hi * kLanes; i += kLanes) {
      V total = load(partials + i);
      for (int64_t blk = 1; blk < blocks; ++blk) total += load(partials + blk * size + i);
      store(partials + i, total);
    }
  });
}

}  // namespace

// Above 128 channels in or out the transformed filter (36 c o floats, 2.3 MiB at 128 x 128) no
// longer stays in the second-level cache across a band's products, and the kernels measured no
// faster than the direct ones (docs/benchmarks.md). Channels come in 16s on every target (a whole number
// of vectors of any width), so which convolutions run here does not depend on the build's CPU.
bool winogradConvApplies(const DirectConv& s) {
  constexpr int64_t kChannelMultiple = 16;
  static_assert(kChannelMultiple % kLanes == 0);
  return s.stride == 1 && s.c > 0 && s.o > 0 && s.c % kChannelMultiple == 0 && s.o % kChannelMultiple == 0 &&
         s.c <= 128 && s.o <= 128 && s.n > 0 && s.outH() > 0 && s.outW() > 0;
}

void winogradConvForward(const KernelContext& ctx, const DirectConv& s, const float* x, const float* filter, float* y) {
  const Sweep plan(s.c, s.o, s.h, s.w, s.ph, s.pw);
  const auto u =
      transformFilter(ctx, s.c, s.o, [&](int64_t o, int64_t c, int64_t t) { return filter[(o * s.c + c) * 9 + t]; });
  sweep(ctx, s.n, plan, u, x, y);
}

// dx[c][y][x] = sum over o, (i, j) of w[o][c][i][j] dy[o][y + ph - i][x + pw - j]: a sweep of dy
// padded by (2 - ph, 2 - pw) with the filter w'[c][o][2 - i][2 - j].
void winogradConvBackpropInput(const KernelContext& ctx, const DirectConv& s, const float* dy, const float* filter,
                               float* dx) {
  const Sweep plan(s.o, s.c, s.outH(), s.outW(), 2 - s.ph, 2 - s.pw);
  const auto u = transformFilter(ctx, s.o, s.c,
                                 [&](int64_t c, int64_t o, int64_t t) { return filter[(o * s.c + c) * 9 + (8 - t)]; });
  sweep(ctx, s.n, plan, u, dy, dx);
}

// dfilter = G^T dU G, where dU[point] (o, c) = sum over tiles of (B^T d B)[point] (A dy A^T)[point]:
// the forward product's gradient with respect to the transformed filter.
void winogradConvBackpropFilter(const KernelContext& ctx, const DirectConv& s, const float* x, const float* dy,
                                float* dfilter) {
  const Sweep plan(s.c, s.o, s.h, s.w, s.ph, s.pw);
  const ImageBlocks blocks(s.n);
  const int64_t accSize = kPoints * s.c * s.o;
  std::vector<float> partials(static_cast<size_t>(blocks.count * accSize), 0.0f);
  ctx.parallelFor(blocks.count, blocks.perBlock * plan.tiles * accSize, [&](int64_t lo, int64_t hi) {
    Workspace ws(plan);
    for (int64_t blk = lo; blk < hi; ++blk) {
      accumulateImages(plan, x, dy, blocks.begin(blk), blocks.end(blk), ws, partials.data() + blk * accSize);
    }
  });
  sumBlocks(ctx, partials.data(), blocks.count, accSize);
  untransformFilterGradient(ctx, partials.data(), s.c, s.o, dfilter);
}

}  // namespace weft::detail
