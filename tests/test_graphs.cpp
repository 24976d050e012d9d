// The graph file format (round trip and every loader error), the typed reachability generator
// against an independent reference, and graph batching.
#include "data/Graphs.h"
#include "tests/InputTest.h"
#include "tests/TestUtil.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>

using namespace weft;
using namespace weft::data;

namespace {

const char* const kHeader = "weft-graphs features=2 edge_types=3 node_labels=1\n";

/// The loader's error for a file holding `text`; it must name the file.
std::string loadError(const std::string& text) {
  TempDir dir;
  const std::string path = dir.write("bad.txt", text);
  const std::string e = errorOf([&] { loadGraphs(path); });
  CHECK_MESSAGE(contains(e, path), e);
  return e;
}

void checkSameTensor(const Tensor& a, const Tensor& b) {
  REQUIRE(a.dtype() == b.dtype());
  REQUIRE(a.shape() == b.shape());
  CHECK(a.toDoubles() == b.toDoubles());
}

void checkSameGraphs(const Dataset& loaded, const std::vector<Example>& written) {
  REQUIRE(loaded.size() == written.size());
  for (size_t i = 0; i < written.size(); ++i) {
    REQUIRE(loaded[i].size() == written[i].size());
    for (const auto& [name, value] : written[i]) checkSameTensor(loaded[i].at(name), value);
  }
}

/// Reachability from `source` by repeated relaxation (a different algorithm from the
/// generator's BFS): rounds[v] is the round in which v was first reached, -1 if never.
std::vector<int64_t> relaxRounds(const Example& g, int64_t source, bool typeZeroOnly) {
  const int64_t n = g.at("features").shape()[0];
  const std::vector<int32_t> edges = g.at("edges").toVector<int32_t>();
  const std::vector<int32_t> types = g.at("edge_types").toVector<int32_t>();
  std::vector<int64_t> rounds(static_cast<size_t>(n), -1);
  rounds[static_cast<size_t>(source)] = 0;
  for (int64_t round = 1; round <= n; ++round) {
    std::vector<int64_t> next = rounds;
    for (size_t e = 0; e < types.size(); ++e) {
      if (typeZeroOnly && types[e] != 0) continue;
      const auto s = static_cast<size_t>(edges[2 * e]), d = static_cast<size_t>(edges[2 * e + 1]);
      if (rounds[s] >= 0 && next[d] < 0) next[d] = round;
    }
    rounds = next;
  }
  return rounds;
}

Example tinyGraph(float value, int64_t nodes) {
  std::vector<float> f(static_cast<size_t>(nodes), value);
  std::vector<int32_t> e{0, static_cast<int32_t>(nodes - 1)};
  std::vector<int64_t> labels(static_cast<size_t>(nodes), 1);
  return {{"features", Tensor::fromVector(f, {nodes, 1})},
          {"edges", Tensor::fromVector(e, {1, 2})},
          {"edge_types", Tensor::fromVector(std::vector<int32_t>{0}, {1})},
          {"labels", Tensor::fromVector(labels, {nodes})}};
}

}  // namespace

TEST_CASE("graph files round-trip generated graphs exactly") {
  TempDir dir;
  const std::vector<Example> graphs = typedReachability({}, 20, 3);
  const GraphFileInfo info{kReachabilityFeatures, 3, true, false};
  saveGraphs(dir.file("g.txt"), info, graphs);
  const GraphFile loaded = loadGraphs(dir.file("g.txt"));
  CHECK(loaded.info.features == 2);
  CHECK(loaded.info.edgeTypes == 3);
  CHECK(loaded.info.nodeLabels);
  CHECK_FALSE(loaded.info.graphTarget);
  checkSameGraphs(loaded.graphs, graphs);
}

