// `weft launch` (see the header). Its own flags end at "--"; everything after is the program's
// command line, passed on untouched.
#include "tools/Launch.h"

#include "core/Error.h"
#include "dist/Config.h"
#include "dist/launch/Launcher.h"
#include "dist/launch/PartitionSampling.h"
#include "dist/launch/ResourceSpec.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace weft::tools {
namespace {

struct LaunchFlags {
  int workers = 0;
  int servers = -1;  // -1: one for data-parallel workers, none for a pipeline
  int stages = 1;
  int microbatches = 0;  // 0: the program's own
  std::string cluster;
  std::string arch;
  std::string sync;
  std::string partitions;  // "": the program's own; "auto": searched; else a count
  int64_t partitionSearchSteps = 100;
  int maxRestarts = 0;
  int minWorkers = 0;
  double probeEvery = 5;
  double rendezvousSeconds = 60;
  bool encrypt = false;
};

/// What the flags set over the program's dist::Config, in every process's environment.
std::map<std::string, std::string> launchSettings(const LaunchFlags& f) {
  std::map<std::string, std::string> settings;
  if (!f.arch.empty()) settings[dist::kArchitectureVariable] = f.arch;
  if (!f.sync.empty()) settings[dist::kSyncVariable] = f.sync;
  if (f.stages > 1) settings[dist::kStagesVariable] = std::to_string(f.stages);
  if (f.microbatches > 0) settings[dist::kMicrobatchesVariable] = std::to_string(f.microbatches);
  if (!f.partitions.empty() && f.partitions != "auto") settings[dist::kPartitionsVariable] = f.partitions;
  return settings;
}

/// A program named by a path ("./train", "bin/train") runs by its absolute path, so every process
/// finds it whatever its working directory; a bare name is looked up in PATH as a shell would.
std::string resolveProgram(const std::string& program) {
  if (program.find('/') == std::string::npos) return program;
  return std::filesystem::absolute(program).lexically_normal().string();
}

/// The flags of `weft launch` before "--": the job's shape and the settings its processes get.
void addLaunchFlags(CLI::App& app, LaunchFlags& f) {
  CLI::Option* workers =
      app.add_option("--workers", f.workers, "local CPU worker processes")->check(CLI::PositiveNumber);
  app.add_option("--servers", f.servers,
                 "local parameter-server processes (with --workers; default 1, or 0 with --stages: a pipeline's "
                 "stages keep their variables unless told to serve them)")
      ->check(CLI::NonNegativeNumber)
      ->needs(workers);
  app.add_option("--cluster", f.cluster, "the hosts of this resource specification (JSON; see README)")
      ->check(CLI::ExistingFile)->excludes(workers);
  app.add_option("--arch", f.arch,
                 "how the program's variables are synchronised, overriding its dist::Config: auto, ar "
                 "or ps (passed to every process as WEFT_ARCH)")
      ->check(CLI::IsMember({"auto", "ar", "ps"}));
  app.add_option("--sync", f.sync, "bsp, asp, ssp:S or dssp:L:H, overriding the program's config (WEFT_SYNC)");
  app.add_option("--stages", f.stages,
                 "pipeline stages: --workers N runs N replicas of S stages, one process each, "
                 "with parameter servers only where --servers asks for them (WEFT_STAGES)")
      ->check(CLI::PositiveNumber)
      ->needs(workers);
  app.add_option("--microbatches", f.microbatches, "micro-batches per step of a pipeline (WEFT_MICROBATCHES)")
      ->check(CLI::PositiveNumber);
  app.add_option("--partitions", f.partitions,
                 "partitions of each split sparse variable (WEFT_PARTITIONS); auto: searched by running samples of the "
                 "job, which dist::TrainingLoop times and continues from one another's checkpoint")
      ->check(CLI::PositiveNumber | CLI::IsMember({"auto"}));
  app.add_option("--partition-search-steps", f.partitionSearchSteps,
                 "steps each sample of --partitions auto trains, "
                 "the second half timed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--encrypt", f.encrypt,
               "encrypt the data plane's payloads (AES-256-GCM), as the specification's \"encrypt\": true does");
  app.add_option("--max-restarts", f.maxRestarts,
                 "start the whole job again up to N times after a process fails "
                 "(dist::TrainingLoop continues from its checkpoint)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--min-workers", f.minWorkers,
                 "an elastic --cluster job: it runs on the hosts that answer, with at least N workers; a restart "
                 "leaves out a host that is gone, and one that answers again joins after the job stops at a "
                 "checkpoint (dist::TrainingLoop stops when asked)")
      ->check(CLI::PositiveNumber);
  app.add_option("--probe-every", f.probeEvery,
                 "seconds between an elastic job's probes of the hosts it runs without (--min-workers)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--rendezvous-timeout", f.rendezvousSeconds, "seconds the processes have to join the job")
      ->capture_default_str()->check(CLI::PositiveNumber);
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
  CLI::App app(
      "usage: weft launch [--workers N [--servers M] [--stages S] | --cluster SPEC.json] [--arch auto|ar|ps] "
      "[--sync MODE] [--partitions N|auto] [--max-restarts N] [--min-workers N] -- PROGRAM [ARGS...]\n\nRuns PROGRAM "
      "as every "
      "worker and parameter server of a job; inside it, dist::get_runner(graph, config) joins the job, with "
      "these flags over its config, and dist::TrainingLoop checkpoints, resumes and samples for "
      "--partitions auto.",
      "weft launch");
  LaunchFlags f;
  addLaunchFlags(app, f);
  try {
    std::reverse(own.begin(), own.end());  // CLI11 takes a vector of arguments last-first
    app.parse(own);
    if (command.empty()) throw CLI::ValidationError("PROGRAM", "name the program to run after \"--\"");
    if (f.workers == 0 && f.cluster.empty()) throw CLI::ValidationError("--workers or --cluster", "one is required");
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    // A pipeline's stages keep their variables unless servers are asked for.
    const int servers = f.servers >= 0 ? f.servers : f.stages > 1 ? 0 : 1;
    dist::ResourceSpec spec = f.cluster.empty() ? dist::ResourceSpec::localCpu(f.workers * f.stages, servers)
                                                : dist::ResourceSpec::load(f.cluster);
    if (f.encrypt) spec.setEncrypt(true);
    WEFT_CHECK(f.minWorkers == 0 || f.stages == 1,
               "--min-workers with --stages {}: a pipeline's stages are not resized", f.stages);
    command[0] = resolveProgram(command[0]);
    dist::LaunchOptions options;
    options.rendezvousTimeout = std::chrono::milliseconds(static_cast<int64_t>(f.rendezvousSeconds * 1000));
    options.maxRestarts = f.maxRestarts;
    options.minWorkers = f.minWorkers;
    options.hostProbeInterval = std::chrono::milliseconds(static_cast<int64_t>(f.probeEvery * 1000));
    options.environment = launchSettings(f);
    if (f.partitions != "auto") return dist::launch(spec, command, options);
    WEFT_CHECK(f.minWorkers == 0,
               "--min-workers with --partitions auto: the search times one size of the job; give --partitions a count");
    WEFT_CHECK(spec.serverCount() > 0,
               "--partitions auto splits variables on parameter servers, and this job has none");
    dist::PartitionSearchOptions search;
    search.sampleSteps = f.partitionSearchSteps;
    dist::launchSearchingPartitions(spec, command, options, search);
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "weft launch: error: {}\n", e.what());
    return 1;
  }
}

}  // namespace weft::tools
