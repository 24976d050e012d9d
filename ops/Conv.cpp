// NCHW 2-D convolution with its fused backward ops, and max / average pooling with theirs.
// Float 3x3 convolutions at stride 1 with channels in 16s (up to 128) run on the Winograd kernels
// of ops/ConvWinograd, other 3x3 convolutions at stride 1 or 2 on the direct kernels of
// ops/ConvDirect; every other window runs as im2col + OpenBLAS GEMM per image. Images
// (convolution) or (image, channel) planes (pooling) are independent, so the kernels split them
// across the session's pool and call BLAS single-threaded.
#include "ops/Blas.h"
#include "ops/ConvWinograd.h"
#include "ops/OpUtil.h"
#include "ops/cuda/Kernels.h"

#include <algorithm>
#include <atomic>
#include <limits>

namespace weft {
namespace {

using detail::addOp1;

// ---- geometry ------------------------------------------------------------------------------

/// Sizes of one convolution or pooling window sweep over an (H, W) plane.
struct Window {
  int64_t kh, kw, sh, sw, ph, pw, dh = 1, dw = 1;

  int64_t outH(int64_t h) const { return (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int64_t outW(int64_t w) const { return (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
};

const std::vector<int64_t>& pairAttr(const Attrs& a, const char* name) {
  return a.get<std::vector<int64_t>>(name);
}

/// The window of a conv (filter sizes from `filter`) or pooling node (sizes from "kernel").
Window convWindow(const Attrs& a, const Shape& filter) {
  const auto &s = pairAttr(a, "strides"), &p = pairAttr(a, "padding"), &d = pairAttr(a, "dilation");
  return {filter[2], filter[3], s[0], s[1], p[0], p[1], d[0], d[1]};
}
Window poolWindow(const Attrs& a) {
  const auto &k = pairAttr(a, "kernel"), &s = pairAttr(a, "strides"), &p = pairAttr(a, "padding");
  return {k[0], k[1], s[0], s[1], p[0], p[1]};
}

void checkPair(const InferContext& c, const char* name, int64_t min) {
  const auto& v = pairAttr(c.attrs(), name);
  c.check(v.size() == 2, "{} needs 2 values (h, w), got {}", name, v.size());
  c.check(v[0] >= min && v[1] >= min, "{} must be >= {}, got ({}, {})", name, min, v[0], v[1]);
}

/// Output (h, w) of a window sweep, -1 where the input dim is unknown; fails when the (dilated)
/// window does not fit the padded input.
std::pair<int64_t, int64_t> outputDims(const InferContext& c, const Window& win, int64_t h, int64_t w) {
  const int64_t effH = win.dh * (win.kh - 1) + 1, effW = win.dw * (win.kw - 1) + 1;
  c.check(h < 0 || effH <= h + 2 * win.ph, "window height {} is larger than the padded input height {}",
          effH, h + 2 * win.ph);
  c.check(w < 0 || effW <= w + 2 * win.pw, "window width {} is larger than the padded input width {}",
          effW, w + 2 * win.pw);
  return {h < 0 ? -1 : win.outH(h), w < 0 ? -1 : win.outW(w)};
}

void requireRank4(const InferContext& c, int i, const char* what) {
  c.check(c.shape(i).rank() == 4, "{} must have rank 4, got {}", what, c.shape(i).str());
}

// ---- im2col --------------------------------------------------------------------------------

/// The per-image geometry shared by the three convolution kernels.
struct ConvGeometry {
  int64_t n, c, h, w, o, oh, ow;
  Window win;

  int64_t colRows() const { return c * win.kh * win.kw; }  // K of the GEMM
  int64_t colCols() const { return oh * ow; }              // P of the GEMM
  /// A 1x1 unstrided, unpadded filter reads the image itself as its column matrix.
  bool pointwise() const {
    return win.kh == 1 && win.kw == 1 && win.sh == 1 && win.sw == 1 && win.ph == 0 && win.pw == 0;
  }
  bool direct() const {
    return detail::directConvApplies(win.kh, win.kw, win.sh, win.sw, win.dh, win.dw, win.ph, win.pw);
  }
  detail::DirectConv directShape() const { return {n, c, h, w, o, win.ph, win.pw, win.sh}; }
  bool winograd() const { return direct() && detail::winogradConvApplies(directShape()); }
};

ConvGeometry convGeometry(const Shape& x, const Shape& filter, const Attrs& attrs) {
  const Window win = convWindow(attrs, filter);
  return {x[0], x[1], x[2], x[3], filter[0], win.outH(x[2]), win.outW(x[3]), win};
}

/// The outputs ox in [first, last) whose input column ox * stride - pad + offset lies in [0, size):
/// outside that range a tap reads padding.
std::pair<int64_t, int64_t> validOutputs(int64_t outSize, int64_t size, int64_t stride, int64_t pad, int64_t offset) {
  const int64_t start = pad - offset;  // ox * stride >= start
  const int64_t first = start <= 0 ? 0 : (start + stride - 1) / stride;
  const int64_t end = size + pad - offset;  // ox * stride < end
  const int64_t last = end <= 0 ? 0 : std::min(outSize, (end + stride - 1) / stride);
  return {std::min(first, outSize), std::max(std::min(first, outSize), last)};
}

/// col (C*kh*kw, OH*OW): row (c, i, j) holds image (c) at the tap (i, j) of every output position.
template <class T>
void im2col(const ConvGeometry& g, const T* image, T* col) {
  const Window& w = g.win;
  for (int64_t j = 0; j < w.kw; ++j) {
    const auto [x0, x1] = validOutputs(g.ow, g.w, w.sw, w.pw, j * w.dw);
    for (int64_t ch = 0; ch < g.c; ++ch) {
      for (int64_t i = 0; i < w.kh; ++i) {
        T* row = col + ((ch * w.kh + i) * w.kw + j) * g.colCols();
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          T* dst = row + oy * g.ow;
          const int64_t iy = oy * w.sh - w.ph + i * w.dh;
          if (iy < 0 || iy >= g.h) {
            std::fill(dst, dst + g.ow, T(0));
            continue;
          }
          const T* src = image + (ch * g.h + iy) * g.w + x0 * w.sw - w.pw + j * w.dw;
          std::fill(dst, dst + x0, T(0));
          if (w.sw == 1) {
            std::copy(src, src + (x1 - x0), dst + x0);
          } else {
            for (int64_t ox = x0; ox < x1; ++ox) dst[ox] = src[(ox - x0) * w.sw];
          }
          std::fill(dst + x1, dst + g.ow, T(0));
        }
      }
    }
  }
}

/// The adjoint of im2col: adds every column entry back onto the image position it was read from.
template <class T>
void col2im(const ConvGeometry& g, const T* col, T* image) {
  const Window& w = g.win;
  std::fill(image, image + g.c * g.h * g.w, T(0));
  for (int64_t j = 0; j < w.kw; ++j) {
    const auto [x0, x1] = validOutputs(g.ow, g.w, w.sw, w.pw, j * w.dw);
    for (int64_t ch = 0; ch < g.c; ++ch) {
      for (int64_t i = 0; i < w.kh; ++i) {
        const T* row = col + ((ch * w.kh + i) * w.kw + j) * g.colCols();
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const int64_t iy = oy * w.sh - w.ph + i * w.dh;
          if (iy < 0 || iy >= g.h) continue;
          const T* src = row + oy * g.ow;
          T* dst = image + (ch * g.h + iy) * g.w + x0 * w.sw - w.pw + j * w.dw;
          for (int64_t ox = x0; ox < x1; ++ox) dst[(ox - x0) * w.sw] += src[ox];
        }
      }
    }
  }
}

/// The column matrix of one image: the image itself when pointwise, else im2col into `scratch`.
template <class T>
const T* columns(const ConvGeometry& g, const T* image, std::vector<T>& scratch) {
  if (g.pointwise()) return image;
  scratch.resize(static_cast<size_t>(g.colRows() * g.colCols()));
  im2col(g, image, scratch.data());
  return scratch.data();
}

// ---- convolution kernels -------------------------------------------------------------------

// out[n] (O, P) = filter (O, K) x col(x[n]) (K, P)
void conv2dKernel(KernelContext& ctx) {
  const Tensor &x = ctx.input(0), &filter = ctx.input(1);
  const ConvGeometry g = convGeometry(x.shape(), filter.shape(), ctx.attrs());
  const int64_t k = g.colRows(), p = g.colCols();
  dispatchFloat(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    const T* pf = filter.data<T>();
    T* po = ctx.output(0).data<T>();
    if constexpr (std::is_same_v<T, float>) {
      if (g.winograd()) return detail::winogradConvForward(ctx, g.directShape(), px, pf, po);
    }
    if (g.direct()) return detail::directConvForward(ctx, g.directShape(), px, pf, po);
    ctx.parallelFor(g.n, g.o * k * p, [&](int64_t lo, int64_t hi) {
      std::vector<T> scratch;
      for (int64_t img = lo; img < hi; ++img) {
        const T* col = columns(g, px + img * g.c * g.h * g.w, scratch);
        blas::gemm(false, false, g.o, p, k, pf, k, col, p, T(0), po + img * g.o * p, p);
      }
    });
  });
}

// dcol (K, P) = filter^T (K, O) x dy[n] (O, P);  dx[n] = col2im(dcol)
void conv2dBackpropInputKernel(KernelContext& ctx) {
  const Tensor &dy = ctx.input(0), &filter = ctx.input(1);
  Tensor& dx = ctx.output(0);
  const ConvGeometry g = convGeometry(dx.shape(), filter.shape(), ctx.attrs());
  const int64_t k = g.colRows(), p = g.colCols(), imageSize = g.c * g.h * g.w;
  dispatchFloat(dy.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* pdy = dy.data<T>();
    const T* pf = filter.data<T>();
    T* pdx = dx.data<T>();
    if constexpr (std::is_same_v<T, float>) {
      if (g.winograd()) return detail::winogradConvBackpropInput(ctx, g.directShape(), pdy, pf, pdx);
    }
    if (g.direct()) return detail::directConvBackpropInput(ctx, g.directShape(), pdy, pf, pdx);
    ctx.parallelFor(g.n, g.o * k * p, [&](int64_t lo, int64_t hi) {
      std::vector<T> dcol(g.pointwise() ? 0 : static_cast<size_t>(k * p));
      for (int64_t img = lo; img < hi; ++img) {
        T* target = g.pointwise() ? pdx + img * imageSize : dcol.data();
        blas::gemm(true, false, k, p, g.o, pf, k, pdy + img * g.o * p, p, T(0), target, p);
        if (!g.pointwise()) col2im(g, dcol.data(), pdx + img * imageSize);
      }
    });
  });
}

// dfilter (O, K) = sum_n dy[n] (O, P) x col(x[n])^T (P, K). Each block of images (ImageBlocks)
// sums into its own partial product, and the partials are added at the end.
void conv2dBackpropFilterKernel(KernelContext& ctx) {
  const Tensor &x = ctx.input(0), &dy = ctx.input(1);
  Tensor& df = ctx.output(0);
  const ConvGeometry g = convGeometry(x.shape(), df.shape(), ctx.attrs());
  const int64_t k = g.colRows(), p = g.colCols(), filterSize = g.o * k;
  const detail::ImageBlocks blocks(g.n);
  dispatchFloat(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    if constexpr (std::is_same_v<T, float>) {
      if (g.winograd()) return detail::winogradConvBackpropFilter(ctx, g.directShape(), px, pdy, df.data<T>());
    }
    if (g.direct()) return detail::directConvBackpropFilter(ctx, g.directShape(), px, pdy, df.data<T>());
    std::vector<T> partials(static_cast<size_t>(blocks.count * filterSize), T(0));
    ctx.parallelFor(blocks.count, blocks.perBlock * filterSize * p, [&](int64_t lo, int64_t hi) {
      std::vector<T> scratch;
      for (int64_t blk = lo; blk < hi; ++blk) {
        for (int64_t img = blocks.begin(blk); img < blocks.end(blk); ++img) {
          const T* col = columns(g, px + img * g.c * g.h * g.w, scratch);
          blas::gemm(false, true, g.o, k, p, pdy + img * g.o * p, p, col, p, T(1), partials.data() + blk * filterSize,
                     k);
        }
      }
    });
    T* out = df.data<T>();
    std::copy(partials.begin(), partials.begin() + filterSize, out);
    for (int64_t blk = 1; blk < blocks.count; ++blk) {
      const T* part = partials.data() + blk * filterSize;
      for (int64_t i = 0; i < filterSize; ++i) out[i] += part[i];
    }
  });
}

// ---- convolution shape functions -----------------------------------------------------------

void checkConvAttrs(const InferContext& c) {
  checkPair(c, "strides", 1);
  checkPair(c, "padding", 0);
  checkPair(c, "dilation", 1);
}

/// (N, O, H', W') of x (N, C, H, W) and filter (O, C, kh, kw).
Shape convOutputShape(const InferContext& c, const Shape& x, const Shape& filter) {
  c.check(x[1] < 0 || filter[1] < 0 || x[1] == filter[1], "input has {} channels but the filter expects {}",
          x[1], filter[1]);
  c.check(filter[2] >= 0 && filter[3] >= 0, "the filter's spatial size must be known, got {}", filter.str());
  const auto [oh, ow] = outputDims(c, convWindow(c.attrs(), filter), x[2], x[3]);
  return {x[0], filter[0], oh, ow};
}

std::vector<TensorType> conv2dInfer(const InferContext& c) {
  detail::requireFloat(c, 0);
  detail::requireSameDType(c, 0, 1);
  requireRank4(c, 0, "input");
  requireRank4(c, 1, "filter");
  checkConvAttrs(c);
  return {{c.dtype(0), convOutputShape(c, c.shape(0), c.shape(1))}};
}

/// The backprop ops: dy (N, O, H', W') must match the forward output of (x, filter); the result
/// takes the shape of input `like` (x for the input gradient, filter for the filter gradient).
std::vector<TensorType> convBackpropInfer(const InferContext& c, int dyIndex, int xIndex, int filterIndex, int like) {
  detail::requireFloat(c, 0);
  detail::requireSameDType(c, 0, 1);
  detail::requireSameDType(c, 0, 2);
  for (int i = 0; i < 3; ++i) requireRank4(c, i, i == dyIndex ? "gradient" : i == xIndex ? "input" : "filter");
  checkConvAttrs(c);
  const Shape forward = convOutputShape(c, c.shape(xIndex), c.shape(filterIndex));
  c.check(forward.compatibleWith(c.shape(dyIndex)), "gradient of shape {} does not match the output shape {}",
          c.shape(dyIndex).str(), forward.str());
  return {c.inputs[static_cast<size_t>(like)]};
}

// ---- pooling kernels -----------------------------------------------------------------------

/// Geometry of pooling over N*C independent (H, W) planes.
struct PoolGeometry {
  int64_t planes, h, w, oh, ow;
  Window win;

