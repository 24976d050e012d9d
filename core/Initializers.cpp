// Variable initializers (see the header).
#include "core/Initializers.h"

#include "core/Error.h"
#include "core/Random.h"

#include <cmath>

namespace weft {

Tensor initialValue(const Graph& graph, const Node& variable) {
  const Attrs& a = variable.attrs;
  const DType dtype = a.get<DType>("dtype");
  const Shape& shape = a.get<Shape>("shape");
  const Initializer::Kind kind = Initializer::parseKind(a.get<std::string>("init"));
  const double p = a.getFloat("init_a"), q = a.getFloat("init_b");
  Tensor t(dtype, shape);  // made on the host, then moved to the variable's device
  const uint64_t key = streamKey(graph.seed(), variable.name);
  const auto [fanIn, fanOut] = fans(shape);
  auto fillWith = [&](auto draw) {
    dispatchStorage(dtype, [&](auto z) {
      using T = decltype(z);
      T* d = t.data<T>();
      for (int64_t i = 0, n = t.numel(); i < n; ++i) d[i] = convertElement<T>(draw(static_cast<uint64_t>(i)));
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
    case Initializer::Kind::Value: t.copyFrom(a.get<Tensor>("value")); break;
    case Initializer::Kind::CopyOf: t.copyFrom(initialValue(graph, *graph.find(a.get<std::string>("source")))); break;
  }
  return t;
}

}  // namespace weft
