// Batch normalisation over every axis but 1 (the channel axis of (N, C) and (N, C, H, W)), in
// training mode (batch statistics) and inference mode (given statistics), with fused backward
// ops. Kernels view x as (N, C, S), split the channels across the pool and accumulate in double,
// in interleaved partial sums held in vectors.
#include "ops/NormFormulas.h"
#include "ops/OpUtil.h"
#include "ops/Simd.h"
#include "ops/cuda/Kernels.h"

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

namespace weft {
namespace {

using detail::inFloat32;

// ---- layout --------------------------------------------------------------------------------

/// x as (N, C, S): S is the product of the axes after the channel axis.
struct ChannelLayout {
  int64_t n, c, s;

  int64_t perChannel() const { return n * s; }  // M, the elements that share a channel's statistics
};

ChannelLayout channelLayout(const Shape& x) {
  int64_t s = 1;
  for (int i = 2; i < x.rank(); ++i) s *= x[i];
  return {x[0], x[1], s};
}

using Coeffs = std::vector<double>;  // one value per channel of a block

/// Calls f(channel - lo, offset) for every contiguous run of S elements of channels [lo, hi), in
/// memory order, so that both (N, C) and (N, C, H, W) inputs are read sequentially.
template <class F>
void sweep(const ChannelLayout& l, int64_t lo, int64_t hi, F f) {
  for (int64_t i = 0; i < l.n; ++i) {
    for (int64_t ch = lo; ch < hi; ++ch) f(ch - lo, (i * l.c + ch) * l.s);
  }
}

/// Splits the channels across the pool; `passes` is the number of sweeps over x per channel.
template <class F>
void forChannelBlocks(const KernelContext& ctx, const ChannelLayout& l, int64_t passes, F f) {
  ctx.parallelFor(l.c, passes * l.perChannel(), f);
}

template <class T>
Coeffs load(const T* p, int64_t lo, int64_t hi) {
  return Coeffs(p + lo, p + hi);
}

/// (sum of first(u_j), sum of second(u_j, w_j)) over j in [0, n), in double
/// (detail::simd::interleavedSums): a result does not depend on how the channels were split.
template <class T, class A, class B>
std::pair<double, double> pairedSums(int64_t n, const T* u, const T* w, A first, B second) {
  const auto sums = detail::simd::interleavedSums<2>(n, u, w, [&](auto x, auto y) {
    return std::array{first(x), second(x, y)};
  });
  return {sums[0], sums[1]};
}

/// out = scale * x + shift, per channel; with `relu`, max(0, that) (NaN stays NaN, as ReLU's).
template <class T>
void affine(const ChannelLayout& l, int64_t lo, int64_t hi, const T* x, const Coeffs& scale, const Coeffs& shift,
            T* out, bool relu = false) {
  sweep(l, lo, hi, [&](int64_t k, int64_t off) {
    for (int64_t j = 0; j < l.s; ++j) out[off + j] = static_cast<T>(scale[k] * x[off + j] + shift[k]);
    // ReLU as the Relu op computes it (Eigen's max, max(y, 0) = y < 0 ? 0 : y), in a second pass
    // over what is still in L1: a conditional in the loop above keeps GCC from vectorising it
    // for AVX2, which made BatchNormReluTrain six times slower than BatchNormTrain.
    if (relu) {
      Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> y(out + off, l.s);
      y = y.max(T(0));
    }
  });
}

/// Per channel: sum(dy) and sum(dy * xhat) with xhat = (x - mean) * invstd.
template <class T>
void gradSums(const ChannelLayout& l, int64_t lo, int64_t hi, const T* dy, const T* x, const Coeffs& mean,
              const Coeffs& invstd, Coeffs& sumDy, Coeffs& sumDyXhat) {
  sumDy.assign(static_cast<size_t>(hi - lo), 0.0);
  sumDyXhat.assign(static_cast<size_t>(hi - lo), 0.0);
  sweep(l, lo, hi, [&](int64_t k, int64_t off) {
    const T* g = dy + off;
    const T* v = x + off;
    const double mu = mean[k];
    const auto [a, b] = pairedSums(
        l.s, g, v, [](auto dyj) { return dyj; }, [&](auto dyj, auto xj) { return dyj * (xj - mu); });
    sumDy[k] += a;
    sumDyXhat[k] += b * invstd[k];
  });
}

using norm::gradCoefficients;

/// dx = a * dy + b * (x - mean) + c, per channel.
template <class T>
void combineGrad(const ChannelLayout& l, int64_t lo, int64_t hi, const T* dy, const T* x, const Coeffs& mean,
                 const Coeffs& a, const Coeffs& b, const Coeffs& c, T* dx) {
  sweep(l, lo, hi, [&](int64_t k, int64_t off) {
    for (int64_t j = 0; j < l.s; ++j) {
      dx[off + j] = static_cast<T>(a[k] * dy[off + j] + b[k] * (x[off + j] - mean[k]) + c[k]);
    }
  });
}

// ---- kernels -------------------------------------------------------------------------------

// Inputs x, gamma, beta; outputs y, mean (C), biased var (C), invstd = 1 / sqrt(var + eps) (C);
// with `relu`, y = max(0, normalised x) (BatchNormReluTrain).
void batchNormTrain(KernelContext& ctx, bool relu) {
  const Tensor& x = ctx.input(0);
  const ChannelLayout l = channelLayout(x.shape());
  const double eps = ctx.attrs().getFloat("epsilon");
  const double m = static_cast<double>(l.perChannel());
  dispatchFloat(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    const T* gamma = ctx.input(1).data<T>();
    const T* beta = ctx.input(2).data<T>();
    T* outMean = ctx.output(1).data<T>();
    T* outVar = ctx.output(2).data<T>();
    T* outInvstd = ctx.output(3).data<T>();
    forChannelBlocks(ctx, l, 3, [&](int64_t lo, int64_t hi) {
      const size_t width = static_cast<size_t>(hi - lo);
      Coeffs mean(width, 0.0), var(width, 0.0), scale(width), shift(width), pivot(width, 0.0);
      // One pass of sums about a pivot, a value of the channel itself, keeps the variance accurate
      // when |mean| >> stddev, as a second pass about the mean would, at one read of x.
      if (l.n > 0 && l.s > 0) {
        for (size_t k = 0; k < width; ++k) pivot[k] = px[(lo + static_cast<int64_t>(k)) * l.s];
      }
      sweep(l, lo, hi, [&](int64_t k, int64_t off) {
        const T* v = px + off;
        const double p = pivot[k];
        const auto [shifted, squares] = pairedSums(
            l.s, v, v, [&](auto xj) { return xj - p; }, [&](auto xj, auto) { return (xj - p) * (xj - p); });
        mean[k] += shifted;
        var[k] += squares;
      });
      for (size_t k = 0; k < width; ++k) {
        const int64_t ch = lo + static_cast<int64_t>(k);
        const double shiftedMean = m > 0 ? mean[k] / m : 0.0;
        mean[k] = pivot[k] + shiftedMean;
        var[k] = m > 0 ? std::max(0.0, var[k] / m - shiftedMean * shiftedMean) : 0.0;
        const double invstd = 1.0 / std::sqrt(var[k] + eps);
        scale[k] = gamma[ch] * invstd;
        shift[k] = beta[ch] - mean[k] * scale[k];
        outMean[ch] = static_cast<T>(mean[k]);
        outVar[ch] = static_cast<T>(var[k]);
        outInvstd[ch] = static_cast<T>(invstd);
      }
      affine(l, lo, hi, px, scale, shift, ctx.output(0).data<T>(), relu);
    });
  });
}

void batchNormTrainKernel(KernelContext& ctx) { batchNormTrain(ctx, false); }
void batchNormReluTrainKernel(KernelContext& ctx) { batchNormTrain(ctx, true); }

// Inputs dy, x, gamma, mean, invstd[, dmean, dvar]; outputs dx, dgamma, dbeta:
//   dx = gamma invstd / M (M dy - sum(dy) - xhat sum(dy xhat)) + dmean / M + 2 dvar (x - mean) / M
//   dgamma = sum(dy xhat), dbeta = sum(dy)
void batchNormGradKernel(KernelContext& ctx) {
  const Tensor &dy = ctx.input(0), &x = ctx.input(1);
  const ChannelLayout l = channelLayout(x.shape());
  const bool statGrads = ctx.numInputs() == 7;
  const double m = static_cast<double>(l.perChannel());
  dispatchFloat(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* pdy = dy.data<T>();
    const T* px = x.data<T>();
    const T* gamma = ctx.input(2).data<T>();
    T* dgamma = ctx.output(1).data<T>();
    T* dbeta = ctx.output(2).data<T>();
    forChannelBlocks(ctx, l, 2, [&](int64_t lo, int64_t hi) {
      const Coeffs mean = load(ctx.input(3).data<T>(), lo, hi), invstd = load(ctx.input(4).data<T>(), lo, hi);
      const size_t width = static_cast<size_t>(hi - lo);
      Coeffs sumDy, sumDyXhat, a(width), b(width), c(width);
      gradSums(l, lo, hi, pdy, px, mean, invstd, sumDy, sumDyXhat);
      for (size_t k = 0; k < width; ++k) {
        const int64_t ch = lo + static_cast<int64_t>(k);
        const double dmean = statGrads ? ctx.input(5).data<T>()[ch] : 0.0;
        const double dvar = statGrads ? ctx.input(6).data<T>()[ch] : 0.0;
        gradCoefficients(gamma[ch], invstd[k], m, sumDy[k], sumDyXhat[k], dmean, dvar, a[k], b[k], c[k]);
        dgamma[ch] = static_cast<T>(sumDyXhat[k]);
        dbeta[ch] = static_cast<T>(sumDy[k]);
      }
      combineGrad(l, lo, hi, pdy, px, mean, a, b, c, ctx.output(0).data<T>());
    });
  });
}