  /// Clipped window rows [y0, y1) and columns [x0, x1) of output (oy, ox).
  void bounds(int64_t oy, int64_t ox, int64_t& y0, int64_t& y1, int64_t& x0, int64_t& x1) const {
    y0 = std::max<int64_t>(0, oy * win.sh - win.ph);
    y1 = std::min(h, oy * win.sh - win.ph + win.kh);
    x0 = std::max<int64_t>(0, ox * win.sw - win.pw);
    x1 = std::min(w, ox * win.sw - win.pw + win.kw);
  }
};

PoolGeometry poolGeometry(const Shape& x, const Attrs& attrs) {
  const Window win = poolWindow(attrs);
  return {x[0] * x[1], x[2], x[3], win.outH(x[2]), win.outW(x[3]), win};
}

/// Calls f(T{}, g, in-plane pointer offset, out-plane offset) for every plane, in parallel.
template <class F>
void forEachPlane(const KernelContext& ctx, const Tensor& x, const PoolGeometry& g, F f) {
  dispatchFloat(x.dtype(), [&](auto z) {
    ctx.parallelFor(g.planes, g.oh * g.ow * g.win.kh * g.win.kw, [&](int64_t lo, int64_t hi) {
      for (int64_t plane = lo; plane < hi; ++plane) f(z, plane * g.h * g.w, plane * g.oh * g.ow);
    });
  });
}

// y = max over the in-bounds window elements (0 for a window that holds none).
void maxPoolKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const PoolGeometry g = poolGeometry(x.shape(), ctx.attrs());
  forEachPlane(ctx, x, g, [&](auto z, int64_t in, int64_t out) {
    using T = decltype(z);
    const T* px = x.data<T>() + in;
    T* py = ctx.output(0).data<T>() + out;
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        int64_t y0, y1, x0, x1;
        g.bounds(oy, ox, y0, y1, x0, x1);
        T best = -std::numeric_limits<T>::infinity();
        for (int64_t iy = y0; iy < y1; ++iy) {
          for (int64_t ix = x0; ix < x1; ++ix) best = std::max(best, px[iy * g.w + ix]);
        }
        py[oy * g.ow + ox] = y0 < y1 && x0 < x1 ? best : T(0);
      }
    }
  });
}

