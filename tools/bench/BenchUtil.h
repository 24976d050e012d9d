// Shared by the weft and LibTorch benchmark binaries: timing a step function and printing one
// JSON line per result.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace bench {

struct Timing {
  double median, p10, p90;  // seconds per call
};

/// Calls `step` `warmup` times and for at least kWarmupSeconds, then `reps` times, timing each
/// call. The time floor matters for short steps: a new thread team's threads start on the core
/// of the thread that made them, and the kernel takes some milliseconds to spread them over the
/// cores (a 256 GEMM measured at half speed in most processes with 3 warm-up calls).
inline constexpr double kWarmupSeconds = 0.2;
template <class F>
Timing time(F&& step, int warmup, int reps) {
  const auto warmupEnd = std::chrono::steady_clock::now() + std::chrono::duration<double>(kWarmupSeconds);
  for (int i = 0; i < warmup || std::chrono::steady_clock::now() < warmupEnd; ++i) step();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  auto at = [&](double q) { return t[static_cast<size_t>(q * static_cast<double>(t.size() - 1))]; };
  return {at(0.5), at(0.1), at(0.9)};
}

/// {"bench": name, "impl": impl, "median_ms": ..., "p10_ms": ..., "p90_ms": ..., <metric>: value}
inline void report(const std::string& name, const std::string& impl, const Timing& t, const std::string& metric,
                   double value) {
  std::printf(
      "{\"bench\": \"%s\", \"impl\": \"%s\", \"median_ms\": %.4f, \"p10_ms\": %.4f, \"p90_ms\": %.4f, \"%s\": %.4g}\n",
      name.c_str(), impl.c_str(), t.median * 1e3, t.p10 * 1e3, t.p90 * 1e3, metric.c_str(), value);
  std::fflush(stdout);
}

/// The shapes both implementations run.
struct MlpShape {
  const char* name;
  int64_t batch, inputs, hidden, layers, classes;
};
inline const MlpShape kMlps[] = {{"mlp_small", 128, 32, 256, 2, 10}, {"mlp_large", 256, 784, 1024, 2, 10}};

struct LmShape {
  const char* name;
  int64_t vocab, embed, hidden, steps, batch;
};
inline const LmShape kLms[] = {{"lstm_lm", 10000, 256, 256, 20, 32}};

/// A 3x3, stride 1, padding 1 convolution with as many filters as input channels: the three
/// stages of ResNet-20 at batch 64.
struct ConvShape {
  const char* name;
  int64_t batch, channels, size;
  double flops() const {  // forward, input gradient and filter gradient: 3 products of 2 flops
    return 3.0 * 2.0 * static_cast<double>(batch * channels * channels * 9 * size * size);
  }
};
inline const ConvShape kConvs[] = {
    {"conv3x3_16x32", 64, 16, 32}, {"conv3x3_32x16", 64, 32, 16}, {"conv3x3_64x8", 64, 64, 8}};

inline const int64_t kGemmSizes[] = {256, 512, 1024};
/// Elementwise sizes: 1M floats (12 MB moved per add, within the last-level cache, like the model
/// zoo's tensors) and 16M (192 MB, main memory).
inline const std::pair<const char*, int64_t> kElementwiseSizes[] = {{"add_1M", 1 << 20}, {"add_16M", 1 << 24}};
inline constexpr int kOverheadChain = 1000;

}  // namespace bench