/// out = dy where mask > 0, else 0: ReLU's gradient (ReluGrad) for the fused ops.
void maskByRelu(const KernelContext& ctx, const Tensor& dy, const Tensor& mask, Tensor& out) {
  dispatchFloat(dy.dtype(), [&](auto z) {
    using T = decltype(z);
    using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
    const T* g = dy.data<T>();
    const T* r = mask.data<T>();
    T* o = out.data<T>();
    ctx.parallelFor(dy.numel(), 1, [&](int64_t lo, int64_t hi) {
      // As a select, which Eigen vectorises; GCC leaves a conditional in a loop scalar on AVX2.
      const Eigen::Map<const Array> grad(g + lo, hi - lo), kept(r + lo, hi - lo);
      Eigen::Map<Array>(o + lo, hi - lo) = (kept > T(0)).select(grad, T(0));
    });
  });
}

// BatchNormReluGrad: inputs dy, x, gamma, mean, invstd, y (the forward's ReLU output)[, dmean,
// dvar]; BatchNormGrad of dy masked where y is not positive (ReLU's gradient, fused). The masked
// dy is written where dx goes, which BatchNormGrad then reads and overwrites element by element:
// a tensor of its own, newly allocated at every step, cost more in page faults than the masking.
void batchNormReluGradKernel(KernelContext& ctx) {
  Tensor& dx = ctx.output(0);
  maskByRelu(ctx, ctx.input(0), ctx.input(5), dx);
  KernelContext unfused = ctx;
  unfused.inputs = {&dx, ctx.inputs[1], ctx.inputs[2], ctx.inputs[3], ctx.inputs[4]};
  if (ctx.numInputs() == 8) unfused.inputs.insert(unfused.inputs.end(), {ctx.inputs[6], ctx.inputs[7]});
  batchNormGradKernel(unfused);
}

