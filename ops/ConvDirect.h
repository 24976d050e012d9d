// Direct kernels for 3x3 convolutions at stride 1 and 2, which carry most of a ResNet's work.
// They read each image through a zero-padded copy laid out row after row, so every filter tap is
// a fixed offset into one flat array: no column matrix is built, and the inner loops are register
// tiles of vector multiply-adds. Conv.cpp chooses them over im2col + GEMM where they apply.
#pragma once

#include "core/OpRegistry.h"

#include <algorithm>

namespace weft::detail {

/// A convolution of x (n, c, h, w) with a filter (o, c, 3, 3), stride 1 or 2 in both axes,
/// padding (ph, pw).
struct DirectConv {
  int64_t n, c, h, w, o, ph, pw, stride;

  int64_t outH() const { return (h + 2 * ph - 3) / stride + 1; }
  int64_t outW() const { return (w + 2 * pw - 3) / stride + 1; }
};

/// How the filter gradients split a batch: into at most 8 blocks of consecutive images, each
/// summed into a partial sum of its own, the partials then added in block order. The blocks depend
/// on the batch size alone, never on the thread count, so results do not change with the number
/// of threads.
struct ImageBlocks {
  int64_t n, count, perBlock;

  explicit ImageBlocks(int64_t images)
      : n(images), count(std::clamp<int64_t>(images, 1, 8)), perBlock((images + count - 1) / count) {}
  int64_t begin(int64_t block) const { return std::min(n, block * perBlock); }
  int64_t end(int64_t block) const { return std::min(n, (block + 1) * perBlock); }
};

/// Whether the direct kernels handle a window: 3x3, stride 1 or 2 in both axes, unit dilation,
/// padding at most 2.
bool directConvApplies(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t ph,
                       int64_t pw);

/// y (n, o, outH, outW) = x conv filter.
template <class T>
void directConvForward(const KernelContext& ctx, const DirectConv& s, const T* x, const T* filter, T* y);

/// dx (n, c, h, w) from dy (n, o, outH, outW): the forward kernel run on dy with the filter
/// flipped and its channel axes swapped (at stride 2, once per phase of dx).
template <class T>
void directConvBackpropInput(const KernelContext& ctx, const DirectConv& s, const T* dy, const T* filter, T* dx);

/// dfilter (o, c, 3, 3) = sum over images and positions of dy x shifted x. Images are summed in
/// blocks fixed by the batch size alone, so the result does not depend on the thread count.
template <class T>
void directConvBackpropFilter(const KernelContext& ctx, const DirectConv& s, const T* x, const T* dy, T* dfilter);

}  // namespace weft::detail
