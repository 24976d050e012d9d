// Variable initializers (see the header).
#include "core/Initializers.h"

#include "core/Checkpoint.h"
#include "core/Error.h"
#include "core/Random.h"

#include <cmath>

namespace weft {

namespace {

/// The whole value of an initializer that is not drawn element by element.
Tensor wholeValue(const Graph& graph, const Node& variable) {
  const Attrs& a = variable.attrs;
  if (Initializer::parseKind(a.get<std::string>("init")) == Initializer::Kind::Value) return a.get<Tensor>("value");
  return initialValue(graph, *graph.find(a.get<std::string>("source")), Whole::Yes);
}

}  // namespace

Tensor initialValue(const Graph& graph, const Node& variable, Whole whole) {
  const Attrs& a = variable.attrs;
  const DType dtype = a.get<DType>("dtype");
  const Shape wholeShape = Graph::wholeShapeOf(variable);
  const bool shard = Graph::isShard(variable) && whole == Whole::No;
  // A shard draws elements [first, first + count) of the whole: each element's draw depends only
  // on the variable's key and its index in the whole, so every rank's shards make up the whole.
  const uint64_t first = shard ? static_cast<uint64_t>(Graph::shardOffsetOf(variable)) : 0;
  Tensor t(dtype, shard ? a.get<Shape>("shape") : wholeShape);  // made on the host, then moved to the device
  const Initializer::Kind kind = Initializer::parseKind(a.get<std::string>("init"));
  const double p = a.getFloat("init_a"), q = a.getFloat("init_b");
  const uint64_t key = streamKey(graph.seed(), variable.name);
  const auto [fanIn, fanOut] = fans(wholeShape);
  auto fillWith = [&](auto draw) {
    dispatchStorage(dtype, [&](auto z) {
      using T = decltype(z);
      T* d = t.data<T>();
      for (int64_t i = 0, n = t.numel(); i < n; ++i)
        d[i] = convertElement<T>(draw(first + static_cast<uint64_t>(i)));
    });
  };
  switch (kind) {
    case Initializer::Kind::Zeros: t.fill(0); break;
    case Initializer::Kind::Constant: t.fill(p); break;
    case Initializer::Kind::Uniform: fillWith([&](uint64_t i) { return p + (q - p) * uniformAt(key, i); }); break;
    case Initializer::Kind::Normal: fillWith([&](uint64_t i) { return p + q * normalAt(key, i); }); break;
    case Initializer::Kind::TruncatedNormal:
      fillWith([&](uint64_t i) {
        for (uint64_t attempt = 0;; ++attempt) {
          const double z = normalAt(key, i + attempt * 0x100000000ULL);
          if (std::abs(z) <= 2.0) return q * z;
        }
      });
      break;
    case Initializer::Kind::GlorotUniform: {
      const double limit = std::sqrt(6.0 / (fanIn + fanOut));
      fillWith([&](uint64_t i) { return -limit + 2 * limit * uniformAt(key, i); });
      break;
    }
    case Initializer::Kind::HeNormal: {
      const double stddev = std::sqrt(2.0 / fanIn);
      fillWith([&](uint64_t i) { return stddev * normalAt(key, i); });
      break;
    }
    case Initializer::Kind::Value:
    case Initializer::Kind::CopyOf:
      if (shard) copyShardOf(variable, wholeValue(graph, variable), t);
      else t.copyFrom(wholeValue(graph, variable));
      break;
  }
  return t;
}

}  // namespace weft