// ---- a batch split across workers ---------------------------------------------------------
// The distribution layer replaces BatchNormTrain and BatchNormGrad by these when workers share a
// batch: each worker computes per-channel moments that add up across workers, the moments are
// summed by an AllReduce, and the normalisation (or the gradient) is finished from the sums, so
// every worker normalises with the statistics of the total batch. Moments are f64.

// moments (3, C): the count, sum(x) and sum(x^2) of each channel.
void momentsKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const ChannelLayout l = channelLayout(x.shape());
  double* out = ctx.output(0).data<double>();
  dispatchFloat(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    forChannelBlocks(ctx, l, 1, [&](int64_t lo, int64_t hi) {
      Coeffs sum(static_cast<size_t>(hi - lo), 0.0), squares(sum);
      sweep(l, lo, hi, [&](int64_t k, int64_t off) {
        const T* v = px + off;
        const auto [s1, s2] = pairedSums(
            l.s, v, v, [](auto xj) { return xj; }, [](auto xj, auto) { return xj * xj; });
        sum[static_cast<size_t>(k)] += s1;
        squares[static_cast<size_t>(k)] += s2;
      });
      for (int64_t ch = lo; ch < hi; ++ch) {
        out[ch] = static_cast<double>(l.perChannel());
        out[l.c + ch] = sum[static_cast<size_t>(ch - lo)];
        out[2 * l.c + ch] = squares[static_cast<size_t>(ch - lo)];
      }
    });
  });
}

