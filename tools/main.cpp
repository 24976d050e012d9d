// The weft command line: `weft train MODEL`, `weft graph MODEL`, their --amp forms, `weft launch`, `weft env`
// and `weft secret`.
#include "core/Error.h"
#include "dist/transport/Auth.h"
#include "dist/launch/EngineJob.h"
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

  CLI::App* graph = app.add_subcommand(
      "graph", "print a model's training graph with its gradient links (text, or Graphviz DOT with --dot)");
  std::string model = "mlp";
  bool dot = false;
  graph->add_option("model", model, "model to build")->check(CLI::IsMember(weft::models::zooModelNames()));
  graph->add_flag("--dot", dot, "Graphviz DOT instead of text");
  weft::tools::PipelineCutOptions cut;
  CLI::Option* stages =
      graph
          ->add_option(
              "--stages", cut.stages,
              "print the pipeline cut into S stages instead: each stage's forward ops, measured time, boundary "
              "bytes and memory, and the transfers between stages")
          ->check(CLI::PositiveNumber);
  graph->add_option("--microbatches", cut.microbatches, "the cut profiles one of M micro-batches of a batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  graph->add_option("--link-gbps", cut.linkGbps, "the link speed the cut weighs boundary transfers by")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI::Option* schedule =
      graph
          ->add_option("--schedule", cut.schedule,
                       "the pipeline's schedule, which sets how many micro-batches' activations each stage holds")
          ->capture_default_str()
          ->check(CLI::IsMember(weft::tools::kScheduleNames))
          ->needs(stages);
  CLI::Option* file = weft::tools::addScheduleFileFlag(*graph, cut.scheduleFile)->needs(stages)->excludes(schedule);
  weft::tools::addVirtualStagesFlag(*graph, cut.virtualStages)->needs(schedule)->excludes(file);
  weft::tools::addMemoryPerStageFlag(*graph, cut.memoryPerStage)->needs(stages);
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

  CLI::App* env = app.add_subcommand(
      "env", "print what a cluster engine (Slurm, MPI, torchrun, Kubernetes) told this process: the engine, its rank, "
             "host and role in the job, and where the job's rendezvous runs");
  int serversPerHost = 0;
  env->add_option("--servers-per-host", serversPerHost, "the first K processes of each host serve")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  env->callback([&] {
    std::fputs(weft::dist::describeEngineEnvironment(weft::dist::processEnvironment(), serversPerHost).c_str(), stdout);
  });

  CLI::App* secret = app.add_subcommand(
      "secret", "write a new job secret (64 hex digits, mode 0600) to a file, for --secret-file or WEFT_SECRET_FILE: "
                "the members of a job across hosts prove to each other that they hold it");
  std::string secretPath;
  secret->add_option("path", secretPath, "the file to create (an existing one is not overwritten)")->required();
  secret->callback([&] { weft::dist::saveSecret(secretPath, weft::dist::generateSecret()); });

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
