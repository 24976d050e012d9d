// `weft train mlp`: trains the MLP classifier on the built-in Gaussian-mixture task.
#pragma once

#include <CLI/CLI.hpp>

namespace weft::tools {

/// Adds the "mlp" subcommand to `train`.
void addTrainMlp(CLI::App& train);

}  // namespace weft::tools
