// The executor's side of GPU work: the stream a GPU's kernels are queued on, making a GPU the
// thread's current device, and the end of a step on a GPU, where the data errors its kernels
// recorded (they cannot throw) become messages. Without the CUDA backend these report that it
// is missing; a plan only calls them for nodes placed on a GPU.
#pragma once

#include "core/Device.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace weft {
struct Node;
}

namespace weft::detail {

/// The cudaStream_t that the executor queues GPU `device`'s kernels on, in plan order.
void* computeStream(const Device& device);
/// Makes GPU `gpu` the calling thread's current device (the CUDA runtime's is per thread).
void makeGpuCurrent(int gpu);
/// Holds GPU `gpu` for the calling thread's run: a GPU's stream, error record and library handles
/// are shared by every session that uses it, so runs from several threads (the AMP runtime's
/// workers) take turns. Without the CUDA backend no plan uses a GPU and this is never called.
std::unique_lock<std::mutex> holdGpu(int gpu);
/// Waits for GPU `gpu`'s work in this step and returns the data error a kernel recorded, as a
/// message naming the op (`describeStep` names plan step i), and clears the record; "" when none.
std::string finishGpuStep(int gpu, const std::function<std::string(int)>& describeStep);

/// The GPU's own times of the ops a plan launches, for the trace and for Session::profile: an
/// event on the compute stream before and after each op's launch, read once the step's GPU work
/// has finished.
class GpuTimeline {
 public:
  GpuTimeline();
  ~GpuTimeline();
  GpuTimeline(const GpuTimeline&) = delete;
  GpuTimeline& operator=(const GpuTimeline&) = delete;

  /// Marks the start of an op's work on GPU `gpu` (the thread's current GPU), before its launch.
  void begin(int gpu);
  /// Marks the end of the op begun last (node `node`), after its launch.
  void end(const Node* node, std::string name, std::string op, int64_t bytes);
  /// Takes each op marked since the last call: with `trace`, as a trace event on the track "gpu"
  /// lasting what it took on the GPU (events start where the first op of the step was launched
  /// on the host and keep the GPU's spacing from there); with `seconds`, adding what it took
  /// to its node's sum. Call once the step's GPU work has finished.
  void flush(bool trace, std::unordered_map<const Node*, double>* seconds);
  /// Drops the marks of a step that failed.
  void discard();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::detail
