// `weft launch` (see the header). Its own flags end at "--"; everything after is the program's
// command line, passed on untouched.
#include "tools/Launch.h"

#include "dist/Config.h"
#include "dist/Launcher.h"
#include "dist/ResourceSpec.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace weft::tools {
namespace {

struct LaunchFlags {
  int workers = 0;
  int servers = 1;
  std::string cluster;
  std::string arch;
  int maxRestarts = 0;
  double rendezvousSeconds = 60;
};

/// A program named by a path ("./train", "bin/train") runs by its absolute path, so every process
/// finds it whatever its working directory; a bare name is looked up in PATH as a shell would.
std::string resolveProgram(const std::string& program) {
  if (program.find('/') == std::string::npos) return program;
  return std::filesystem::absolute(program).lexically_normal().string();
}

}  // namespace

bool wantsLaunch(int argc, char** argv) { return argc >= 2 && std::strcmp(argv[1], "launch") == 0; }

int runLaunch(int argc, char** argv) {
  std::vector<std::string> own(argv + 2, argv + argc);
  std::vector<std::string> command;
  const auto dashes = std::find(own.begin(), own.end(), "--");
  if (dashes != own.end()) {
    command.assign(dashes + 1, own.end());
    own.erase(dashes, own.end());
  }
  CLI::App app("usage: weft launch [--workers N [--servers M] | --cluster SPEC.json] [--arch auto|ar|ps] -- PROGRAM "
               "[ARGS...]\n\nRuns PROGRAM as every worker and parameter server of a job; inside it, "
               "dist::get_runner(graph, config) joins the job.",
               "weft launch");
  LaunchFlags f;
  CLI::Option* workers = app.add_option("--workers", f.workers, "local CPU worker processes")->check(CLI::PositiveNumber);
  app.add_option("--servers", f.servers, "local parameter-server processes (with --workers)")
      ->capture_default_str()->check(CLI::NonNegativeNumber)->needs(workers);
  app.add_option("--cluster", f.cluster, "the hosts of this resource specification (JSON; see README)")
      ->check(CLI::ExistingFile)->excludes(workers);
  app.add_option("--arch", f.arch, "how the program's variables are synchronised, overriding its dist::Config: auto, ar "
                 "or ps (passed to every process as WEFT_ARCH)")
      ->check(CLI::IsMember({"auto", "ar", "ps"}));
  app.add_option("--max-restarts", f.maxRestarts, "start the whole job again up to N times after a process fails")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--rendezvous-timeout", f.rendezvousSeconds, "seconds the processes have to join the job")
      ->capture_default_str()->check(CLI::PositiveNumber);
  try {
    std::reverse(own.begin(), own.end());  // CLI11 takes a vector of arguments last-first
    app.parse(own);
    if (command.empty()) throw CLI::ValidationError("PROGRAM", "name the program to run after \"--\"");
    if (f.workers == 0 && f.cluster.empty()) throw CLI::ValidationError("--workers or --cluster", "one is required");
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    const dist::ResourceSpec spec = f.cluster.empty() ? dist::ResourceSpec::localCpu(f.workers, f.servers)
                                                      : dist::ResourceSpec::load(f.cluster);
    command[0] = resolveProgram(command[0]);
    dist::LaunchOptions options;
    options.rendezvousTimeout = std::chrono::milliseconds(static_cast<int64_t>(f.rendezvousSeconds * 1000));
    options.maxRestarts = f.maxRestarts;
    if (!f.arch.empty()) options.environment[dist::kArchitectureVariable] = f.arch;
    return dist::launch(spec, command, options);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "weft launch: error: {}\n", e.what());
    return 1;
  }
}

}  // namespace weft::tools
