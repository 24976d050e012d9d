// Fusions: graph rewrites that compute, in one op, what two ops compute with a pass over memory
// between them. They keep every value's meaning: a fused node takes over the later op's node, so
// anything that reads or fetches that node's output gets the same values, and the earlier op stays
// in the graph for whatever else asks for it (a plan runs it only then).
//
//     Node* step = optim::SGD(0.1).minimize(loss);  // runs fuseBatchNormRelu on the whole graph
#pragma once

#include "core/Graph.h"

namespace weft {

/// Fuses each training-mode batch norm whose output only a ReLU reads (in the same pipeline
/// stage; readers that nothing reads are not counted: they run only when fetched, and then on
/// the unfused batch norm) into one BatchNormReluTrain in the ReLU's node, the statistics' readers reading its
/// statistics; and the BatchNormGrad of such a batch norm whose gradient only the ReLU's gradient
/// (ReluGrad) gives into a BatchNormReluGrad, which masks the gradient itself. Forward, the ReLU's
/// read and write of the activation go; backward, one of the gradient's passes. The values are
/// the same bits; a batch norm and a ReLU on different devices stay apart. Returns how many
/// batch norms were fused.
int fuseBatchNormRelu(Graph& g);

}  // namespace weft