// dx: each dy goes to the first element (row-major) of its window that equals the window's max.
void maxPoolGradKernel(KernelContext& ctx) {
  const Tensor &x = ctx.input(0), &y = ctx.input(1), &dy = ctx.input(2);
  const PoolGeometry g = poolGeometry(x.shape(), ctx.attrs());
  forEachPlane(ctx, x, g, [&](auto z, int64_t in, int64_t out) {
    using T = decltype(z);
    const T* px = x.data<T>() + in;
    const T* py = y.data<T>() + out;
    const T* pdy = dy.data<T>() + out;
    T* pdx = ctx.output(0).data<T>() + in;
    std::fill(pdx, pdx + g.h * g.w, T(0));
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        int64_t y0, y1, x0, x1;
        g.bounds(oy, ox, y0, y1, x0, x1);
        const T best = py[oy * g.ow + ox];
        int64_t at = -1;
        for (int64_t iy = y0; iy < y1 && at < 0; ++iy) {
          for (int64_t ix = x0; ix < x1; ++ix) {
            if (px[iy * g.w + ix] == best) {
              at = iy * g.w + ix;
              break;
            }
          }
        }
        if (at >= 0) pdx[at] += pdy[oy * g.ow + ox];
      }
    }
  });
}

// y = mean over the in-bounds window elements (padding does not count).
void avgPoolKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const PoolGeometry g = poolGeometry(x.shape(), ctx.attrs());
  forEachPlane(ctx, x, g, [&](auto z, int64_t in, int64_t out) {
    using T = decltype(z);
    const T* px = x.data<T>() + in;
    T* py = ctx.output(0).data<T>() + out;
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        int64_t y0, y1, x0, x1;
        g.bounds(oy, ox, y0, y1, x0, x1);
        T total = 0;
        for (int64_t iy = y0; iy < y1; ++iy) {
          for (int64_t ix = x0; ix < x1; ++ix) total += px[iy * g.w + ix];
        }
        const int64_t count = std::max<int64_t>(0, y1 - y0) * std::max<int64_t>(0, x1 - x0);
        py[oy * g.ow + ox] = count > 0 ? total / static_cast<T>(count) : T(0);
      }
    }
  });
}

