// The record of a data error found by a CUDA kernel (an id out of range, say). Kernels cannot
// throw, so one error of a step is written here (in device memory; the thread that gets there
// first wins, so with several bad elements it names one of them, not necessarily the first) and
// the executor raises it, naming the op, once the step's work has finished. Plain data: device
// code includes this header.
#pragma once

#include <cstdint>

namespace weft::cuda {

struct KernelError {
  enum Kind : int32_t { IndexOutOfRange = 1, IntegerDivisionByZero = 2, LengthOutOfRange = 3 };
  int32_t kind;      // 0 until a kernel records an error
  int32_t step;      // the plan step that raised it
  int64_t value;     // the offending value
  int64_t position;  // its flat position in its tensor
  int64_t limit;     // IndexOutOfRange: the valid range is [0, limit); LengthOutOfRange: [0, limit]
};

}  // namespace weft::cuda
