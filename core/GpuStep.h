// The executor's side of GPU work: the stream a GPU's kernels are queued on, making a GPU the
// thread's current device, and the end of a step on a GPU, where the data errors its kernels
// recorded (they cannot throw) become messages. Without the CUDA backend these report that it
// is missing; a plan only calls them for nodes placed on a GPU.
#pragma once

#include "core/Device.h"

#include <functional>
#include <string>

namespace weft::detail {

/// The cudaStream_t that the executor queues GPU `device`'s kernels on, in plan order.
void* computeStream(const Device& device);
/// Makes GPU `gpu` the calling thread's current device (the CUDA runtime's is per thread).
void makeGpuCurrent(int gpu);
/// Waits for GPU `gpu`'s work in this step and returns the data error a kernel recorded, as a
/// message naming the op (`describeStep` names plan step i), and clears the record; "" when none.
std::string finishGpuStep(int gpu, const std::function<std::string(int)>& describeStep);

}  // namespace weft::detail