// dx[window] += dy / (in-bounds count of the window)
void avgPoolGradKernel(KernelContext& ctx) {
  const Tensor &dy = ctx.input(0), &x = ctx.input(1);
  const PoolGeometry g = poolGeometry(x.shape(), ctx.attrs());
  forEachPlane(ctx, x, g, [&](auto z, int64_t in, int64_t out) {
    using T = decltype(z);
    const T* pdy = dy.data<T>() + out;
    T* pdx = ctx.output(0).data<T>() + in;
    std::fill(pdx, pdx + g.h * g.w, T(0));
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        int64_t y0, y1, x0, x1;
        g.bounds(oy, ox, y0, y1, x0, x1);
        const int64_t count = std::max<int64_t>(0, y1 - y0) * std::max<int64_t>(0, x1 - x0);
        if (count == 0) continue;
        const T share = pdy[oy * g.ow + ox] / static_cast<T>(count);
        for (int64_t iy = y0; iy < y1; ++iy) {
          for (int64_t ix = x0; ix < x1; ++ix) pdx[iy * g.w + ix] += share;
        }
      }
    }
  });
}

// ---- pooling shape functions ---------------------------------------------------------------

/// (N, C, H', W') of a pooling of x (N, C, H, W).
Shape poolOutputShape(const InferContext& c, int xIndex) {
  requireRank4(c, xIndex, "input");
  checkPair(c, "kernel", 1);
  checkPair(c, "strides", 1);
  checkPair(c, "padding", 0);
  const Window win = poolWindow(c.attrs());
  // Every window then holds at least one input element.
  c.check(win.ph < win.kh && win.pw < win.kw, "padding ({}, {}) must be smaller than the kernel ({}, {})",
          win.ph, win.pw, win.kh, win.kw);
  const Shape& x = c.shape(xIndex);
  const auto [oh, ow] = outputDims(c, win, x[2], x[3]);
  return {x[0], x[1], oh, ow};
}