TEST_CASE("graph files round-trip awkward floats and graph targets") {
  TempDir dir;
  const std::vector<float> f{0.1f, -1.25e-3f, 3.4e38f, 1e-40f, 7.0f, -0.0f};
  const std::vector<Example> graphs{{{"features", Tensor::fromVector(f, {3, 2})},
                                     {"edges", Tensor::fromVector(std::vector<int32_t>{2, 0, 1, 1}, {2, 2})},
                                     {"edge_types", Tensor::fromVector(std::vector<int32_t>{1, 0}, {2})},
                                     {"target", Tensor::scalar(f32, 0.3)}},
                                    {{"features", Tensor::fromVector(std::vector<float>{1, 2}, {1, 2})},
                                     {"edges", Tensor(i32, {0, 2})},
                                     {"edge_types", Tensor(i32, {0})},
                                     {"target", Tensor::scalar(f32, -2.5)}}};
  saveGraphs(dir.file("t.txt"), {2, 2, false, true}, graphs);
  checkSameGraphs(loadGraphs(dir.file("t.txt")).graphs, graphs);
}

TEST_CASE("the documented example file loads") {
  TempDir dir;
  const std::string path = dir.write("doc.txt", R"(# Two graphs with 2 features per node, 3 edge types and node labels.
weft-graphs features=2 edge_types=3 node_labels=1 graph_target=0

graph
node 0 1 0 2          # id, 2 features, label
node 1 0 1 0
node 2 0 1 2
edge 0 1 1            # source, destination, type
edge 0 2 0
end

graph
node 0 0.5 -1.25e-3 1
end
)");
  const GraphFile file = loadGraphs(path);
  REQUIRE(file.graphs.size() == 2);
  CHECK(file.graphs[0].at("edges").toVector<int32_t>() == std::vector<int32_t>{0, 1, 0, 2});
  CHECK(file.graphs[0].at("labels").toVector<int64_t>() == std::vector<int64_t>{2, 0, 2});
  CHECK(file.graphs[1].at("features").shape() == Shape({1, 2}));
  CHECK(file.graphs[1].at("edges").shape() == Shape({0, 2}));
}

TEST_CASE("an edge to a missing node names the file, the edge's line and the node") {
  const std::string e = loadError(std::string(kHeader) + "graph\nnode 0 1 0 1\nedge 0 7 1\nnode 1 0 1 0\nend\n");
  CHECK_MESSAGE(contains(e, ":4: edge 0 -> 7: node 7 does not exist (the graph has 2 nodes)"), e);
}

TEST_CASE("a negative node id in an edge is an error naming the line") {
  const std::string e = loadError(std::string(kHeader) + "graph\nnode 0 1 0 1\nedge -1 0 1\nend\n");
  CHECK_MESSAGE(contains(e, ":4: edge -1 -> 0: node id -1 is invalid"), e);
}

TEST_CASE("a wrong feature count is an error naming the line and node") {
  const std::string e = loadError(std::string(kHeader) + "graph\nnode 0 1 0 1\nnode 1 0.5 1\nend\n");
  CHECK_MESSAGE(contains(e, ":4: node 1 has 1 features, expected 2"), e);
}

TEST_CASE("an unknown edge type is an error naming the line and type") {
  const std::string e = loadError(std::string(kHeader) + "graph\nnode 0 1 0 1\nedge 0 0 3\nend\n");
  CHECK_MESSAGE(contains(e, ":4: edge type 3 is outside [0, 3)"), e);
}

TEST_CASE("non-numeric fields are errors naming the field") {
  CHECK(contains(loadError(std::string(kHeader) + "graph\nnode 0 1 abc 1\nend\n"),
                 ":3: feature 1 of node 0: 'abc' is not a number"));
  CHECK(contains(loadError(std::string(kHeader) + "graph\nnode 0 1 nan 1\nend\n"), "'nan' is not a number"));
  CHECK(contains(loadError(std::string(kHeader) + "graph\nnode 0 1 0 x\nend\n"),
                 ":3: label of node 0: 'x' is not an integer"));
  CHECK(contains(loadError(std::string(kHeader) + "graph\nnode 0 1 0 1\nedge 0 0x1 0\nend\n"),
                 ":4: edge destination: '0x1' is not an integer"));
  CHECK(contains(loadError(std::string(kHeader) + "graph\nnode a 1 0 1\nend\n"), ":3: node id: 'a' is not an integer"));
  CHECK(contains(loadError("weft-graphs features=two edge_types=1\n"), ":1: header features: 'two' is not an integer"));
}

