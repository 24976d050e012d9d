// `weft train MODEL`: the model-zoo trainer. One subcommand per zoo model, with the common flags
// (steps, batch, optimizer, threads, seed, data, output, evaluation, checkpoints, resume, bench)
// and the model's own options.
#pragma once

#include "core/Graph.h"
#include "models/ZooModel.h"

#include <CLI/CLI.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace weft::tools {

/// Adds one subcommand per zoo model to `train`. `commandLine` (this process's executable and
/// arguments) is what a distributed run starts as each of its worker and server processes. A
/// training run sets `status` to the process's exit status (a parameter server's own).
void addTrainCommands(CLI::App& train, const std::vector<std::string>& commandLine, int& status);

/// A flag per option of a model (bound to its configuration's fields); throws naming a flag the
/// command already has.
void addModelFlags(CLI::App& cmd, const std::string& model, const std::vector<models::ModelOption>& options);

/// --resume [on|auto] and --resume-changed; `what` says what --resume continues from.
void addResumeFlags(CLI::App& cmd, std::string& resume, bool& resumeChanged, const std::string& what);

/// A model option's value as checkpoints record it ("true", "12", "0.5", a string).
std::string optionValue(const models::ModelOption& option);

/// Refuses to resume from checkpoint `path` (its metadata `meta`) when the settings that made it
/// ("run.SETTING" keys) differ from `identity`, listing each difference; with `continueChanged`
/// it continues instead, printing the list when `announce`.
void checkRunIdentity(const std::map<std::string, std::string>& identity,
                      const std::map<std::string, std::string>& meta, const std::string& path, bool continueChanged,
                      bool announce);

/// The optimizer a spec names (adam, sgd, momentum, adagrad); throws naming an unknown one.
std::unique_ptr<optim::Optimizer> makeOptimizer(const models::OptimizerSpec& spec);

/// A number of bytes: digits, or a number with a unit: kB, MB, GB, TB (powers of 1000) or KiB,
/// MiB, GiB, TiB (powers of 1024); "0" is 0. Throws naming the text otherwise.
double parseByteSize(const std::string& text);

/// --memory-per-stage BYTES (parseByteSize's units) into `bytes`, for `weft train` and `weft graph`.
CLI::Option* addMemoryPerStageFlag(CLI::App& cmd, double& bytes);
/// --schedule-file FILE (a pipeline schedule as each stage's list of actions, dist::StepSchedule)
/// into `path`, for `weft train` and `weft graph`.
CLI::Option* addScheduleFileFlag(CLI::App& cmd, std::string& path);
/// --virtual-stages V (model stages per pipeline process) into `virtualStages`, for `weft train`
/// and `weft graph`.
CLI::Option* addVirtualStagesFlag(CLI::App& cmd, int& virtualStages);
/// The values --schedule takes.
inline const std::vector<std::string> kScheduleNames = {"gpipe", "1f1b", "zb", "interleaved", "zbv"};

/// `weft graph MODEL --stages S`: how the automatic cut would pipeline the model.
struct PipelineCutOptions {
  int stages = 0;
  int microbatches = 1;
  std::string schedule = "1f1b";
  std::string scheduleFile;  ///< "": the built-in `schedule`
  int virtualStages = 1;
  double linkGbps = 10;
  double memoryPerStage = 0;  ///< bytes; 0: no limit
  int threads = 2;
};
/// Profiles one micro-batch's training step of `model` (built in `graph`, trained by `trainStep`),
/// chooses the stages as `weft train --stages` does, and describes each stage and transfer.
std::string describePipelineCut(Graph& graph, models::ZooModel& model, Node* trainStep,
                                const PipelineCutOptions& options);

}  // namespace weft::tools