std::vector<TensorType> poolInfer(const InferContext& c) {
  detail::requireFloat(c, 0);
  return {{c.dtype(0), poolOutputShape(c, 0)}};
}

/// Pool gradient ops: `dyIndex` (and `yIndex` when >= 0) must have the pooled shape of input
/// `xIndex`; the result has x's type.
std::vector<TensorType> poolGradInfer(const InferContext& c, int xIndex, int dyIndex, int yIndex) {
  detail::requireFloat(c, 0);
  for (int i = 1; i < c.numInputs(); ++i) detail::requireSameDType(c, 0, i);
  const Shape pooled = poolOutputShape(c, xIndex);
  for (int i : {dyIndex, yIndex}) {
    if (i < 0) continue;
    c.check(pooled.compatibleWith(c.shape(i)), "input {} of shape {} does not match the pooled shape {}", i,
            c.shape(i).str(), pooled.str());
  }
  return {c.inputs[static_cast<size_t>(xIndex)]};
}

// ---- builders ------------------------------------------------------------------------------

Attrs convAttrs(const Conv2dOptions& o) {
  return {{"strides", o.stride}, {"padding", o.padding}, {"dilation", o.dilation}};
}

Output addPool(const char* op, Output x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
               std::vector<int64_t> padding) {
  return addOp1(x.graph(), op, {x},
                {{"kernel", std::move(kernel)}, {"strides", std::move(stride)}, {"padding", std::move(padding)}});
}

}  // namespace