TEST_CASE("node ids must count up from zero") {
  const std::string e = loadError(std::string(kHeader) + "graph\nnode 0 1 0 1\nnode 2 1 0 1\nend\n");
  CHECK_MESSAGE(contains(e, ":4: node id 2 is out of order: expected 1"), e);
}

TEST_CASE("a bad header is an error") {
  CHECK(contains(loadError("graph\n"), ":1: expected the header"));
  CHECK(contains(loadError("weft-graphs features=2\n"), ":1: the header must give features= and edge_types="));
  CHECK(contains(loadError("weft-graphs features=2 edge_types=1 colour=3\n"), ":1: unknown header key 'colour'"));
  CHECK(contains(loadError("weft-graphs features=2 edge_types=0\n"), ":1: header edge_types=0 must be in 1..1024"));
  CHECK(contains(loadError("weft-graphs features=2 edge_types=1 node_labels=2\n"), "node_labels=2 must be 0 or 1"));
  CHECK(contains(loadError("# only a comment\n\n"), "no 'weft-graphs' header"));
}

TEST_CASE("block structure errors name the line") {
  CHECK(contains(loadError(std::string(kHeader) + "node 0 1 0 1\n"), ":2: expected 'graph' to start a block"));
  CHECK(
      contains(loadError(std::string(kHeader) + "graph\nnode 0 1 0 1\n"), ":2: the graph starting here has no 'end'"));
  CHECK(contains(loadError(std::string(kHeader) + "graph\nend\n"), ":2: the graph starting here has no nodes"));
  CHECK(contains(loadError(std::string(kHeader) + "graph\nnode 0 1 0 1\nvertex 1\nend\n"),
                 ":4: unknown line 'vertex 1'"));
  CHECK(contains(loadError(std::string(kHeader) + "graph\nnode 0 1 0 1\nedge 0 0\nend\n"), ":4: an edge line is"));
}

TEST_CASE("graph targets must match the header") {
  CHECK(contains(loadError(std::string(kHeader) + "graph\nnode 0 1 0 1\ntarget 1\nend\n"),
                 ":4: a target line, but the header"));
  const std::string h = "weft-graphs features=1 edge_types=1 graph_target=1\n";
  CHECK(contains(loadError(h + "graph\nnode 0 1\nend\n"), ":2: the graph starting here has no target line"));
  CHECK(contains(loadError(h + "graph\nnode 0 1\ntarget 1\ntarget 2\nend\n"), ":5: a second target"));
  CHECK(contains(loadError(h + "graph\nnode 0 1\ntarget one\nend\n"), ":4: target: 'one' is not a number"));
}

TEST_CASE("a missing graph file is an error naming it") {
  CHECK(contains(errorOf([] { loadGraphs("/nonexistent/weft/graphs.txt"); }), "/nonexistent/weft/graphs.txt"));
}

TEST_CASE("the reachability generator is deterministic and graph i depends only on (seed, i)") {
  const std::vector<Example> a = typedReachability({}, 30, 5), b = typedReachability({}, 30, 5);
  const std::vector<Example> prefix = typedReachability({}, 10, 5), other = typedReachability({}, 30, 6);
  checkSameGraphs(Dataset(a), b);
  checkSameGraphs(Dataset(prefix), std::vector<Example>(a.begin(), a.begin() + 10));
  int differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += a[i].at("labels").toDoubles() != other[i].at("labels").toDoubles();
  CHECK(differing > 10);
}

