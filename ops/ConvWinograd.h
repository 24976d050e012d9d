// Winograd F(4x4, 3x3) kernels for float 3x3 convolutions at stride 1 whose channel counts are
// multiples of 16, up to 128: the bulk of a ResNet-20 after its first layer. Each 4x4 block of
// outputs is computed from the 6x6 block of inputs under it through transforms that turn the 144
// multiplies of 9 taps x 16 outputs into 36, so the work left is 36 small matrix products (one per
// transform position, over channels) with 4x fewer multiply-adds than the direct sweep.
// Conv.cpp prefers them over the direct kernels where they apply.
#pragma once

#include "ops/ConvDirect.h"

namespace weft::detail {

/// Whether the Winograd kernels handle a convolution the direct kernels handle (see
/// directConvApplies): stride 1, both channel counts multiples of 16, and at most 128 x 128
/// channels.
bool winogradConvApplies(const DirectConv& s);

/// y (n, o, outH, outW) = x conv filter.
void winogradConvForward(const KernelContext& ctx, const DirectConv& s, const float* x, const float* filter, float* y);

/// dx (n, c, h, w) from dy (n, o, outH, outW): the forward transform run on dy padded by
/// (2 - ph, 2 - pw), with the filter flipped and its channel axes swapped.
void winogradConvBackpropInput(const KernelContext& ctx, const DirectConv& s, const float* dy, const float* filter,
                               float* dx);

/// dfilter (o, c, 3, 3) from x and dy: the products' gradient summed over tiles in the
/// transformed domain, then transformed back. Images are summed in blocks fixed by the batch
/// size alone, so the result does not depend on the thread count.
void winogradConvBackpropFilter(const KernelContext& ctx, const DirectConv& s, const float* x, const float* dy,
                                float* dfilter);

}  // namespace weft::detail
