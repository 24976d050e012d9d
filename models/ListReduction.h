// The AMPNet list-reduction benchmark model: embedding -> LSTM over the padded token sequence ->
// the state at each list's last real position -> linear -> the answer class (0..9).
#pragma once

#include "models/ZooModel.h"
#include "nn/Layers.h"

#include <memory>

namespace weft::models {

struct ListReductionConfig {
  int64_t embedding = 32;
  int64_t hidden = 128;
  uint64_t seed = 1;
  DType dtype = f32;
  Recompute recompute = Recompute::None;  // the lookup and the LSTM one recompute segment of this mode
};

struct ListReductionGraph {
  // placeholders named like the batch fields of data::collate with padded {"tokens"}
  Output tokens;  // (B, T) i64: the reduction token, then the digits, then padding
  Output mask;    // "tokens_mask" (B, T) f32: 1 on real positions
  Output labels;  // (B) i64
  Output logits;  // (B, 10)
  Output loss;    // mean cross-entropy
  Output accuracy;
};

ListReductionGraph buildListReduction(Graph& g, const ListReductionConfig& config);

/// Each sequence's state at its last real position: y (T, B, H), mask (B, T) with 1 on a prefix
/// of each row -> (B, H).
Output lastStates(Output y, Output mask);

/// The zoo's "list_reduction", on generated lists (data/ListReduction.h).
std::unique_ptr<ZooModel> makeListReductionModel();

}  // namespace weft::models
