// Helpers shared by the op family files (not a public header).
#pragma once

#include "core/OpRegistry.h"
#include "ops/Ops.h"

#include <functional>
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

/// Builds a matrix product or a convolution in the graph's compute precision
/// (Graph::computePrecision): when that is bf16/f16 on 16-bit copies (MixedOps::CastOperands) and
/// every input is f32, `build` gets the inputs cast down and its result is cast back to f32;
/// otherwise `build` gets the inputs as they are.
Output inComputePrecision(std::vector<Output> inputs, const std::function<Output(const std::vector<Output>&)>& build);

/// The 16-bit type that a new matrix product's f32 operands round to in the graph's compute
/// precision (a scope with MixedOps::RoundInProducts; the product op carries it as its attribute
/// "round_operands_to"), or f32 for none: also f32 when an input is not f32.
DType productRounding(const std::vector<Output>& inputs);
/// A product op's "round_operands_to", f32 when absent.
DType productRounding(const Attrs& attrs);
/// Checks a product op's "round_operands_to", if any: bf16 or f16, on f32 inputs.
void checkProductRounding(const InferContext& c);

/// Converts every element of `from` into `to` (same element count, any two dtypes), across the
/// kernel's pool.
void castElements(const KernelContext& ctx, const Tensor& from, Tensor& to);

/// Copies `from` into `to` (same dtype and element count; nothing when they share storage), in
/// blocks across the kernel's pool: a single thread's copy leaves half of a CPU's load and store
/// bandwidth unused.
void copyElements(const KernelContext& ctx, const Tensor& from, Tensor& to);
/// The kernel of ops whose output holds input 0's elements as they are (Identity, Reshape, ...).
void copyKernel(KernelContext& ctx);

/// Runs a float kernel on bf16/f16 values: those inputs are widened to f32, the kernel computes
/// in f32, and its f32 results are rounded into the 16-bit outputs. Other dtypes pass straight
/// through. The CPU side of mixed precision; the GPU computes in 16 bits natively.
void runInFloat32(KernelContext& ctx, Kernel kernel);
/// runInFloat32 as a kernel of its own: the CPU kernel of an op whose activations may be 16-bit
/// (OpDef::halfActivations).
template <Kernel kernel>
void inFloat32(KernelContext& ctx) {
  runInFloat32(ctx, kernel);
}

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
