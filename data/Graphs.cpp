// The graph file format (loader and writer), the typed reachability generator and graph batching.
#include "data/Graphs.h"

#include "core/Escape.h"
#include "core/InputFile.h"
#include "core/Random.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <queue>
#include <string_view>

namespace weft::data {
namespace {

// ---- Parsing helpers -----------------------------------------------------------------------

std::optional<int64_t> parseInt(std::string_view s) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

/// A finite decimal float; "nan", "inf" and trailing characters are rejected.
std::optional<double> parseFloat(std::string_view s) {
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

/// Whitespace-separated fields of a line, up to a '#' comment.
std::vector<std::string_view> fieldsOf(std::string_view line) {
  line = line.substr(0, line.find('#'));
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

/// One graph while its block is being read.
struct PendingGraph {
  int64_t line = 0;  // of its "graph" line
  int64_t nodes = 0;
  std::vector<float> features;
  std::vector<int64_t> labels;
  std::vector<int32_t> edges, types;
  std::vector<int64_t> edgeLines;
  std::optional<float> target;
};

class GraphParser {
 public:
  explicit GraphParser(std::string path) : path_(std::move(path)) {}

  GraphFile parse(InputFile& in) {
    std::vector<Example> graphs;
    std::optional<PendingGraph> open;
    bool haveHeader = false;
    std::string text;
    while (in.readLine(text)) {
      line_ = in.line();
      const std::vector<std::string_view> f = fieldsOf(text);
      if (f.empty()) continue;
      if (!haveHeader) {
        parseHeader(f);
        haveHeader = true;
      } else if (!open) {
        if (f[0] != "graph" || f.size() != 1) fail("expected 'graph' to start a block, got '{}'", escapeBytes(text));
        open = PendingGraph{line_, 0, {}, {}, {}, {}, {}, {}};
      } else if (f[0] == "node") {
        parseNode(f, *open);
      } else if (f[0] == "edge") {
        parseEdge(f, *open);
      } else if (f[0] == "target") {
        parseTarget(f, *open);
      } else if (f[0] == "end" && f.size() == 1) {
        graphs.push_back(finish(*open));
        open.reset();
      } else {
        fail("unknown line '{}' inside a graph (expected node, edge, target or end)", escapeBytes(text));
      }
    }
    WEFT_CHECK(haveHeader, "{}: no 'weft-graphs' header line (the file is empty)", path_);
    if (open) fail(open->line, "the graph starting here has no 'end'");
    return {info_, Dataset(std::move(graphs))};
  }

 private:
  template <class... A>
  [[noreturn]] void fail(int64_t line, fmt::format_string<A...> format, A&&... args) const {
    WEFT_THROW("{}:{}: {}", path_, line, fmt::format(format, std::forward<A>(args)...));
  }
  template <class... A>
  [[noreturn]] void fail(fmt::format_string<A...> format, A&&... args) const {
    fail(line_, format, std::forward<A>(args)...);
  }

  int64_t intField(std::string_view s, const std::string& what) const {
    const std::optional<int64_t> v = parseInt(s);
    if (!v) fail("{}: '{}' is not an integer", what, escapeBytes(s));
    return *v;
  }
  double floatField(std::string_view s, const std::string& what) const {
    const std::optional<double> v = parseFloat(s);
    if (!v) fail("{}: '{}' is not a number", what, escapeBytes(s));
    return *v;
  }

  void parseHeader(const std::vector<std::string_view>& f) {
    if (f[0] != "weft-graphs")
      fail("expected the header 'weft-graphs features=F edge_types=K ...', got '{}'", escapeBytes(f[0]));
    bool haveFeatures = false, haveTypes = false;
    for (size_t i = 1; i < f.size(); ++i) {
      const size_t eq = f[i].find('=');
      if (eq == std::string_view::npos) fail("header field '{}' is not key=value", escapeBytes(f[i]));
      const std::string_view key = f[i].substr(0, eq);
      const int64_t v = intField(f[i].substr(eq + 1), fmt::format("header {}", escapeBytes(key)));
      if (key == "features") {
        if (v < 0 || v > kMaxGraphFeatures) fail("header features={} must be in 0..{}", v, kMaxGraphFeatures);
        info_.features = v;
        haveFeatures = true;
      } else if (key == "edge_types") {
        if (v < 1 || v > kMaxEdgeTypes) fail("header edge_types={} must be in 1..{}", v, kMaxEdgeTypes);
        info_.edgeTypes = v;
        haveTypes = true;
      } else if (key == "node_labels" || key == "graph_target") {
        if (v != 0 && v != 1) fail("header {}={} must be 0 or 1", escapeBytes(key), v);
        (key == "node_labels" ? info_.nodeLabels : info_.graphTarget) = v == 1;
      } else {
        fail("unknown header key '{}' (known: features, edge_types, node_labels, graph_target)", escapeBytes(key));
      }
    }
    if (!haveFeatures || !haveTypes) fail("the header must give features= and edge_types=");
  }

  void parseNode(const std::vector<std::string_view>& f, PendingGraph& g) const {
    if (f.size() < 2) fail("node line without an id");
    const int64_t id = intField(f[1], "node id");
    if (id != g.nodes) fail("node id {} is out of order: expected {} (ids count up from 0)", id, g.nodes);
    if (id >= INT32_MAX) fail("node id {} is too large", id);
    const auto extra = static_cast<int64_t>(info_.nodeLabels);
    const auto given = static_cast<int64_t>(f.size()) - 2 - extra;
    if (given != info_.features) {
      fail("node {} has {} features, expected {}{}", id, given, info_.features,
           info_.nodeLabels ? " (and a label)" : "");
    }
    for (int64_t k = 0; k < info_.features; ++k) {
      const std::string what = fmt::format("feature {} of node {}", k, id);
      g.features.push_back(static_cast<float>(floatField(f[static_cast<size_t>(2 + k)], what)));
    }
    if (info_.nodeLabels) {
      const int64_t label = intField(f.back(), fmt::format("label of node {}", id));
      if (label < 0 || label > kMaxNodeLabel) fail("label {} of node {} is outside 0..{}", label, id, kMaxNodeLabel);
      g.labels.push_back(label);
    }
    ++g.nodes;
  }

  void parseEdge(const std::vector<std::string_view>& f, PendingGraph& g) const {
    if (f.size() != 4) fail("an edge line is 'edge SRC DST TYPE', got {} fields", f.size() - 1);
    const int64_t src = intField(f[1], "edge source");
    const int64_t dst = intField(f[2], "edge destination");
    const int64_t type = intField(f[3], "edge type");
    if (type < 0 || type >= info_.edgeTypes) fail("edge type {} is outside [0, {})", type, info_.edgeTypes);
    for (const int64_t node : {src, dst}) {
      if (node < 0 || node >= INT32_MAX) fail("edge {} -> {}: node id {} is invalid", src, dst, node);
    }
    g.edges.push_back(static_cast<int32_t>(src));
    g.edges.push_back(static_cast<int32_t>(dst));
    g.types.push_back(static_cast<int32_t>(type));
    g.edgeLines.push_back(line_);
  }

  void parseTarget(const std::vector<std::string_view>& f, PendingGraph& g) const {
    if (!info_.graphTarget) fail("a target line, but the header says graph_target=0");
    if (f.size() != 2) fail("a target line is 'target VALUE', got {} fields", f.size() - 1);
    if (g.target) fail("a second target for the graph starting at line {}", g.line);
    g.target = static_cast<float>(floatField(f[1], "target"));
  }

  Example finish(PendingGraph& g) const {
    if (g.nodes == 0) fail(g.line, "the graph starting here has no nodes");
    if (info_.graphTarget && !g.target) fail(g.line, "the graph starting here has no target line");
    for (size_t e = 0; e < g.types.size(); ++e) {
      for (const int32_t node : {g.edges[2 * e], g.edges[2 * e + 1]}) {
        if (node >= g.nodes) {
          fail(g.edgeLines[e], "edge {} -> {}: node {} does not exist (the graph has {} nodes)", g.edges[2 * e],
               g.edges[2 * e + 1], node, g.nodes);
        }
      }
    }
    const auto e = static_cast<int64_t>(g.types.size());
    Example ex{{"features", Tensor::fromVector(g.features, {g.nodes, info_.features})},
               {"edges", Tensor::fromVector(g.edges, {e, 2})},
               {"edge_types", Tensor::fromVector(g.types, {e})}};
    if (info_.nodeLabels) ex["labels"] = Tensor::fromVector(g.labels, {g.nodes});
    if (g.target) ex["target"] = Tensor::scalar(f32, *g.target);
    return ex;
  }

  std::string path_;
  int64_t line_ = 0;
  GraphFileInfo info_;
};

// ---- Generator helpers -------------------------------------------------------------------

constexpr int64_t kUnreached = std::numeric_limits<int64_t>::max();

/// Shortest-path hop counts from `source` over the edges of type `onlyType` (all when < 0).
std::vector<int64_t> hopsFrom(int64_t n, const std::vector<int32_t>& edges, const std::vector<int32_t>& types,
                              int64_t onlyType, int64_t source) {
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(n));
  for (size_t e = 0; e < types.size(); ++e) {
    if (onlyType < 0 || types[e] == onlyType) out[static_cast<size_t>(edges[2 * e])].push_back(edges[2 * e + 1]);
  }
  std::vector<int64_t> hops(static_cast<size_t>(n), kUnreached);
  std::queue<int64_t> frontier;
  hops[static_cast<size_t>(source)] = 0;
  frontier.push(source);
  while (!frontier.empty()) {
    const int64_t v = frontier.front();
    frontier.pop();
    for (const int32_t w : out[static_cast<size_t>(v)]) {
      if (hops[static_cast<size_t>(w)] == kUnreached) {
        hops[static_cast<size_t>(w)] = hops[static_cast<size_t>(v)] + 1;
        frontier.push(w);
      }
    }
  }
  return hops;
}

int64_t deepest(const std::vector<int64_t>& hops) {
  int64_t d = 0;
  for (const int64_t h : hops) {
    if (h != kUnreached) d = std::max(d, h);
  }
  return d;
}

/// One draw of a graph; empty when its paths are deeper than the spec allows.
std::optional<Example> drawReachability(const ReachabilitySpec& spec, uint64_t key) {
  Draws draw(key);
  const int64_t n = spec.minNodes + draw.below(spec.maxNodes - spec.minNodes + 1);
  const auto m = static_cast<int64_t>(std::llround(spec.edgesPerNode * static_cast<double>(n)));
  std::vector<int32_t> edges, types;
  for (int64_t e = 0; e < m; ++e) {
    const int64_t src = draw.below(n);
    int64_t dst = draw.below(n - 1);
    if (dst >= src) ++dst;  // no self loops
    edges.push_back(static_cast<int32_t>(src));
    edges.push_back(static_cast<int32_t>(dst));
    types.push_back(static_cast<int32_t>(draw.below(spec.edgeTypes)));
  }
  const int64_t source = draw.below(n);
  const std::vector<int64_t> any = hopsFrom(n, edges, types, -1, source);
  const std::vector<int64_t> typeA = hopsFrom(n, edges, types, 0, source);
  if (deepest(any) > spec.maxDepth || deepest(typeA) > spec.maxDepth) return std::nullopt;
  std::vector<float> features(static_cast<size_t>(n * kReachabilityFeatures), 0.0f);
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t v = 0; v < n; ++v) {
    const auto i = static_cast<size_t>(v);
    features[i * kReachabilityFeatures + (v == source ? 0 : 1)] = 1.0f;
    labels[i] = typeA[i] != kUnreached ? 2 : any[i] != kUnreached ? 1 : 0;
  }
  return Example{{"features", Tensor::fromVector(features, {n, kReachabilityFeatures})},
                 {"edges", Tensor::fromVector(edges, {m, 2})},
                 {"edge_types", Tensor::fromVector(types, {m})},
                 {"labels", Tensor::fromVector(labels, {n})}};
}

// ---- Collation helpers ---------------------------------------------------------------------

/// The field of graph i, checked for dtype and rank.
const Tensor& fieldOf(const Example& g, size_t i, const std::string& name, DType dtype, int rank) {
  const auto it = g.find(name);
  WEFT_CHECK(it != g.end(), "collateGraphs: graph {} has no '{}' field", i, name);
  const Tensor& t = it->second;
  WEFT_CHECK(t.dtype() == dtype && t.rank() == rank,
             "collateGraphs: graph {} field '{}' is {}{}, expected {} of rank {}", i, name, dtypeName(t.dtype()),
             t.shape().str(), dtypeName(dtype), rank);
  return t;
}

template <class T>
void append(std::vector<T>& out, const Tensor& t) {
  const T* p = t.data<T>();
  out.insert(out.end(), p, p + t.numel());
}

}  // namespace

GraphFile loadGraphs(const std::string& path) {
  InputFile in(path, "graph file", kMaxGraphFileBytes);
  return GraphParser(in.name()).parse(in);
}

void saveGraphs(const std::string& path, const GraphFileInfo& info, const std::vector<Example>& graphs) {
  std::ofstream out(path);
  WEFT_CHECK(out.is_open(), "cannot write graph file '{}'", path);
  out << fmt::format("weft-graphs features={} edge_types={} node_labels={} graph_target={}\n", info.features,
                     info.edgeTypes, info.nodeLabels ? 1 : 0, info.graphTarget ? 1 : 0);
  for (size_t i = 0; i < graphs.size(); ++i) {
    const Example& g = graphs[i];
    const Tensor& features = fieldOf(g, i, "features", f32, 2);
    WEFT_CHECK(features.shape()[1] == info.features,
               "saveGraphs: graph {} has {} features per node, the header says {}", i, features.shape()[1],
               info.features);
    const int64_t n = features.shape()[0];
    const int32_t* edges = fieldOf(g, i, "edges", i32, 2).data<int32_t>();
    const Tensor& types = fieldOf(g, i, "edge_types", i32, 1);
    const int64_t* labels = info.nodeLabels ? fieldOf(g, i, "labels", i64, 1).data<int64_t>() : nullptr;
    const float* f = features.data<float>();
    out << "graph\n";
    for (int64_t v = 0; v < n; ++v) {
      out << "node " << v;
      for (int64_t k = 0; k < info.features; ++k) out << ' ' << fmt::format("{}", f[v * info.features + k]);
      if (labels) out << ' ' << labels[v];
      out << '\n';
    }
    for (int64_t e = 0; e < types.numel(); ++e) {
      out << "edge " << edges[2 * e] << ' ' << edges[2 * e + 1] << ' ' << types.data<int32_t>()[e] << '\n';
    }
    if (info.graphTarget)
      out << "target " << fmt::format("{}", fieldOf(g, i, "target", f32, 0).data<float>()[0]) << '\n';
    out << "end\n";
  }
  WEFT_CHECK(out.good(), "error writing graph file '{}'", path);
}

std::vector<Example> typedReachability(const ReachabilitySpec& spec, int64_t count, uint64_t seed) {
  WEFT_CHECK(spec.minNodes >= 2 && spec.maxNodes >= spec.minNodes && spec.edgeTypes >= 1 && spec.edgesPerNode >= 0 &&
                 spec.maxDepth >= 1 && count >= 0,
             "typedReachability: invalid spec (nodes {}..{}, edge types {}, edges per node {}, depth {}, count {})",
             spec.minNodes, spec.maxNodes, spec.edgeTypes, spec.edgesPerNode, spec.maxDepth, count);
  const uint64_t base = streamKey(seed, "typed_reachability");
  std::vector<Example> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    constexpr int kAttempts = 1000;
    for (int attempt = 0;; ++attempt) {
      WEFT_CHECK(attempt < kAttempts, "typedReachability: no graph within depth {} after {} draws; raise maxDepth",
                 spec.maxDepth, kAttempts);
      std::optional<Example> g = drawReachability(spec, mix64(base ^ mix64(static_cast<uint64_t>(i))) + attempt);
      if (g) {
        out.push_back(std::move(*g));
        break;
      }
    }
  }
  return out;
}

