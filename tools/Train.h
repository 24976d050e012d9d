// `weft train MODEL`: the model-zoo trainer. One subcommand per zoo model, with the common flags
// (steps, batch, optimizer, threads, seed, data, output, evaluation, checkpoints, resume, bench)
// and the model's own options.
#pragma once

#include <CLI/CLI.hpp>

namespace weft::tools {

/// Adds one subcommand per zoo model to `train`.
void addTrainCommands(CLI::App& train);

}  // namespace weft::tools