// Inputs x, gamma, beta, summed moments (3, C); outputs as BatchNormTrain's (BatchNormReluTrain's
// with the attribute "relu").
void normalizeFromMomentsKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const ChannelLayout l = channelLayout(x.shape());
  const double eps = ctx.attrs().getFloat("epsilon");
  const double* moments = ctx.input(3).data<double>();
  dispatchFloat(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* gamma = ctx.input(1).data<T>();
    const T* beta = ctx.input(2).data<T>();
    forChannelBlocks(ctx, l, 1, [&](int64_t lo, int64_t hi) {
      Coeffs scale(static_cast<size_t>(hi - lo)), shift(scale);
      for (int64_t ch = lo; ch < hi; ++ch) {
        const double m = moments[ch];
        const double mean = m > 0 ? moments[l.c + ch] / m : 0.0;
        const double var = m > 0 ? std::max(0.0, moments[2 * l.c + ch] / m - mean * mean) : 0.0;
        const double invstd = 1.0 / std::sqrt(var + eps);
        const auto k = static_cast<size_t>(ch - lo);
        scale[k] = gamma[ch] * invstd;
        shift[k] = beta[ch] - mean * scale[k];
        ctx.output(1).data<T>()[ch] = static_cast<T>(mean);
        ctx.output(2).data<T>()[ch] = static_cast<T>(var);
        ctx.output(3).data<T>()[ch] = static_cast<T>(invstd);
      }
      affine(l, lo, hi, x.data<T>(), scale, shift, ctx.output(0).data<T>(), ctx.attrs().get<bool>("relu", false));
    });
  });
}

// Inputs dy, x, mean, invstd[, dmean, dvar]; output (4, C): sum(dy), sum(dy xhat), dmean, dvar
// (0 when not given): what adds up across workers in BatchNormGrad.
void gradMomentsKernel(KernelContext& ctx) {
  const Tensor &dy = ctx.input(0), &x = ctx.input(1);
  const ChannelLayout l = channelLayout(x.shape());
  double* out = ctx.output(0).data<double>();
  dispatchFloat(x.dtype(), [&](auto z) {
    using T = decltype(z);
    forChannelBlocks(ctx, l, 2, [&](int64_t lo, int64_t hi) {
      const Coeffs mean = load(ctx.input(2).data<T>(), lo, hi), invstd = load(ctx.input(3).data<T>(), lo, hi);
      Coeffs sumDy, sumDyXhat;
      gradSums(l, lo, hi, dy.data<T>(), x.data<T>(), mean, invstd, sumDy, sumDyXhat);
      for (int64_t ch = lo; ch < hi; ++ch) {
        const auto k = static_cast<size_t>(ch - lo);
        out[ch] = sumDy[k];
        out[l.c + ch] = sumDyXhat[k];
        out[2 * l.c + ch] = ctx.numInputs() == 6 ? double(ctx.input(4).data<T>()[ch]) : 0.0;
        out[3 * l.c + ch] = ctx.numInputs() == 6 ? double(ctx.input(5).data<T>()[ch]) : 0.0;
      }
    });
  });
}

