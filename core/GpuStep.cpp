// The executor's GPU helpers (see the header).
#include "core/GpuStep.h"

#include "core/Error.h"
#ifdef WEFT_HAVE_CUDA
#include "core/cuda/Runtime.h"
#endif

#include <fmt/format.h>

namespace weft::detail {

#ifdef WEFT_HAVE_CUDA

void* computeStream(const Device& device) { return cuda::device(device.index).compute; }

void makeGpuCurrent(int gpu) { cuda::setCurrent(gpu); }

std::string finishGpuStep(int gpu, const std::function<std::string(int)>& describeStep) {
  cuda::DeviceState& d = cuda::device(gpu);
  cuda::setCurrent(gpu);
  WEFT_CUDA_CHECK(cudaMemcpyAsync(d.hostError, d.deviceError, sizeof(cuda::KernelError), cudaMemcpyDeviceToHost, d.compute));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(d.compute));
  const cuda::KernelError e = *d.hostError;
  if (!e.kind) return {};
  WEFT_CUDA_CHECK(cudaMemsetAsync(d.deviceError, 0, sizeof(cuda::KernelError), d.compute));
  const std::string op = e.step >= 0 ? describeStep(e.step) : fmt::format("a kernel on cuda:{}", gpu);
  if (e.kind == cuda::KernelError::IntegerDivisionByZero) {
    return fmt::format("{}: integer division by zero (divisor element {})", op, e.position);
  }
  if (e.kind == cuda::KernelError::LengthOutOfRange) {
    return fmt::format("{}: length {} of sequence {} is outside [0, {}]", op, e.value, e.position, e.limit);
  }
  return fmt::format("{}: id {} at position {} is outside [0, {})", op, e.value, e.position, e.limit);
}

#else

void* computeStream(const Device& device) {
  WEFT_THROW("device {} is not available: {}", device.str(), cudaUnavailableReason());
}

void makeGpuCurrent(int gpu) { WEFT_THROW("device cuda:{} is not available: {}", gpu, cudaUnavailableReason()); }

std::string finishGpuStep(int, const std::function<std::string(int)>&) { return {}; }

#endif

}  // namespace weft::detail
