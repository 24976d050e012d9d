// Collective ops (see the header): definitions, shape functions and kernels.
#include "dist/CollectiveOps.h"

#include "core/Error.h"
#include "core/OpRegistry.h"
#include "core/Tensor.h"
#include "dist/Communicator.h"
#include "dist/Nccl.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace weft::dist {

namespace {

Communicator& communicatorOf(const KernelContext& ctx) {
  return Communicator::byId(ctx.attrs().getInt("communicator"));
}

void writeTicket(KernelContext& ctx, uint64_t ticket) {
  ctx.output(0).data<int64_t>()[0] = static_cast<int64_t>(ticket);
}

uint64_t readTicket(const KernelContext& ctx) { return static_cast<uint64_t>(ctx.input(0).data<int64_t>()[0]); }

/// Multiplies a floating tensor by `scale`.
void scaleInPlace(Tensor& out, double scale) {
  if (scale == 1.0) return;
  dispatchFloat(out.dtype(), [&](auto z) {
    using T = decltype(z);
    T* p = out.data<T>();
    const T s = static_cast<T>(scale);
    for (int64_t i = 0, n = out.numel(); i < n; ++i) p[i] *= s;
  });
}

std::vector<TensorType> ticketType(const InferContext&) { return {{DType::I64, Shape{}}}; }

std::vector<TensorType> allReduceStartInfer(const InferContext& c) {
  c.check(c.numInputs() >= 1, "needs at least one input");
  for (int i = 0; i < c.numInputs(); ++i) {
    c.check(c.dtype(i) == c.dtype(0), "input {} is {}, input 0 is {}: one AllReduce sums one dtype", i,
            dtypeName(c.dtype(i)), dtypeName(c.dtype(0)));
    c.check(c.dtype(i) == DType::F32 || c.dtype(i) == DType::F64 || c.dtype(i) == DType::I64,
            "dtype {} cannot be summed (f32, f64, i64 can)", dtypeName(c.dtype(i)));
  }
  return ticketType(c);
}

void allReduceStartKernel(KernelContext& ctx) {
  size_t total = 0;
  for (int i = 0; i < ctx.numInputs(); ++i) total += ctx.input(i).bytes();
  std::vector<uint8_t> buffer(total);
  size_t offset = 0;
  for (int i = 0; i < ctx.numInputs(); ++i) {
    std::memcpy(buffer.data() + offset, ctx.input(i).raw(), ctx.input(i).bytes());
    offset += ctx.input(i).bytes();
  }
  const DType dtype = ctx.input(0).dtype();
  const auto count = static_cast<int64_t>(total / dtypeSize(dtype));
  writeTicket(ctx, communicatorOf(ctx).submit(
                       std::move(buffer),
                       [dtype, count](Ring& ring, std::vector<uint8_t>& b) { ring.allReduceSum(dtype, b.data(), count); },
                       TrafficKind::Dense));
}

std::vector<TensorType> allReduceWaitInfer(const InferContext& c) {
  c.check(c.dtype(0) == DType::I64, "input 0 must be the i64 ticket of an AllReduceStart");
  return std::vector<TensorType>(c.inputs.begin() + 1, c.inputs.end());
}

void allReduceWaitKernel(KernelContext& ctx) {
  const std::vector<uint8_t> buffer = communicatorOf(ctx).wait(readTicket(ctx));
  const double scale = ctx.attrs().getFloat("scale");
  size_t offset = 0;
  for (int i = 1; i < ctx.numInputs(); ++i) {
    Tensor& out = ctx.output(i - 1);
    WEFT_CHECK(offset + out.bytes() <= buffer.size(), "{}: the reduced buffer has {} bytes, fewer than the inputs",
               ctx.node->describe(), buffer.size());
    std::memcpy(out.raw(), buffer.data() + offset, out.bytes());
    scaleInPlace(out, scale);
    offset += out.bytes();
  }
}

std::vector<TensorType> allGatherStartInfer(const InferContext& c) {
  c.check(c.shape(0).rank() == 1, "indices must have rank 1, got {}", c.shape(0).str());
  c.check(c.shape(1).rank() >= 1, "values must have a row dimension, got {}", c.shape(1).str());
  return ticketType(c);
}

/// The distinct values among a step's row ids.
int64_t distinctRows(const Tensor& indices) {
  std::vector<int64_t> ids(static_cast<size_t>(indices.numel()));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = indices.dtype() == DType::I32 ? indices.data<int32_t>()[i] : indices.data<int64_t>()[i];
  }
  std::sort(ids.begin(), ids.end());
  return std::unique(ids.begin(), ids.end()) - ids.begin();
}