std::vector<Example> basicDeduction(const DeductionSpec& spec, int64_t count, uint64_t seed) {
  WEFT_CHECK(spec.species >= 2 && spec.individuals >= 1 && spec.species + spec.individuals <= (int64_t{1} << 30) &&
                 count >= 0,
             "basicDeduction: invalid spec (species {}, individuals {}, count {})", spec.species, spec.individuals,
             count);
  const uint64_t base = streamKey(seed, "basic_deduction");
  const int64_t n = spec.species + spec.individuals;
  std::vector<Example> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    Draws draw(mix64(base ^ mix64(static_cast<uint64_t>(i))));
    std::vector<int32_t> edges, types;
    std::vector<int64_t> fears(static_cast<size_t>(spec.species)), speciesOf(static_cast<size_t>(spec.individuals));
    for (int64_t s = 0; s < spec.species; ++s) {
      // Another species: a draw among the species - 1 others.
      int64_t feared = draw.below(spec.species - 1);
      fears[static_cast<size_t>(s)] = feared >= s ? feared + 1 : feared;
      edges.insert(edges.end(), {static_cast<int32_t>(s), static_cast<int32_t>(fears[static_cast<size_t>(s)])});
      types.push_back(1);
    }
    for (int64_t k = 0; k < spec.individuals; ++k) {
      speciesOf[static_cast<size_t>(k)] = draw.below(spec.species);
      edges.insert(edges.end(),
                   {static_cast<int32_t>(spec.species + k), static_cast<int32_t>(speciesOf[static_cast<size_t>(k)])});
      types.push_back(0);
    }
    const int64_t asked = draw.below(spec.individuals);
    const int64_t answer = fears[static_cast<size_t>(speciesOf[static_cast<size_t>(asked)])];
    std::vector<float> features;
    std::vector<int64_t> labels(static_cast<size_t>(n), 0);
    labels[static_cast<size_t>(answer)] = 1;
    for (int64_t v = 0; v < n; ++v) {
      const bool isAsked = v == spec.species + asked;
      features.insert(features.end(), {isAsked ? 1.0f : 0.0f, isAsked ? 0.0f : 1.0f});
    }
    const int64_t e = static_cast<int64_t>(types.size());
    out.push_back({{"features", Tensor::fromVector(features, {n, kDeductionFeatures})},
                   {"edges", Tensor::fromVector(edges, {e, 2})},
                   {"edge_types", Tensor::fromVector(types, {e})},
                   {"labels", Tensor::fromVector(labels, {n})}});
  }
  return out;
}

