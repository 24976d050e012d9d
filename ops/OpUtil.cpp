#include "ops/OpUtil.h"

#include <algorithm>
#include <mutex>

namespace weft {

void registerAllOps() {
  static std::once_flag once;
  std::call_once(once, [] {
    OpRegistry& r = OpRegistry::global();
    detail::registerElementwiseOps(r);
    detail::registerMatMulOps(r);
    detail::registerReduceOps(r);
    detail::registerShapeOps(r);
    detail::registerSoftmaxOps(r);
    detail::registerEmbeddingOps(r);
    detail::registerConvOps(r);
    detail::registerNormOps(r);
    detail::registerRandomOps(r);
    detail::registerRnnOps(r);
    detail::registerClipOps(r);
    detail::registerStateOps(r);
    detail::registerOptimizerOps(r);
  });
}

namespace detail {

Node* addOp(Graph& g, const std::string& op, std::vector<Output> inputs, Attrs attrs,
            const std::string& name) {
  registerAllOps();
  return g.addNode(op, std::move(inputs), std::move(attrs), name);
}

bool broadcastShapes(const Shape& a, const Shape& b, Shape& out) {
  const int r = std::max(a.rank(), b.rank());
  std::vector<int64_t> dims(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) {
    const int ia = a.rank() - r + i, ib = b.rank() - r + i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    int64_t d;
    if (da == 1) d = db;
    else if (db == 1) d = da;
    else if (da < 0) d = db;
    else if (db < 0) d = da;
    else if (da == db) d = da;
    else return false;
    dims[static_cast<size_t>(i)] = d;
  }
  out = Shape(std::move(dims));
  return true;
}

std::vector<TensorType> sameAsInput(const InferContext& c) { return {c.inputs[0]}; }

void requireFloat(const InferContext& c, int i) {
  c.check(isFloating(c.dtype(i)), "input {} must be floating point, got {}", i, dtypeName(c.dtype(i)));
}

void requireSameDType(const InferContext& c, int i, int j) {
  c.check(c.dtype(i) == c.dtype(j), "inputs {} and {} must have the same dtype, got {} and {}", i, j,
          dtypeName(c.dtype(i)), dtypeName(c.dtype(j)));
}

std::vector<int> normaliseAxes(const InferContext& c, const std::vector<int64_t>& axes, int rank) {
  std::vector<int> out;
  if (axes.empty()) {
    for (int i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (int64_t a : axes) {
    c.check(a >= -rank && a < rank, "axis {} is out of range for rank {}", a, rank);
    out.push_back(static_cast<int>(a < 0 ? a + rank : a));
  }
  std::sort(out.begin(), out.end());
  c.check(std::adjacent_find(out.begin(), out.end()) == out.end(), "repeated axis in reduction");
  return out;
}

}  // namespace detail
}  // namespace weft