// Inputs dy, x, gamma, mean, invstd, this worker's gradient moments, the summed gradient moments,
// the summed forward moments; outputs dx (from the sums, as BatchNormGrad computes it over the
// total batch), and dgamma, dbeta of this worker's part (the gradient AllReduce adds the parts).
void gradFromMomentsKernel(KernelContext& ctx) {
  const Tensor &dy = ctx.input(0), &x = ctx.input(1);
  const ChannelLayout l = channelLayout(x.shape());
  const double* local = ctx.input(5).data<double>();
  const double* total = ctx.input(6).data<double>();
  const double* moments = ctx.input(7).data<double>();
  dispatchFloat(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* gamma = ctx.input(2).data<T>();
    forChannelBlocks(ctx, l, 1, [&](int64_t lo, int64_t hi) {
      const Coeffs mean = load(ctx.input(3).data<T>(), lo, hi), invstd = load(ctx.input(4).data<T>(), lo, hi);
      const size_t width = static_cast<size_t>(hi - lo);
      Coeffs a(width), b(width), c(width);
      for (int64_t ch = lo; ch < hi; ++ch) {
        const auto k = static_cast<size_t>(ch - lo);
        gradCoefficients(gamma[ch], invstd[k], moments[ch], total[ch], total[l.c + ch], total[2 * l.c + ch],
                         total[3 * l.c + ch], a[k], b[k], c[k]);
        ctx.output(1).data<T>()[ch] = static_cast<T>(local[l.c + ch]);
        ctx.output(2).data<T>()[ch] = static_cast<T>(local[ch]);
      }
      combineGrad(l, lo, hi, dy.data<T>(), x.data<T>(), mean, a, b, c, ctx.output(0).data<T>());
    });
  });
}

/// 1 / sqrt(var + eps) of channels [lo, hi).
template <class T>
Coeffs inverseStd(const T* var, int64_t lo, int64_t hi, double eps) {
  Coeffs out = load(var, lo, hi);
  for (double& v : out) v = 1.0 / std::sqrt(v + eps);
  return out;
}

// y = gamma (x - mean) / sqrt(var + eps) + beta
void batchNormInferenceKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const ChannelLayout l = channelLayout(x.shape());
  const double eps = ctx.attrs().getFloat("epsilon");
  dispatchFloat(x.dtype(), [&](auto z) {
    using T = decltype(z);
    forChannelBlocks(ctx, l, 1, [&](int64_t lo, int64_t hi) {
      const Coeffs invstd = inverseStd(ctx.input(4).data<T>(), lo, hi, eps);
      const Coeffs gamma = load(ctx.input(1).data<T>(), lo, hi), beta = load(ctx.input(2).data<T>(), lo, hi);
      const Coeffs mean = load(ctx.input(3).data<T>(), lo, hi);
      Coeffs scale(invstd.size()), shift(invstd.size());
      for (size_t k = 0; k < invstd.size(); ++k) {
        scale[k] = gamma[k] * invstd[k];
        shift[k] = beta[k] - mean[k] * scale[k];
      }
      affine(l, lo, hi, x.data<T>(), scale, shift, ctx.output(0).data<T>());
    });
  });
}

// Inputs dy, x, gamma, mean, var; outputs dx, dgamma, dbeta, dmean, dvar. With
// invstd = 1 / sqrt(var + eps) and xhat = (x - mean) invstd:
//   dx = gamma invstd dy, dgamma = sum(dy xhat), dbeta = sum(dy),
//   dmean = -gamma invstd sum(dy), dvar = -gamma invstd^2 sum(dy xhat) / 2
void batchNormInferenceGradKernel(KernelContext& ctx) {
  const Tensor &dy = ctx.input(0), &x = ctx.input(1);
  const ChannelLayout l = channelLayout(x.shape());
  const double eps = ctx.attrs().getFloat("epsilon");
  dispatchFloat(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* pdy = dy.data<T>();
    const T* px = x.data<T>();
    const T* gamma = ctx.input(2).data<T>();
    forChannelBlocks(ctx, l, 2, [&](int64_t lo, int64_t hi) {
      const Coeffs mean = load(ctx.input(3).data<T>(), lo, hi);
      const Coeffs invstd = inverseStd(ctx.input(4).data<T>(), lo, hi, eps);
      const size_t width = static_cast<size_t>(hi - lo);
      Coeffs sumDy, sumDyXhat, a(width), zero(width, 0.0);
      gradSums(l, lo, hi, pdy, px, mean, invstd, sumDy, sumDyXhat);
      for (size_t k = 0; k < width; ++k) {
        const int64_t ch = lo + static_cast<int64_t>(k);
        a[k] = gamma[ch] * invstd[k];
        ctx.output(1).data<T>()[ch] = static_cast<T>(sumDyXhat[k]);
        ctx.output(2).data<T>()[ch] = static_cast<T>(sumDy[k]);
        ctx.output(3).data<T>()[ch] = static_cast<T>(-a[k] * sumDy[k]);
        ctx.output(4).data<T>()[ch] = static_cast<T>(-0.5 * a[k] * invstd[k] * sumDyXhat[k]);
      }
      combineGrad(l, lo, hi, pdy, px, mean, a, zero, zero, ctx.output(0).data<T>());
    });
  });
}

