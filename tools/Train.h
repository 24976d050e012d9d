// `weft train MODEL`: the model-zoo trainer. One subcommand per zoo model, with the common flags
// (steps, batch, optimizer, threads, seed, data, output, evaluation, checkpoints, resume, bench)
// and the model's own options.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace weft::tools {

/// Adds one subcommand per zoo model to `train`. `commandLine` (this process's executable and
/// arguments) is what a distributed run starts as each of its worker and server processes. A
/// training run sets `status` to the process's exit status (a parameter server's own).
void addTrainCommands(CLI::App& train, const std::vector<std::string>& commandLine, int& status);

}  // namespace weft::tools
