// Mixed precision without per-op casts. Under Graph::MixedOps::CastOperands every matrix product
// and convolution reads 16-bit copies of its f32 operands and casts its result back to f32, so in
// a ResNet each activation is cast twice between one convolution and the next, forward and
// backward. Ops marked OpDef::halfActivations (batch norm, ReLU, residual sums, gradient sums,
// max pooling) compute in f32 on 16-bit values themselves; keepActivationsLow feeds them the
// 16-bit values directly, so activations stay 16-bit from one convolution to the next and the
// casts that only undo one another disappear, as under PyTorch's autocast.
//
//     {
//       auto mixed = g.mixedPrecision(bf16);
//       loss = buildModel(g);
//     }
//     Node* step = optim::SGD(0.1).minimize(loss);  // runs keepActivationsLow on the whole graph
#pragma once

#include "core/Graph.h"

namespace weft {

/// What keepActivationsLow changed.
struct LowPrecisionReport {
  int opsLowered = 0;     // ops that now read and write 16-bit activations
  int castsBypassed = 0;  // casts to 16 bits whose readers now read the 16-bit value they undid
};

/// Rewrites `g` so that every op marked OpDef::halfActivations whose marked inputs are all f32
/// casts of 16-bit values (one 16-bit type) reads those 16-bit values instead, and writes its
/// marked outputs in 16 bits; its other readers read a cast back to f32, so nothing else
/// changes type. A cast to 16 bits of a value that exists in 16 bits is bypassed. Outputs named
/// by gradient links (the gradients of variables) stay f32. Fetching a value that the rewrite
/// moved to 16 bits returns it in 16 bits. Casts left without readers stay in the graph, where
/// no plan runs them (Session prunes). A graph without such casts is left as it is.
LowPrecisionReport keepActivationsLow(Graph& g);

}  // namespace weft