TEST_CASE("reachability labels agree with an independent relaxation") {
  const ReachabilitySpec spec;
  const std::vector<Example> graphs = typedReachability(spec, 300, 11);
  std::vector<int64_t> classCount(kReachabilityClasses, 0);
  for (const Example& g : graphs) {
    const int64_t n = g.at("features").shape()[0];
    CHECK(n >= spec.minNodes);
    CHECK(n <= spec.maxNodes);
    const std::vector<float> f = g.at("features").toVector<float>();
    int64_t source = -1;
    for (int64_t v = 0; v < n; ++v) {
      CHECK(f[static_cast<size_t>(2 * v)] + f[static_cast<size_t>(2 * v + 1)] == 1.0f);
      if (f[static_cast<size_t>(2 * v)] == 1.0f) {
        CHECK(source == -1);
        source = v;
      }
    }
    REQUIRE(source >= 0);
    const std::vector<int64_t> any = relaxRounds(g, source, false), typeZero = relaxRounds(g, source, true);
    const std::vector<int64_t> labels = g.at("labels").toVector<int64_t>();
    for (int64_t v = 0; v < n; ++v) {
      const auto i = static_cast<size_t>(v);
      const int64_t expected = typeZero[i] >= 0 ? 2 : any[i] >= 0 ? 1 : 0;
      CHECK(labels[i] == expected);
      CHECK(any[i] <= spec.maxDepth);
      CHECK(typeZero[i] <= spec.maxDepth);
      ++classCount[static_cast<size_t>(labels[i])];
    }
    for (const int32_t t : g.at("edge_types").toVector<int32_t>()) CHECK((t >= 0 && t < spec.edgeTypes));
  }
  for (const int64_t c : classCount) CHECK(c > 0);
}

TEST_CASE("collateGraphs joins graphs into one disjoint graph") {
  const Example a = tinyGraph(1, 2), b = tinyGraph(2, 3);
  const Batch batch = collateGraphs({&a, &b});
  CHECK(batch.at("features").shape() == Shape({5, 1}));
  CHECK(batch.at("features").toVector<float>() == std::vector<float>{1, 1, 2, 2, 2});
  CHECK(batch.at("edges").toVector<int32_t>() == std::vector<int32_t>{0, 1, 2, 4});
  CHECK(batch.at("edge_types").toVector<int32_t>() == std::vector<int32_t>{0, 0});
  CHECK(batch.at("labels").shape() == Shape({5}));
  CHECK(batch.at("node_graph").toVector<int32_t>() == std::vector<int32_t>{0, 0, 1, 1, 1});
  CHECK(batch.count("target") == 0);
}

TEST_CASE("sliceGraphs gives each part whole graphs, renumbered, as collating them alone would") {
  const Example a = tinyGraph(1, 2), b = tinyGraph(2, 3), c = tinyGraph(3, 1), d = tinyGraph(4, 4);
  Batch batch = collateGraphs({&a, &b, &c, &d});
  batch["node_count"] = Tensor::scalar(f64, 10);
  const Example* halves[2][2] = {{&a, &b}, {&c, &d}};
  for (int h = 0; h < 2; ++h) {
    CAPTURE(h);
    const Batch part = sliceGraphs(batch, h, 2);
    const Batch alone = collateGraphs({halves[h][0], halves[h][1]});
    for (const char* field : {"features", "labels", "node_graph"})
      CHECK(part.at(field).toDoubles() == alone.at(field).toDoubles());
    CHECK(part.at("edges").toVector<int32_t>() == alone.at("edges").toVector<int32_t>());
    CHECK(part.at("edge_types").toVector<int32_t>() == alone.at("edge_types").toVector<int32_t>());
    CHECK(part.at("node_count").item() == 10);  // the caller decides what each part's share is
  }
  CHECK(contains(errorOf([&] { sliceGraphs(batch, 0, 3); }), "a batch of 4 graphs does not divide among 3 parts"));
}

TEST_CASE("collateGraphs stacks graph targets") {
  Example a = tinyGraph(1, 2), b = tinyGraph(2, 1);
  a["target"] = Tensor::scalar(f32, 0.5);
  b["target"] = Tensor::scalar(f32, -1);
  CHECK(collateGraphs({&a, &b}).at("target").toVector<float>() == std::vector<float>{0.5f, -1.0f});
}