Batch collateGraphs(const std::vector<const Example*>& graphs) {
  WEFT_CHECK(!graphs.empty(), "collateGraphs: no graphs");
  const Example& first = *graphs[0];
  const bool labels = first.count("labels") > 0, target = first.count("target") > 0;
  const int64_t width = fieldOf(first, 0, "features", f32, 2).shape()[1];
  std::vector<float> features, targets;
  std::vector<int32_t> edges, types, nodeGraph;
  std::vector<int64_t> nodeLabels;
  int64_t nodes = 0;
  for (size_t i = 0; i < graphs.size(); ++i) {
    const Example& g = *graphs[i];
    for (const auto& [name, value] : g) {
      WEFT_CHECK(name == "features" || name == "edges" || name == "edge_types" || name == "labels" || name == "target",
                 "collateGraphs: graph {} has an unknown field '{}'", i, name);
    }
    WEFT_CHECK((g.count("labels") > 0) == labels && (g.count("target") > 0) == target,
               "collateGraphs: graph {} does not have the same fields as graph 0", i);
    const Tensor& f = fieldOf(g, i, "features", f32, 2);
    WEFT_CHECK(f.shape()[1] == width, "collateGraphs: graph {} has {} features per node, graph 0 has {}", i,
               f.shape()[1], width);
    const int64_t n = f.shape()[0];
    const Tensor& e = fieldOf(g, i, "edges", i32, 2);
    const Tensor& t = fieldOf(g, i, "edge_types", i32, 1);
    WEFT_CHECK(e.shape()[1] == 2 && t.shape()[0] == e.shape()[0],
               "collateGraphs: graph {} has edges {} and edge types {}", i, e.shape().str(), t.shape().str());
    append<float>(features, f);
    append<int32_t>(types, t);
    for (int64_t k = 0; k < e.numel(); ++k) {
      const int32_t node = e.data<int32_t>()[k];
      WEFT_CHECK(node >= 0 && node < n, "collateGraphs: graph {} has an edge to node {} of {}", i, node, n);
      edges.push_back(static_cast<int32_t>(node + nodes));
    }
    if (labels) {
      const Tensor& l = fieldOf(g, i, "labels", i64, 1);
      WEFT_CHECK(l.shape()[0] == n, "collateGraphs: graph {} has {} labels for {} nodes", i, l.shape()[0], n);
      append<int64_t>(nodeLabels, l);
    }
    if (target) targets.push_back(fieldOf(g, i, "target", f32, 0).data<float>()[0]);
    nodeGraph.insert(nodeGraph.end(), static_cast<size_t>(n), static_cast<int32_t>(i));
    nodes += n;
    WEFT_CHECK(nodes < INT32_MAX, "collateGraphs: more than {} nodes in one batch", INT32_MAX);
  }
  const auto edgeCount = static_cast<int64_t>(types.size());
  Batch b{{"features", Tensor::fromVector(features, {nodes, width})},
          {"edges", Tensor::fromVector(edges, {edgeCount, 2})},
          {"edge_types", Tensor::fromVector(types, {edgeCount})},
          {"node_graph", Tensor::fromVector(nodeGraph, {nodes})}};
  if (labels) b["labels"] = Tensor::fromVector(nodeLabels, {nodes});
  if (target) b["target"] = Tensor::fromVector(targets, {static_cast<int64_t>(targets.size())});
  return b;
}