// ---- shape functions -----------------------------------------------------------------------

/// The dtype of the per-channel values (parameters, statistics) that go with x of dtype `x`:
/// f32 for 16-bit activations (OpDef::halfActivations), x's own otherwise.
DType statisticsDType(DType x) { return isHalfPrecision(x) ? f32 : x; }

/// Checks x (input xIndex, rank >= 2, floating) and the per-channel inputs `vectors` (rank 1 of
/// size C, of statisticsDType); returns C (-1 when unknown everywhere).
int64_t checkChannels(const InferContext& c, int xIndex, std::initializer_list<int> vectors) {
  detail::requireFloat(c, xIndex);
  const Shape& x = c.shape(xIndex);
  c.check(x.rank() >= 2, "input must have rank >= 2 (N, C, ...), got {}", x.str());
  int64_t channels = x[1];
  const bool half = isHalfPrecision(c.dtype(xIndex));
  for (int i : vectors) {
    if (half) {
      c.check(c.dtype(i) == f32, "input {} must be f32 to go with the 16-bit input {} ({}), got {}", i, xIndex,
              dtypeName(c.dtype(xIndex)), dtypeName(c.dtype(i)));
    } else {
      detail::requireSameDType(c, xIndex, i);
    }
    const Shape& v = c.shape(i);
    c.check(v.rank() == 1, "input {} must be a vector of one value per channel, got {}", i, v.str());
    c.check(v[0] < 0 || channels < 0 || v[0] == channels, "input {} has {} values but the input has {} channels", i,
            v[0], channels);
    if (channels < 0) channels = v[0];
  }
  return channels;
}

void checkEpsilon(const InferContext& c) {
  const double eps = c.attrs().getFloat("epsilon");
  c.check(eps >= 0, "epsilon must be >= 0, got {}", eps);
}

/// The gradient ops: dy (input 0) must match x (input 1).
void checkGradient(const InferContext& c) {
  detail::requireSameDType(c, 0, 1);
  c.check(c.shape(0).compatibleWith(c.shape(1)), "gradient of shape {} does not match the input shape {}",
          c.shape(0).str(), c.shape(1).str());
}

/// `count` outputs of shape (channels) after one of x's type.
std::vector<TensorType> xAndVectors(const InferContext& c, int xIndex, int64_t channels, int count) {
  std::vector<TensorType> out{c.inputs[static_cast<size_t>(xIndex)]};
  for (int i = 0; i < count; ++i) out.push_back({statisticsDType(c.dtype(xIndex)), Shape{channels}});
  return out;
}

std::vector<TensorType> trainInfer(const InferContext& c) {
  checkEpsilon(c);
  return xAndVectors(c, 0, checkChannels(c, 0, {1, 2}), 3);
}

std::vector<TensorType> trainGradInfer(const InferContext& c) {
  c.check(c.numInputs() == 5 || c.numInputs() == 7, "needs 5 or 7 inputs, got {}", c.numInputs());
  checkGradient(c);
  const int64_t channels =
      c.numInputs() == 7 ? checkChannels(c, 1, {2, 3, 4, 5, 6}) : checkChannels(c, 1, {2, 3, 4});
  return xAndVectors(c, 1, channels, 2);
}

// BatchNormReluGrad: BatchNormGrad's inputs with the forward's ReLU output after invstd.
std::vector<TensorType> reluGradInfer(const InferContext& c) {
  c.check(c.numInputs() == 6 || c.numInputs() == 8, "needs 6 or 8 inputs, got {}", c.numInputs());
  checkGradient(c);
  detail::requireSameDType(c, 1, 5);
  c.check(c.shape(5).compatibleWith(c.shape(1)), "the ReLU output of shape {} does not match the input shape {}",
          c.shape(5).str(), c.shape(1).str());
  const int64_t channels =
      c.numInputs() == 8 ? checkChannels(c, 1, {2, 3, 4, 6, 7}) : checkChannels(c, 1, {2, 3, 4});
  return xAndVectors(c, 1, channels, 2);
}