TEST_CASE("collateGraphs rejects graphs that do not fit together") {
  const Example a = tinyGraph(1, 2);
  Example wide = tinyGraph(1, 2);
  wide["features"] = Tensor::zeros(f32, {2, 3});
  CHECK(contains(errorOf([&] { collateGraphs({&a, &wide}); }), "graph 1 has 3 features per node, graph 0 has 1"));
  Example unlabelled = tinyGraph(1, 2);
  unlabelled.erase("labels");
  CHECK(contains(errorOf([&] { collateGraphs({&a, &unlabelled}); }), "graph 1 does not have the same fields"));
  Example extra = tinyGraph(1, 2);
  extra["colour"] = Tensor::zeros(f32, {2});
  CHECK(contains(errorOf([&] { collateGraphs({&extra}); }), "unknown field 'colour'"));
  Example bad = tinyGraph(1, 2);
  bad["edges"] = Tensor::fromVector(std::vector<int32_t>{0, 2}, {1, 2});
  CHECK(contains(errorOf([&] { collateGraphs({&bad}); }), "graph 0 has an edge to node 2 of 2"));
  CHECK(contains(errorOf([] { collateGraphs({}); }), "no graphs"));
}

TEST_CASE("GraphBatcher covers each epoch once, reshuffles per epoch and seeks") {
  std::vector<Example> graphs;
  for (int i = 0; i < 10; ++i) graphs.push_back(tinyGraph(static_cast<float>(i), 1));
  GraphBatcher batcher(Dataset(graphs), 3, 7);
  CHECK(batcher.batchesPerEpoch() == 3);
  std::vector<std::vector<float>> seen;
  for (int b = 0; b < 6; ++b) seen.push_back(batcher.next().at("features").toVector<float>());
  CHECK(batcher.position() == 6);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<float> ids;
    for (int b = 0; b < 3; ++b)
      ids.insert(seen[static_cast<size_t>(3 * epoch + b)].begin(), seen[static_cast<size_t>(3 * epoch + b)].end());
    CHECK(ids.size() == 9);  // nine distinct graphs; one is dropped with the partial batch
  }
  CHECK((seen[0] != seen[3] || seen[1] != seen[4]));
  GraphBatcher resumed(Dataset(graphs), 3, 7);
  resumed.seek(4);
  CHECK(resumed.next().at("features").toVector<float>() == seen[4]);
  CHECK(resumed.position() == 5);
  GraphBatcher again(Dataset(graphs), 3, 7);
  CHECK(again.next().at("features").toVector<float>() == seen[0]);
  CHECK(contains(errorOf([&] { GraphBatcher(Dataset(graphs), 11, 1); }), "10 graphs do not fill one batch of 11"));
}

TEST_CASE("a GraphBatcher reading a part gives what sliceGraphs cuts, with the whole batch's nodes per part") {
  std::vector<Example> graphs;
  for (int i = 0; i < 12; ++i) graphs.push_back(tinyGraph(static_cast<float>(i), 1 + i % 4));
  GraphBatcher whole(Dataset(graphs), 4, 3, true, true);
  std::vector<GraphBatcher> parts;
  for (int r = 0; r < 2; ++r) {
    parts.emplace_back(Dataset(graphs), 4, 3, true, true);
    CHECK(parts.back().readPart(r, 2));
  }
  for (int step = 0; step < 6; ++step) {
    const Batch batch = whole.next();
    for (int r = 0; r < 2; ++r) {
      CAPTURE(step);
      CAPTURE(r);
      const Batch part = parts[static_cast<size_t>(r)].next(), cut = sliceGraphs(batch, r, 2);
      for (const char* field : {"features", "labels", "node_graph", "edges", "edge_types"})
        CHECK(part.at(field).toDoubles() == cut.at(field).toDoubles());
      CHECK(part.at("node_count").item() == batch.at("node_count").item() / 2);
    }
  }
  CHECK(contains(errorOf([&] { GraphBatcher(Dataset(graphs), 4, 3).readPart(0, 3); }),
                 "a batch of 4 graphs does not divide among 3 parts"));
}