GraphBatcher::GraphBatcher(Dataset graphs, int64_t batchSize, uint64_t seed, bool shuffle, bool countNodes)
    : graphs_(std::move(graphs)),
      batchSize_(batchSize),
      seed_(seed),
      shuffle_(shuffle),
      countNodes_(countNodes),
      perEpoch_(batchSize > 0 ? static_cast<int64_t>(graphs_.size()) / batchSize : 0) {
  WEFT_CHECK(batchSize > 0, "GraphBatcher: batch size must be > 0, got {}", batchSize);
  WEFT_CHECK(perEpoch_ > 0, "GraphBatcher: {} graphs do not fill one batch of {}", graphs_.size(), batchSize);
}

const std::vector<size_t>& GraphBatcher::orderOf(int64_t epoch) {
  if (epoch == epoch_) return order_;
  order_.resize(graphs_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
  if (shuffle_) {
    const uint64_t key = mix64(streamKey(seed_, "graph_batches") ^ mix64(static_cast<uint64_t>(epoch)));
    for (size_t i = order_.size() - 1; i > 0; --i) {
      const auto j = std::min(i, static_cast<size_t>(uniformAt(key, i) * static_cast<double>(i + 1)));
      std::swap(order_[i], order_[j]);
    }
  }
  epoch_ = epoch;
  return order_;
}

void GraphBatcher::seek(int64_t position) {
  WEFT_CHECK(position >= 0, "GraphBatcher::seek: position {} is negative", position);
  position_ = position;
}

bool GraphBatcher::readPart(int64_t index, int64_t count) {
  WEFT_CHECK(count > 0 && index >= 0 && index < count, "GraphBatcher: part {} of {} is not a valid part", index, count);
  WEFT_CHECK(batchSize_ % count == 0, "GraphBatcher: a batch of {} graphs does not divide among {} parts", batchSize_,
             count);
  part_ = index;
  parts_ = count;
  return true;
}

Batch GraphBatcher::next() {
  const std::vector<size_t>& order = orderOf(position_ / perEpoch_);
  const auto begin = static_cast<size_t>((position_ % perEpoch_) * batchSize_);
  const auto per = static_cast<size_t>(batchSize_ / parts_);
  std::vector<Example> members;
  for (size_t i = begin + static_cast<size_t>(part_) * per; i < begin + static_cast<size_t>(part_ + 1) * per; ++i)
    members.push_back(graphs_.example(order[i]));
  ++position_;
  Batch batch = collateGraphs(pointersTo(members));
  if (countNodes_) {
    // The whole batch's nodes per part, as sliceGraphs' callers normalise a part's loss.
    double nodes = 0;
    for (size_t i = begin; i < begin + static_cast<size_t>(batchSize_); ++i) {
      const size_t g = order[i];
      nodes += static_cast<double>(graphs_.isGenerated() ? graphs_.example(g).at("features").shape()[0]
                                                         : graphs_[g].at("features").shape()[0]);
    }
    batch["node_count"] = Tensor::scalar(f64, nodes / static_cast<double>(parts_));
  }
  return batch;
}

Batch sliceGraphs(const Batch& batch, int64_t index, int64_t count) {
  const std::vector<int32_t> nodeGraph = batch.at("node_graph").toVector<int32_t>();
  const int64_t graphs = nodeGraph.empty() ? 0 : nodeGraph.back() + 1;
  WEFT_CHECK(count > 0 && index >= 0 && index < count, "sliceGraphs: part {} of {}", index, count);
  WEFT_CHECK(graphs % count == 0, "sliceGraphs: a batch of {} graphs does not divide among {} parts", graphs, count);
  const auto g0 = static_cast<int32_t>(index * graphs / count), g1 = static_cast<int32_t>((index + 1) * graphs / count);
  // Graphs, their nodes and their edges are stored in graph order, so a part is one range of each.
  const auto n0 = std::lower_bound(nodeGraph.begin(), nodeGraph.end(), g0) - nodeGraph.begin();
  const auto n1 = std::lower_bound(nodeGraph.begin(), nodeGraph.end(), g1) - nodeGraph.begin();
  const std::vector<int32_t> edges = batch.at("edges").toVector<int32_t>();
  int64_t e0 = 0, e1 = 0;
  for (size_t k = 0; k < edges.size(); k += 2) {
    if (edges[k] < n0) e0 = e1 = static_cast<int64_t>(k / 2) + 1;
    else if (edges[k] < n1) e1 = static_cast<int64_t>(k / 2) + 1;
  }
  auto rows = [&](const std::string& field, int64_t begin, int64_t end) {
    const Tensor& t = batch.at(field);
    Shape shape = t.shape();
    const int64_t rowBytes = t.shape()[0] > 0 ? static_cast<int64_t>(t.bytes()) / t.shape()[0] : 0;
    shape[0] = end - begin;
    Tensor out(t.dtype(), shape);
    if (end > begin) {
      std::memcpy(out.raw(), static_cast<const uint8_t*>(t.raw()) + begin * rowBytes,
                  static_cast<size_t>((end - begin) * rowBytes));
    }
    return out;
  };
  Batch part;
  for (const auto& [field, value] : batch) {
    if (field == "features" || field == "labels") part[field] = rows(field, n0, n1);
    else if (field == "edge_types") part[field] = rows(field, e0, e1);
    else if (field == "target") part[field] = rows(field, g0, g1);
    else if (field == "node_count") part[field] = value;
    else WEFT_CHECK(field == "edges" || field == "node_graph", "sliceGraphs: unknown field '{}'", field);
  }
  Tensor partEdges = rows("edges", e0, e1), partGraph = rows("node_graph", n0, n1);
  for (int64_t k = 0; k < partEdges.numel(); ++k) partEdges.data<int32_t>()[k] -= static_cast<int32_t>(n0);
  for (int64_t k = 0; k < partGraph.numel(); ++k) partGraph.data<int32_t>()[k] -= g0;
  part["edges"] = partEdges;
  part["node_graph"] = partGraph;
  return part;
}

}  // namespace weft::data