std::vector<TensorType> inferenceInfer(const InferContext& c) {
  checkEpsilon(c);
  checkChannels(c, 0, {1, 2, 3, 4});
  return {c.inputs[0]};
}

std::vector<TensorType> inferenceGradInfer(const InferContext& c) {
  checkEpsilon(c);
  checkGradient(c);
  return xAndVectors(c, 1, checkChannels(c, 1, {2, 3, 4}), 4);
}

/// Checks that input i is an f64 (rows, C) matrix of moments.
void checkMoments(const InferContext& c, int i, int64_t rows, int64_t channels) {
  c.check(c.dtype(i) == DType::F64, "input {} (moments) must be f64, got {}", i, dtypeName(c.dtype(i)));
  const Shape& m = c.shape(i);
  c.check(m.rank() == 2 && (m[0] < 0 || m[0] == rows) && (m[1] < 0 || channels < 0 || m[1] == channels),
          "input {} (moments) must have shape ({}, {}), got {}", i, rows, channels, m.str());
}

std::vector<TensorType> momentsInfer(const InferContext& c) {
  return {{DType::F64, Shape{3, checkChannels(c, 0, {})}}};
}

std::vector<TensorType> normalizeFromMomentsInfer(const InferContext& c) {
  checkEpsilon(c);
  const int64_t channels = checkChannels(c, 0, {1, 2});
  checkMoments(c, 3, 3, channels);
  return xAndVectors(c, 0, channels, 3);
}

std::vector<TensorType> gradMomentsInfer(const InferContext& c) {
  c.check(c.numInputs() == 4 || c.numInputs() == 6, "needs 4 or 6 inputs, got {}", c.numInputs());
  checkGradient(c);
  const int64_t channels = c.numInputs() == 6 ? checkChannels(c, 1, {2, 3, 4, 5}) : checkChannels(c, 1, {2, 3});
  return {{DType::F64, Shape{4, channels}}};
}

std::vector<TensorType> gradFromMomentsInfer(const InferContext& c) {
  checkGradient(c);
  const int64_t channels = checkChannels(c, 1, {2, 3, 4});
  checkMoments(c, 5, 4, channels);
  checkMoments(c, 6, 4, channels);
  checkMoments(c, 7, 3, channels);
  return xAndVectors(c, 1, channels, 2);
}

// ---- gradient rules ------------------------------------------------------------------------

// Gradients reach the statistics outputs only when a loss uses them directly (moving-average
// updates have no gradient); their terms d mean/dx = 1/M and d var/dx = 2 (x - mean)/M are
// added by the fused op when given. Output 3 (invstd) is internal and takes no gradient.
// BatchNormReluTrain's gradient masks dy by its output (ReLU's gradient) in BatchNormReluGrad.
std::vector<Grad> batchNormTrainGrad(GradContext& c) {
  const bool yGrad = c.dy(0).valid();
  const bool relu = c.node->op == "BatchNormReluTrain";
  std::vector<Output> inputs{yGrad ? c.dy(0) : zerosLike(c.y(0)), c.x(0), c.x(1), c.y(1), c.y(3)};
  if (relu) inputs.push_back(c.y(0));
  if (c.dy(1).valid() || c.dy(2).valid()) {
    inputs.push_back(c.dy(1).valid() ? c.dy(1) : zerosLike(c.y(1)));
    inputs.push_back(c.dy(2).valid() ? c.dy(2) : zerosLike(c.y(2)));
  }
  Node* n = detail::addOp(c.graph(), relu ? "BatchNormReluGrad" : "BatchNormGrad", inputs);
  if (!yGrad) return {n->output(0), Grad(), Grad()};
  return {n->output(0), n->output(1), n->output(2)};
}

std::vector<Grad> batchNormInferenceGrad(GradContext& c) {
  Node* n = detail::addOp(c.graph(), "BatchNormInferenceGrad", {c.dy(), c.x(0), c.x(1), c.x(3), c.x(4)}, c.attrs());
  return {n->output(0), n->output(1), n->output(2), n->output(3), n->output(4)};
}

}  // namespace