Output conv2d(Output x, Output filter, const Conv2dOptions& options) {
  return detail::inComputePrecision({x, filter}, [&](const std::vector<Output>& in) {
    return addOp1(x.graph(), "Conv2D", in, convAttrs(options));
  });
}
Output maxPool2d(Output x, std::vector<int64_t> kernel, std::vector<int64_t> stride, std::vector<int64_t> padding) {
  return addPool("MaxPool2D", x, std::move(kernel), std::move(stride), std::move(padding));
}
Output avgPool2d(Output x, std::vector<int64_t> kernel, std::vector<int64_t> stride, std::vector<int64_t> padding) {
  return addPool("AvgPool2D", x, std::move(kernel), std::move(stride), std::move(padding));
}
namespace {
std::atomic<bool> nondeterministicConvolutions{false};
}  // namespace

void allowNondeterministicConvolutions(bool allow) { nondeterministicConvolutions = allow; }
bool nondeterministicConvolutionsAllowed() { return nondeterministicConvolutions; }

Output globalAvgPool(Output x) {
  WEFT_CHECK(x.rank() == 4, "globalAvgPool: {} must have rank 4 (N, C, H, W), got {}", x.name(), x.type().str());
  return mean(x, {2, 3});  // (N, C)
}

void detail::registerConvOps(OpRegistry& r) {
  // Conv2DBackpropInput(dy, filter, x) -> dx; Conv2DBackpropFilter(x, dy, filter) -> dfilter.
  r.add(OpDef("Conv2D")
            .inputs(2)
            .infer(conv2dInfer)
            .cpu([](KernelContext& c) { detail::runInFloat32(c, conv2dKernel); })
            .cuda(WEFT_CUDNN_KERNEL(conv2d))
            .grad([](GradContext& c) -> std::vector<Grad> {
              const Attrs& a = c.attrs();
              return {addOp1(c.graph(), "Conv2DBackpropInput", {c.dy(), c.x(1), c.x(0)}, a),
                      addOp1(c.graph(), "Conv2DBackpropFilter", {c.x(0), c.dy(), c.x(1)}, a)};
            }));
  r.add(OpDef("Conv2DBackpropInput")
            .inputs(3)
            .infer([](const InferContext& c) { return convBackpropInfer(c, 0, 2, 1, 2); })
            .cpu([](KernelContext& c) { detail::runInFloat32(c, conv2dBackpropInputKernel); })
            .cuda(WEFT_CUDNN_KERNEL(conv2dBackpropInput))
            .noGradient());
  r.add(OpDef("Conv2DBackpropFilter")
            .inputs(3)
            .infer([](const InferContext& c) { return convBackpropInfer(c, 1, 0, 2, 2); })
            .cpu([](KernelContext& c) { detail::runInFloat32(c, conv2dBackpropFilterKernel); })
            .cuda(WEFT_CUDNN_KERNEL(conv2dBackpropFilter))
            .noGradient());
  r.add(OpDef("MaxPool2D")
            .inputs(1)
            .infer(poolInfer)
            .cpu(detail::inFloat32<maxPoolKernel>)
            .cuda(WEFT_CUDA_KERNEL(maxPool))
            .grad([](GradContext& c) -> std::vector<Grad> {
              return {addOp1(c.graph(), "MaxPool2DGrad", {c.x(0), c.y(), c.dy()}, c.attrs())};
            })
            .halfActivations({0}, {0}));
  r.add(OpDef("MaxPool2DGrad")
            .inputs(3)
            .infer([](const InferContext& c) { return poolGradInfer(c, 0, 2, 1); })
            .cpu(detail::inFloat32<maxPoolGradKernel>)
            .cuda(WEFT_CUDA_KERNEL(maxPoolGrad))
            .noGradient()
            .halfActivations({0, 1, 2}, {0}));
  r.add(OpDef("AvgPool2D")
            .inputs(1)
            .infer(poolInfer)
            .cpu(avgPoolKernel)
            .cuda(WEFT_CUDA_KERNEL(avgPool))
            .grad([](GradContext& c) -> std::vector<Grad> {
              return {addOp1(c.graph(), "AvgPool2DGrad", {c.dy(), c.x(0)}, c.attrs())};
            }));
  r.add(OpDef("AvgPool2DGrad")
            .inputs(2)
            .infer([](const InferContext& c) { return poolGradInfer(c, 1, 0, -1); })
            .cpu(avgPoolGradKernel)
            .cuda(WEFT_CUDA_KERNEL(avgPoolGrad))
            .noGradient());
}

}  // namespace weft
