// The weft command line: `weft train MODEL`, `weft graph MODEL`.
#include "core/Error.h"
#include "models/Mlp.h"
#include "optim/Optimizer.h"
#include "tools/TrainMlp.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app("weft: a C++ deep-learning framework with distribution built in");
  app.require_subcommand(1);
  CLI::App* train = app.add_subcommand("train", "train a model-zoo model");
  train->require_subcommand(1);
  weft::tools::addTrainMlp(*train);

  CLI::App* graph = app.add_subcommand("graph", "print a model's training graph with its gradient links (text, or Graphviz DOT with --dot)");
  std::string model = "mlp";
  bool dot = false;
  graph->add_option("model", model, "model to build")->check(CLI::IsMember({"mlp"}));
  graph->add_flag("--dot", dot, "Graphviz DOT instead of text");
  graph->callback([&] {
    weft::Graph g;
    const weft::models::MlpModel m = weft::models::buildMlp(g, {});
    weft::optim::Adam(1e-3).minimize(m.loss);
    std::fputs((dot ? g.toDot() : g.dump()).c_str(), stdout);
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const weft::Error& e) {
    fmt::print(stderr, "weft: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
