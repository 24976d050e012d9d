// Per-channel formulas of batch normalisation shared by the CPU kernels (ops/Norm.cpp) and the
// CUDA kernels (ops/cuda/Norm.cu), in double.
#pragma once

#include "core/HostDevice.h"

namespace weft::norm {

/// The coefficients of dx = a dy + b (x - mean) + c for one channel of m elements, from the
/// batch's sum(dy) and sum(dy xhat) and the gradients of the statistics outputs.
WEFT_HOST_DEVICE inline void gradCoefficients(double gamma, double invstd, double m, double sumDy, double sumDyXhat,
                                              double dmean, double dvar, double& a, double& b, double& c) {
  a = gamma * invstd;
  b = m > 0 ? (2.0 * dvar - a * invstd * sumDyXhat) / m : 0.0;
  c = m > 0 ? (dmean - a * sumDy) / m : 0.0;
}

}  // namespace weft::norm
