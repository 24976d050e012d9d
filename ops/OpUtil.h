// Helpers shared by the op family files (not a public header).
#pragma once

#include "core/OpRegistry.h"
#include "ops/Ops.h"

#include <string>
#include <vector>

namespace weft::detail {

/// Appends a node after making sure every op is registered.
Node* addOp(Graph& g, const std::string& op, std::vector<Output> inputs, Attrs attrs = {},
            const std::string& name = "");
inline Output addOp1(Graph& g, const std::string& op, std::vector<Output> inputs, Attrs attrs = {}) {
  return addOp(g, op, std::move(inputs), std::move(attrs))->output();
}

/// Numpy broadcast of two (possibly partial) shapes; nullopt-style failure returns false.
bool broadcastShapes(const Shape& a, const Shape& b, Shape& out);

/// Shape function: one output with input 0's type.
std::vector<TensorType> sameAsInput(const InferContext& c);

/// Checks that input i has a floating dtype.
void requireFloat(const InferContext& c, int i);
/// Checks that inputs i and j have the same dtype.
void requireSameDType(const InferContext& c, int i, int j);

/// The axis list of a reduction normalised to [0, rank), sorted, all axes when empty.
std::vector<int> normaliseAxes(const InferContext& c, const std::vector<int64_t>& axes, int rank);

/// Per-family registration functions, called once by registerAllOps().
void registerElementwiseOps(OpRegistry& r);
void registerMatMulOps(OpRegistry& r);
void registerReduceOps(OpRegistry& r);
void registerShapeOps(OpRegistry& r);
void registerSoftmaxOps(OpRegistry& r);
void registerEmbeddingOps(OpRegistry& r);
void registerConvOps(OpRegistry& r);
void registerNormOps(OpRegistry& r);
void registerRandomOps(OpRegistry& r);
void registerRnnOps(OpRegistry& r);
void registerClipOps(OpRegistry& r);
void registerStateOps(OpRegistry& r);
void registerOptimizerOps(OpRegistry& r);

}  // namespace weft::detail