void allGatherStartKernel(KernelContext& ctx) {
  const Tensor& indices = ctx.input(0);
  const Tensor& values = ctx.input(1);
  communicatorOf(ctx).recordSparseRows(ctx.attrs().get<std::string>("variable"), indices.numel(),
                                       distinctRows(indices), ctx.attrs().getInt("variable_rows"));
  std::vector<uint8_t> block(indices.bytes() + values.bytes());
  std::memcpy(block.data(), indices.raw(), indices.bytes());
  std::memcpy(block.data() + indices.bytes(), values.raw(), values.bytes());
  const std::string name = ctx.node->describe();
  writeTicket(ctx, communicatorOf(ctx).submit(
                       std::move(block),
                       [name](Ring& ring, std::vector<uint8_t>& b) {
                         const std::vector<uint64_t> sizes = ring.allGatherSizes(b.size());
                         for (size_t r = 0; r < sizes.size(); ++r) {
                           WEFT_CHECK(sizes[r] == b.size(),
                                      "{}: rank {} gathers {} bytes of sparse rows but rank {} has {}: under the AR "
                                      "architecture every worker needs a batch of the same shape",
                                      name, r, sizes[r], ring.rank(), b.size());
                         }
                         b = ring.allGather(b);
                       },
                       TrafficKind::Sparse));
}

std::vector<TensorType> allGatherWaitInfer(const InferContext& c) {
  c.check(c.dtype(0) == DType::I64, "input 0 must be the i64 ticket of an AllGatherStart");
  const int64_t world = c.attrs().getInt("world_size");
  auto gathered = [&](int i) {
    Shape s = c.shape(i);
    if (s[0] >= 0) s[0] *= world;
    return TensorType{c.dtype(i), s};
  };
  return {gathered(1), gathered(2)};
}

void allGatherWaitKernel(KernelContext& ctx) {
  const std::vector<uint8_t> gathered = communicatorOf(ctx).wait(readTicket(ctx));
  const size_t indexBytes = ctx.input(1).bytes(), valueBytes = ctx.input(2).bytes();
  const size_t world = gathered.size() / (indexBytes + valueBytes);
  Tensor& indices = ctx.output(0);
  Tensor& values = ctx.output(1);
  WEFT_CHECK(indices.bytes() == world * indexBytes && values.bytes() == world * valueBytes,
             "{}: gathered {} bytes, expected {} ranks of {} + {}", ctx.node->describe(), gathered.size(),
             indices.bytes() / std::max<size_t>(indexBytes, 1), indexBytes, valueBytes);
  for (size_t r = 0; r < world; ++r) {
    const uint8_t* block = gathered.data() + r * (indexBytes + valueBytes);
    std::memcpy(static_cast<uint8_t*>(indices.raw()) + r * indexBytes, block, indexBytes);
    std::memcpy(static_cast<uint8_t*>(values.raw()) + r * valueBytes, block + indexBytes, valueBytes);
  }
  scaleInPlace(values, ctx.attrs().getFloat("scale"));
}

}  // namespace

void registerCollectiveOps() {
  static std::once_flag once;
  std::call_once(once, [] {
    OpRegistry& r = OpRegistry::global();
    r.add(OpDef("AllReduceStart").inputs(1, -1).infer(allReduceStartInfer).cpu(allReduceStartKernel)
              .cuda(WEFT_NCCL_KERNEL(allReduceStart)).launchAsync().noGradient());
    r.add(OpDef("AllReduceWait").inputs(2, -1).infer(allReduceWaitInfer).cpu(allReduceWaitKernel)
              .cuda(WEFT_NCCL_KERNEL(allReduceWait)).noGradient());
    r.add(OpDef("AllGatherStart").inputs(2).infer(allGatherStartInfer).cpu(allGatherStartKernel)
              .launchAsync().noGradient());
    r.add(OpDef("AllGatherWait").inputs(3).infer(allGatherWaitInfer).cpu(allGatherWaitKernel).noGradient());
  });
}

std::vector<Output> allReduce(const std::vector<Output>& xs, int64_t communicator, double scale, bool onGpu) {
  registerCollectiveOps();
  Graph& g = xs.at(0).graph();
  const std::string& device = xs[0].node()->device;
  auto placed = g.onDevice(onGpu && device.rfind("cuda", 0) == 0 ? device : "");
  Node* start = g.addNode("AllReduceStart", xs, {{"communicator", communicator}});
  std::vector<Output> waitInputs{start->output()};
  waitInputs.insert(waitInputs.end(), xs.begin(), xs.end());
  Node* wait = g.addNode("AllReduceWait", waitInputs, {{"communicator", communicator}, {"scale", scale}});
  std::vector<Output> out;
  for (size_t i = 0; i < xs.size(); ++i) out.push_back(wait->output(static_cast<int>(i)));
  return out;
}

std::pair<Output, Output> allGatherRows(Output indices, Output values, int64_t communicator, int worldSize,
                                        double scale, const std::string& variable, int64_t variableRows) {
  registerCollectiveOps();
  Graph& g = indices.graph();
  Node* start = g.addNode("AllGatherStart", {indices, values},
                          {{"communicator", communicator}, {"variable", variable}, {"variable_rows", variableRows}});
  Node* wait = g.addNode("AllGatherWait", {start->output(), indices, values},
                         {{"communicator", communicator}, {"scale", scale}, {"world_size", int64_t{worldSize}}});
  return {wait->output(0), wait->output(1)};
}

}  // namespace weft::dist
