// Loading PyTorch state dicts into a graph's variables by name, from the safetensors files that
// `safetensors.torch.save_file(model.state_dict(), path)` writes.
//
// Which variables: the trainable ones, plus the non-trainable ones named "moving_mean" or
// "moving_var" (BatchNorm's statistics). The graph cannot tell a model's other non-trainable
// variables from bookkeeping, so optimizer slots, the global step, loss scales and moving-average
// shadows are never loaded.
//
// The default key (pytorchKey) joins the scopes with "." and renames the variable's last name
// (its role in its layer); the role alone decides the layout, never the shapes:
//
//   layer      weft variable (shape)          PyTorch key (shape)       layout
//   Linear     weight (in, out)               weight (out, in)          transposed
//              bias (out)                     bias (out)
//   Embedding  table (vocab, dim)             weight (vocab, dim)
//   Conv2d     filter (out, in, kh, kw)       weight (out, in, kh, kw)
//              bias (out, 1, 1)               bias (out)                reshaped
//   BatchNorm  gamma, beta (C)                weight, bias (C)
//              moving_mean, moving_var (C)    running_mean, running_var (C)
//              -                              num_batches_tracked       ignored
//   LSTM       wx (in, 4H), wh (H, 4H)        weight_ih_l0 (4H, in), weight_hh_l0 (4H, H)  transposed
//   (twoBiases) bias_ih, bias_hh (4H)         bias_ih_l0, bias_hh_l0 (4H)
//   GRUCell    wx (in, 3H), wh (H, 3H)        weight_ih (3H, in), weight_hh (3H, H)        transposed
//              bx, bh (3H)                    bias_ih, bias_hh (3H)
//
// Gate orders match PyTorch's (LSTM i, f, g, o; GRU r, z, n with bh's n part inside r's product),
// so no rows move. A GRUCell is told from an LSTM by its "bx" variable; an LSTM without twoBiases
// has no PyTorch counterpart for its one "bias" (reported missing). Any variable whose role is
// "weight", "wx" or "wh" is loaded transposed, and any "bias" of shape (n, 1, ..., 1) from a vector,
// whatever made it; other roles keep their name and layout. Floating values convert to the variable's dtype
// (F64, F16, BF16 into f32 and so on); integers into a floating variable, or the reverse, do not.
//
//     // Python: safetensors.torch.save_file(net.state_dict(), "net.safetensors"), where
//     // net.fc = torch.nn.Linear(784, 10)
//     nn::Linear fc(g, "fc", 784, 10);
//     Session s(g);
//     nn::loadStateDict(s, "net.safetensors");  // fc/weight <- fc.weight transposed, fc/bias <- fc.bias
#pragma once

#include "core/Session.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace weft::nn {

struct StateDictOptions {
  /// The state dict's key for a weft variable name; unset: pytorchKey. The layout still follows
  /// the variable's role.
  std::function<std::string(const std::string&)> keyFor = nullptr;
  /// Throw, changing no variable, when anything is missing, unexpected or mis-shaped.
  bool strict = true;
};

/// A variable whose key the file holds in a shape or dtype the variable cannot take.
struct Mismatch {
  std::string variable, key;
  std::string reason;  ///< both shapes and dtypes, and the layout the role asks for
};

/// What a load did; variables by weft name, the file's entries by key.
struct StateDictReport {
  std::string path;
  std::map<std::string, std::string> keys;  ///< each variable considered -> its key
  std::vector<std::string> loaded;          ///< variables given the file's values
  std::vector<std::string> missing;         ///< variables whose key the file lacks
  std::vector<std::string> unexpected;      ///< keys no variable takes
  std::vector<std::string> ignored;         ///< PyTorch's bookkeeping (num_batches_tracked)
  std::vector<Mismatch> misshaped;          ///< not loaded

  /// Nothing missing, unexpected or mis-shaped.
  bool complete() const { return missing.empty() && unexpected.empty() && misshaped.empty(); }
  /// One line per problem (keys named), after a count of what was loaded.
  std::string str() const;
};

/// The PyTorch key of variable `name` of `graph` by the convention above ("enc/fc/weight" ->
/// "enc.fc.weight"); a custom keyFor can build on it.
std::string pytorchKey(const Graph& graph, const std::string& name);

/// Loads the safetensors file at `path` into the session's variables (see above). Strict: throws,
/// naming the file and every missing, unexpected or mis-shaped entry, before any variable changes;
/// otherwise loads what fits and reports the rest. Two variables mapped to one key are an error.
StateDictReport loadStateDict(Session& session, const std::string& path, const StateDictOptions& options = {});

}  // namespace weft::nn