TEST_CASE("counts a model would allocate by are bounded, with a message naming the line and value") {
  // Edge types and labels decide a GNN's weight shapes: 1e9 was a bad_alloc, INT64_MAX overflowed.
  CHECK(
      contains(loadError("weft-graphs features=1 edge_types=1025\n"), ":1: header edge_types=1025 must be in 1..1024"));
  CHECK(contains(loadError("weft-graphs features=1 edge_types=2147483647\n"),
                 "edge_types=2147483647 must be in 1..1024"));
  CHECK(contains(loadError("weft-graphs features=100000 edge_types=1\n"),
                 ":1: header features=100000 must be in 0..65536"));
  const std::string labelled = "weft-graphs features=1 edge_types=1 node_labels=1\ngraph\nnode 0 0.5 ";
  CHECK(contains(loadError(labelled + "1000000000\nend\n"), ":3: label 1000000000 of node 0 is outside 0..65535"));
  CHECK(contains(loadError(labelled + "9223372036854775807\nend\n"),
                 ":3: label 9223372036854775807 of node 0 is outside 0..65535"));
  TempDir dir;
  const std::string ok = dir.write("ok.txt", labelled + "65535\nend\ngraph\nnode 0 1 0\nend\n");
  CHECK(loadGraphs(ok).graphs[0].at("labels").item() == 65535);
}

TEST_CASE("graph files that are not regular files are refused, and quoted bytes escaped") {
  TempDir dir;
  CHECK(contains(errorOf([&] { loadGraphs(dir.path.string()); }), "is a directory"));
  CHECK(contains(errorOf([&] { loadGraphs("/dev/null"); }), "/dev/null is a character device"));
  const std::string fifo = makeFifo(dir, "graphs.fifo");
  CHECK(contains(fifoError(fifo, [&] { loadGraphs(fifo); }), fifo + " is a FIFO"));
  const std::string e = loadError(std::string(kHeader) + "graph\n\x1b]2;title\x07 1\n");
  CHECK(contains(e, ":3: unknown line '\\x1b]2;title\\x07 1' inside a graph"));
  CHECK_FALSE(contains(e, "\x1b"));
  CHECK(contains(loadError("weft-graphs features=\xff edge_types=1\n"), "header features: '\\xff' is not an integer"));
}

TEST_CASE(
    "basic deduction graphs: species fear one other species, individuals are of one species, the answer is two hops "
    "away") {
  const DeductionSpec spec{5, 9};
  const std::vector<Example> graphs = basicDeduction(spec, 200, 3);
  for (size_t gi = 0; gi < graphs.size(); ++gi) {
    CAPTURE(gi);
    const Example& g = graphs[gi];
    const std::vector<float> features = g.at("features").toVector<float>();
    const std::vector<int32_t> edges = g.at("edges").toVector<int32_t>(),
                               types = g.at("edge_types").toVector<int32_t>();
    const std::vector<int64_t> labels = g.at("labels").toVector<int64_t>();
    REQUIRE(labels.size() == 14);
    REQUIRE(types.size() == 14);  // one fear per species, one species per individual
    std::vector<int> fears(5, -1), speciesOf(9, -1);
    for (size_t e = 0; e < types.size(); ++e) {
      const int from = edges[2 * e], to = edges[2 * e + 1];
      if (types[e] == 1) {
        REQUIRE(from < 5);
        REQUIRE(to < 5);
        CHECK(from != to);
        fears[static_cast<size_t>(from)] = to;
      } else {
        REQUIRE(from >= 5);
        REQUIRE(to < 5);
        speciesOf[static_cast<size_t>(from - 5)] = to;
      }
    }
    int asked = -1;
    for (int v = 0; v < 14; ++v)
      if (features[static_cast<size_t>(2 * v)] == 1.0f) {
        CHECK(asked == -1);
        asked = v;
      }
    REQUIRE(asked >= 5);
    const int answer = fears[static_cast<size_t>(speciesOf[static_cast<size_t>(asked - 5)])];
    for (int v = 0; v < 14; ++v) CHECK(labels[static_cast<size_t>(v)] == (v == answer ? 1 : 0));
  }
  CHECK(basicDeduction(spec, 5, 3)[4].at("edges").toVector<int32_t>() == graphs[4].at("edges").toVector<int32_t>());
  CHECK(contains(errorOf([] { basicDeduction({1, 3}, 1, 1); }), "species 1"));
}
