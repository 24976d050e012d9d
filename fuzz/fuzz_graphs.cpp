// Fuzz target: the graph file reader (data/Graphs.h); seeds are generated graphs written by
// saveGraphs.
#include "data/Graphs.h"
#include "fuzz/Fuzz.h"

#include <cstdlib>

std::vector<std::string> weftFuzzSeeds() {
  using namespace weft::data;
  ReachabilitySpec spec;
  spec.minNodes = 3;
  spec.maxNodes = 5;
  const std::vector<weft::data::Example> graphs = typedReachability(spec, 3, 1);
  GraphFileInfo info{kReachabilityFeatures, spec.edgeTypes, true, false};
  const std::string path = weft::fuzz::inputFile({}, "seed");
  saveGraphs(path, info, graphs);
  std::vector<std::string> seeds{weft::fuzz::fileBytes(path)};
  seeds.push_back(
      "# a comment\nweft-graphs features=1 edge_types=2 node_labels=0 graph_target=1\ngraph\nnode 0 0.5\n"
      "node 1 -1e-3\nedge 0 1 1\nedge 1 0 0\ntarget 2.5\nend\n");
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = weft::fuzz::inputFile(data, size);
  weft::fuzz::refusalsAllowed([&] {
    const weft::data::GraphFile file = weft::data::loadGraphs(path);
    // What loads must satisfy what the models rely on.
    if (file.info.edgeTypes < 1 || file.info.edgeTypes > weft::data::kMaxEdgeTypes) std::abort();
    for (size_t i = 0; i < file.graphs.size(); ++i) {
      const weft::data::Example& g = file.graphs[i];
      const int64_t nodes = g.at("features").shape()[0];
      for (const int32_t node : g.at("edges").toVector<int32_t>()) {
        if (node < 0 || node >= nodes) std::abort();
      }
      if (g.count("labels")) {
        for (const int64_t l : g.at("labels").toVector<int64_t>()) {
          if (l < 0 || l > weft::data::kMaxNodeLabel) std::abort();
        }
      }
    }
    if (file.graphs.size() > 0) {
      std::vector<const weft::data::Example*> all;
      for (size_t i = 0; i < file.graphs.size(); ++i) all.push_back(&file.graphs[i]);
      weft::data::collateGraphs(all);
    }
  });
  return 0;
}
