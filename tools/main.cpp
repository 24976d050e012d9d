// The weft command line: `weft train MODEL`, `weft graph MODEL`, their --amp forms, and `weft launch`.
#include "core/Error.h"
#include "models/ZooModel.h"
#include "tools/AmpTrain.h"
#include "tools/Launch.h"
#include "tools/Train.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

int main(int argc, char** argv) {
  if (weft::tools::wantsAmp(argc, argv)) return weft::tools::runAmp(argc, argv);
  if (weft::tools::wantsLaunch(argc, argv)) return weft::tools::runLaunch(argc, argv);
  CLI::App app("weft: a C++ deep-learning framework with distribution built in");
  app.require_subcommand(1);
  CLI::App* train = app.add_subcommand("train", "train a model-zoo model (weft train MODEL --help)");
  train->require_subcommand(1);
  // Distributed runs start this same command line as each worker, by the binary's absolute path.
  std::vector<std::string> commandLine(argv, argv + argc);
  std::error_code noPath;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", noPath);
  if (!noPath) commandLine[0] = self.string();
  int status = 0;
  weft::tools::addTrainCommands(*train, commandLine, status);

  CLI::App* graph = app.add_subcommand("graph", "print a model's training graph with its gradient links (text, or Graphviz DOT with --dot)");
  std::string model = "mlp";
  bool dot = false;
  graph->add_option("model", model, "model to build")->check(CLI::IsMember(weft::models::zooModelNames()));
  graph->add_flag("--dot", dot, "Graphviz DOT instead of text");
  weft::tools::PipelineCutOptions cut;
  graph->add_option("--stages", cut.stages,
                    "print the pipeline cut into S stages instead: each stage's forward ops, measured time and boundary "
                    "bytes, and the transfers between stages")
      ->check(CLI::PositiveNumber);
  graph->add_option("--microbatches", cut.microbatches, "the cut profiles one of M micro-batches of a batch")
      ->capture_default_str()->check(CLI::PositiveNumber);
  graph->add_option("--link-gbps", cut.linkGbps, "the link speed the cut weighs boundary transfers by")
      ->capture_default_str()->check(CLI::PositiveNumber);
  graph->add_option("--threads", cut.threads, "intra-op threads of the profiled step")->capture_default_str();
  graph->callback([&] {
    weft::Graph g;
    auto zoo = weft::models::makeZooModel(model);
    zoo->build(g, {});
    weft::Node* step = weft::optim::Adam(1e-3).minimize(zoo->loss());
    if (cut.stages > 0) {
      std::fputs(weft::tools::describePipelineCut(g, *zoo, step, cut).c_str(), stdout);
      return;
    }
    std::fputs((dot ? g.toDot() : g.dump()).c_str(), stdout);
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "weft: error: {}\n", e.what());
    return 1;
  }
  return status;
}
