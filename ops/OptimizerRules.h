// The per-element update rules of the optimizer ops, shared by their CPU kernels
// (ops/Optimizers.cpp) and CUDA kernels (ops/cuda/Optimizers.cu). Arithmetic is in double
// whatever the variable's dtype, so both devices round alike.
#pragma once

#include "core/HostDevice.h"

#include <cmath>

namespace weft::rules {

struct Hyper {
  double lr, wd, momentum, beta1, beta2, epsilon, biasCorrection1, biasCorrection2;
  bool nesterov, decoupled;
};

enum class Rule { SGD, Momentum, Adam, Adagrad };

constexpr int slotCount(Rule r) { return r == Rule::SGD ? 0 : r == Rule::Adam ? 2 : 1; }

// w -= lr (g + wd w)
template <class T>
WEFT_HOST_DEVICE void sgd(const Hyper& h, T& w, T&, T&, T g) {
  w -= static_cast<T>(h.lr * (g + h.wd * w));
}

// accum = momentum * accum + g;  w -= lr * (nesterov ? g + momentum * accum : accum)
template <class T>
WEFT_HOST_DEVICE void momentum(const Hyper& h, T& w, T& accum, T&, T g) {
  const double gi = g + h.wd * w;
  accum = static_cast<T>(h.momentum * accum + gi);
  const double step = h.nesterov ? gi + h.momentum * accum : accum;
  w -= static_cast<T>(h.lr * step);
}

// m, v: biased moment estimates; w -= lr * m^ / (sqrt(v^) + eps)
template <class T>
WEFT_HOST_DEVICE void adam(const Hyper& h, T& w, T& m, T& v, T g) {
  const double gi = g + (h.decoupled ? 0.0 : h.wd * w);
  m = static_cast<T>(h.beta1 * m + (1 - h.beta1) * gi);
  v = static_cast<T>(h.beta2 * v + (1 - h.beta2) * gi * gi);
  // By the bias corrections' reciprocals, which a loop computes once: three divisions an element
  // kept the CPU's update waiting on its divider.
  const double mhat = m * (1 / h.biasCorrection1), vhat = v * (1 / h.biasCorrection2);
  w -= static_cast<T>(h.lr * (mhat / (::sqrt(vhat) + h.epsilon) + (h.decoupled ? h.wd * w : 0.0)));
}

// accum += g^2;  w -= lr * g / (sqrt(accum) + eps)
template <class T>
WEFT_HOST_DEVICE void adagrad(const Hyper& h, T& w, T& accum, T&, T g) {
  const double gi = g + h.wd * w;
  accum = static_cast<T>(accum + gi * gi);
  w -= static_cast<T>(h.lr * gi / (::sqrt(static_cast<double>(accum)) + h.epsilon));
}

/// Applies rule R to one element (slots the rule does not use are ignored).
template <Rule R, class T>
WEFT_HOST_DEVICE void apply(const Hyper& h, T& w, T& s1, T& s2, T g) {
  if constexpr (R == Rule::SGD) sgd(h, w, s1, s2, g);
  else if constexpr (R == Rule::Momentum) momentum(h, w, s1, s2, g);
  else if constexpr (R == Rule::Adam) adam(h, w, s1, s2, g);
  else adagrad(h, w, s1, s2, g);
}

}  // namespace weft::rules
