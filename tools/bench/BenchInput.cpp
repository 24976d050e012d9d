// The input cost of one data-parallel worker of N, for the zoo's LM and ResNet training streams
// on their built-in data: holding the whole dataset and cutting the worker's part from each
// whole batch (how workers read before they read parts), against generating only the worker's
// part of each batch (Batcher::readPart over a generated dataset). One JSON line per
// (model, workers, way): setup seconds, bytes of data held, seconds to order an epoch (paid at
// its first batch), and input milliseconds per step after it.
//
//     bench_input [--steps 200] [--lm-sentences 400000] [--resnet-images 40000]
#include "data/Dataset.h"
#include "data/Images.h"
#include "data/SyntheticLanguage.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace weft;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// The bytes of a held dataset's tensors.
double heldBytes(const data::Dataset& d) {
  double bytes = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    for (const auto& [field, t] : d[i]) bytes += static_cast<double>(t.bytes());
  }
  return bytes;
}

struct Stream {
  std::string model;
  data::Dataset generated;
  data::BatchOptions options;
  std::vector<std::string> shared;  // fields every part keeps whole
};

struct Cost {
  double epochSeconds;   // the first batch, which orders the epoch
  double perStepMs;      // each batch after it
};

/// The cost of `steps` batches from `batcher`, each passed through `cut`.
template <class Cut>
Cost inputCost(data::Batcher& batcher, int64_t steps, Cut cut) {
  const double start = now();
  cut(batcher.next());
  const double ordered = now();
  for (int64_t s = 1; s < steps; ++s) cut(batcher.next());
  return {ordered - start, (now() - ordered) * 1e3 / static_cast<double>(steps - 1)};
}

void report(const std::string& model, int64_t workers, const char* way, double setup, double held, const Cost& cost) {
  std::printf(
      "{\"model\": \"%s\", \"workers\": %lld, \"way\": \"%s\", \"setup_s\": %.3f, \"held_mb\": %.1f, "
      "\"epoch_order_s\": %.3f, \"input_ms_per_step\": %.3f}\n",
      model.c_str(), static_cast<long long>(workers), way, setup, held / 1e6, cost.epochSeconds, cost.perStepMs);
  std::fflush(stdout);
}

void measure(const Stream& stream, int64_t steps) {
  // Before: every worker held the whole dataset and cut its part from each whole batch.
  const double start = now();
  const data::Dataset held = stream.generated.held();
  const double setup = now() - start, bytes = heldBytes(held);
  for (const int64_t workers : {1, 2, 4, 8}) {
    data::Batcher whole(held, stream.options);
    const Cost cost = inputCost(whole, steps, [&](const data::Batch& b) {
      return workers > 1 ? data::sliceBatch(b, 0, workers, stream.shared) : b;
    });
    report(stream.model, workers, "whole batch, part cut", setup, bytes, cost);
  }
  // After: a worker generates only the examples of its part.
  for (const int64_t workers : {1, 2, 4, 8}) {
    data::Batcher part(stream.generated, stream.options);
    part.readPart(0, workers);
    report(stream.model, workers, "part read", 0, 0, inputCost(part, steps, [](const data::Batch& b) { return b; }));
  }
}

int64_t flag(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = std::max<int64_t>(2, flag(argc, argv, "--steps", 200));
  // The zoo's defaults (models/Lm.h, models/ResNet.h) and their batching.
  Stream lm{"lm", data::lmDataset(std::make_shared<const data::SyntheticLanguage>(data::LanguageSpec{}),
                                  static_cast<uint64_t>(flag(argc, argv, "--lm-sentences", 400000))),
            {}, {"targets_count"}};
  lm.options.batchSize = 64;
  lm.options.padded = {"tokens", "targets"};
  lm.options.counted = {"targets"};
  lm.options.bucketWindow = 32;
  Stream resnet{"resnet", data::syntheticImages({}, flag(argc, argv, "--resnet-images", 40000), 102), {}, {}};
  resnet.options.batchSize = 128;
  resnet.options.keepGenerated = true;
  for (const Stream& s : {lm, resnet}) measure(s, steps);
  return 0;
}
