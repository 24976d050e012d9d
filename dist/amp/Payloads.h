// Arithmetic on the host on the payloads of AMP messages (one instance's values, small): sums of
// gradients, scaling, and the concatenations, splits and row stacks of the IR's routing nodes;
// and on replicas' variables, which on a GPU are copied to the host for it.
#pragma once

#include "core/Tensor.h"

#include <cstdint>
#include <vector>

namespace weft::amp {

/// A copy of `t` on the host (a GPU's variables are summed and averaged there).
Tensor hostCopy(const Tensor& t);
/// sum += x on the host (either may be a GPU's: the sum becomes a host tensor); an undefined sum
/// becomes a copy of x, an undefined x (a zero gradient) adds nothing.
void addInto(Tensor& sum, const Tensor& x);
/// x * factor, on the host.
Tensor scaled(const Tensor& x, double factor);
/// The size of the last dimension (1 for a scalar).
int64_t lastWidth(const Tensor& t);
/// Concatenation along the last dimension, and its inverse.
Tensor concatLast(const std::vector<Tensor>& parts);
std::vector<Tensor> splitLast(const Tensor& x, const std::vector<int64_t>& widths);
/// Rows of equal shape stacked along a new first dimension, and one row of such a stack.
Tensor stackRows(const std::vector<Tensor>& rows);
Tensor row(const Tensor& x, int64_t i);
/// Gradients of payloads no gradient reaches (an id) travel as empty tensors: zero.
std::vector<Tensor> rowsOrEmpty(const Tensor& grad, int64_t n);
/// stackRows with undefined rows as zeros; undefined when every row is.
Tensor stackOrEmpty(std::vector<Tensor>& rows);

}  // namespace weft::amp