BatchNormOutputs batchNormTrain(Output x, Output gamma, Output beta, double epsilon, bool relu) {
  Node* n = detail::addOp(x.graph(), relu ? "BatchNormReluTrain" : "BatchNormTrain", {x, gamma, beta},
                          {{"epsilon", epsilon}});
  return {n->output(0), n->output(1), n->output(2)};
}

Output batchNormInference(Output x, Output gamma, Output beta, Output mean, Output var, double epsilon) {
  return detail::addOp1(x.graph(), "BatchNormInference", {x, gamma, beta, mean, var}, {{"epsilon", epsilon}});
}

Output batchNormMoments(Output x) { return detail::addOp1(x.graph(), "BatchNormMoments", {x}); }

BatchNormOutputs batchNormFromMoments(Output x, Output gamma, Output beta, Output moments, double epsilon) {
  Node* n = detail::addOp(x.graph(), "BatchNormFromMoments", {x, gamma, beta, moments}, {{"epsilon", epsilon}});
  return {n->output(0), n->output(1), n->output(2)};
}

void detail::registerNormOps(OpRegistry& r) {
  // x (and dy) may be 16-bit with f32 statistics and parameters; the CPU computes those in f32.
  r.add(OpDef("BatchNormTrain")
            .inputs(3)
            .infer(trainInfer)
            .cpu(inFloat32<batchNormTrainKernel>)
            .cuda(WEFT_CUDA_KERNEL(batchNormTrain))
            .grad(batchNormTrainGrad)
            .halfActivations({0}, {0}));
  r.add(OpDef("BatchNormGrad")
            .inputs(5, 7)
            .infer(trainGradInfer)
            .cpu(inFloat32<batchNormGradKernel>)
            .cuda(WEFT_CUDA_KERNEL(batchNormGrad))
            .noGradient()
            .halfActivations({0, 1}, {0}));
  // Batch norm with the ReLU after it, one pass over memory fewer each way (fuseBatchNormRelu,
  // ops/Fusion.h, forms them).
  r.add(OpDef("BatchNormReluTrain")
            .inputs(3)
            .infer(trainInfer)
            .cpu(inFloat32<batchNormReluTrainKernel>)
            .cuda(WEFT_CUDA_KERNEL(batchNormReluTrain))
            .grad(batchNormTrainGrad)
            .halfActivations({0}, {0}));
  r.add(OpDef("BatchNormReluGrad")
            .inputs(6, 8)
            .infer(reluGradInfer)
            .cpu(inFloat32<batchNormReluGradKernel>)
            .cuda(WEFT_CUDA_KERNEL(batchNormReluGrad))
            .noGradient()
            .halfActivations({0, 1, 5}, {0}));
  r.add(OpDef("BatchNormInference")
            .inputs(5)
            .infer(inferenceInfer)
            .cpu(inFloat32<batchNormInferenceKernel>)
            .cuda(WEFT_CUDA_KERNEL(batchNormInference))
            .grad(batchNormInferenceGrad)
            .halfActivations({0}, {0}));
  r.add(OpDef("BatchNormMoments").inputs(1).infer(momentsInfer).cpu(inFloat32<momentsKernel>).noGradient());
  r.add(OpDef("BatchNormFromMoments")
            .inputs(4)
            .infer(normalizeFromMomentsInfer)
            .cpu(inFloat32<normalizeFromMomentsKernel>)
            .noGradient());
  r.add(OpDef("BatchNormGradMoments")
            .inputs(4, 6)
            .infer(gradMomentsInfer)
            .cpu(inFloat32<gradMomentsKernel>)
            .noGradient());
  r.add(OpDef("BatchNormGradFromMoments")
            .inputs(8)
            .infer(gradFromMomentsInfer)
            .cpu(inFloat32<gradFromMomentsKernel>)
            .noGradient());
  r.add(OpDef("BatchNormInferenceGrad")
            .inputs(5)
            .infer(inferenceGradInfer)
            .cpu(inFloat32<batchNormInferenceGradKernel>)
            .noGradient());
}

}  // namespace weft
