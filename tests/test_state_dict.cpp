// PyTorch state dicts: keys and layouts by PyTorch's convention, checked element by element and
// against PyTorch's LSTM and GRUCell equations computed here; missing, unexpected and mis-shaped
// entries; files as Python's safetensors writes them; dtypes.
#include "tests/TestUtil.h"

#include "core/Checkpoint.h"
#include "nn/Layers.h"
#include "nn/StateDict.h"
#include "optim/Optimizer.h"

#include <cmath>
#include <cstring>
#include <map>

using namespace weft;
using weft::testing::randomTensor;

namespace {

using TensorMap = std::map<std::string, Tensor>;

const char* safetensorsName(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F64:
      return "F64";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
  }
  return "?";
}

/// The 8-byte little-endian length, then the header.
std::string withLength(const std::string& json) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return s + json;
}

/// A file as Python's safetensors writes it: {"format": "pt"} metadata, no checksums, the header
/// padded with spaces to a multiple of 8 bytes.
std::string pythonFile(const TensorMap& tensors) {
  std::string json = R"({"__metadata__":{"format":"pt"})", data;
  for (const auto& [key, t] : tensors) {
    std::string dims;
    for (int64_t d : t.shape().dims()) {
      if (!dims.empty()) dims += ',';
      dims += std::to_string(d);
    }
    json += fmt::format(R"(,"{}":{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})", key,
                        safetensorsName(t.dtype()), dims, data.size(), data.size() + t.bytes());
    data.append(static_cast<const char*>(t.raw()), t.bytes());
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  return withLength(json) + data;
}

std::string bytesOf(const std::vector<float>& values) {
  std::string s(values.size() * sizeof(float), '\0');
  std::memcpy(s.data(), values.data(), s.size());
  return s;
}

double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

/// sum_j w[row, j] v[j] for a row-major (rows, n) matrix w.
double rowDot(const std::vector<double>& w, int64_t row, const double* v, int64_t n) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += w[static_cast<size_t>(row * n + j)] * v[j];
  return s;
}

/// Every variable's value, by name.
std::map<std::string, std::vector<double>> values(Session& s) {
  std::map<std::string, std::vector<double>> out;
  for (Node* v : s.graph().variables()) out[v->name] = s.variable(v).toDoubles();
  return out;
}

}  // namespace

TEST_CASE("pytorchKey joins scopes with dots and renames roles, telling a GRUCell from an LSTM by its variables") {
  Graph g;
  auto outer = g.scope("net");
  nn::LSTM lstm(g, "rnn", 2, 3, f32, {.twoBiases = true});
  nn::GRUCell gru(g, "cell", 2, 3);
  nn::BatchNorm bn(g, "bn", 2);
  const std::map<std::string, std::string> expected{{"net/rnn/wx", "net.rnn.weight_ih_l0"},
                                                    {"net/rnn/wh", "net.rnn.weight_hh_l0"},
                                                    {"net/rnn/bias_ih", "net.rnn.bias_ih_l0"},
                                                    {"net/rnn/bias_hh", "net.rnn.bias_hh_l0"},
                                                    {"net/cell/wx", "net.cell.weight_ih"},
                                                    {"net/cell/wh", "net.cell.weight_hh"},
                                                    {"net/cell/bx", "net.cell.bias_ih"},
                                                    {"net/cell/bh", "net.cell.bias_hh"},
                                                    {"net/bn/gamma", "net.bn.weight"},
                                                    {"net/bn/beta", "net.bn.bias"},
                                                    {"net/bn/moving_mean", "net.bn.running_mean"},
                                                    {"net/bn/moving_var", "net.bn.running_var"},
                                                    {"a/b/custom", "a.b.custom"}};
  for (const auto& [name, key] : expected) CHECK(nn::pytorchKey(g, name) == key);
}

TEST_CASE("Linear, Embedding, Conv2d and BatchNorm take PyTorch's tensors, transposed or reshaped by role") {
  Graph g;
  auto outer = g.scope("encoder");
  nn::Embedding emb(g, "emb", 5, 3);
  nn::Conv2d conv(g, "conv", 2, 4, 3);
  nn::BatchNorm bn(g, "bn", 4);
  nn::Linear fc(g, "fc", 3, 2);
  nn::Linear square(g, "square", 2, 2);  // transposed too: its shape cannot tell
  const TensorMap file{{"encoder.emb.weight", randomTensor(f32, {5, 3}, 1)},
                       {"encoder.conv.weight", randomTensor(f32, {4, 2, 3, 3}, 2)},
                       {"encoder.conv.bias", randomTensor(f32, {4}, 3)},
                       {"encoder.bn.weight", randomTensor(f32, {4}, 4)},
                       {"encoder.bn.bias", randomTensor(f32, {4}, 5)},
                       {"encoder.bn.running_mean", randomTensor(f32, {4}, 6)},
                       {"encoder.bn.running_var", randomTensor(f32, {4}, 7, 0.5, 2)},
                       {"encoder.bn.num_batches_tracked", Tensor::full(i64, {}, 10)},
                       {"encoder.fc.weight", randomTensor(f32, {2, 3}, 8)},
                       {"encoder.fc.bias", randomTensor(f32, {2}, 9)},
                       {"encoder.square.weight", randomTensor(f32, {2, 2}, 10)},
                       {"encoder.square.bias", randomTensor(f32, {2}, 11)}};
  TempDir dir;
  Session s(g);
  const nn::StateDictReport r = nn::loadStateDict(s, dir.write("model.safetensors", pythonFile(file)));
  CHECK_MESSAGE(r.complete(), r.str());
  CHECK(r.loaded.size() == 11);
  CHECK(r.ignored == std::vector<std::string>{"encoder.bn.num_batches_tracked"});

  auto var = [&](const std::string& name) { return s.variable("encoder/" + name).toDoubles(); };
  auto key = [&](const std::string& k) { return file.at("encoder." + k).toDoubles(); };
  for (const auto& [layer, in, out] : {std::tuple{"fc", 3, 2}, std::tuple{"square", 2, 2}}) {
    const std::vector<double> w = var(std::string(layer) + "/weight"), t = key(std::string(layer) + ".weight");
    for (int i = 0; i < in; ++i)
      for (int o = 0; o < out; ++o) CHECK(w[static_cast<size_t>(i * out + o)] == t[static_cast<size_t>(o * in + i)]);
    CHECK(var(std::string(layer) + "/bias") == key(std::string(layer) + ".bias"));
  }
  CHECK(var("emb/table") == key("emb.weight"));
  CHECK(var("conv/filter") == key("conv.weight"));
  CHECK(s.variable("encoder/conv/bias").shape() == Shape{4, 1, 1});
  CHECK(var("conv/bias") == key("conv.bias"));
  CHECK(var("bn/gamma") == key("bn.weight"));
  CHECK(var("bn/beta") == key("bn.bias"));
  CHECK(var("bn/moving_mean") == key("bn.running_mean"));
  CHECK(var("bn/moving_var") == key("bn.running_var"));
}

TEST_CASE("optimizer slots and the global step are neither loaded nor missing") {
  Graph g;
  nn::Linear fc(g, "fc", 3, 2);
  nn::BatchNorm bn(g, "bn", 2);
  optim::Adam(0.1).minimize(sum(square(bn(fc(g.constant(randomTensor(f32, {4, 3}, 1))), true))));
  REQUIRE(g.find("global_step") != nullptr);
  const TensorMap file{
      {"fc.weight", randomTensor(f32, {2, 3}, 2)},    {"fc.bias", randomTensor(f32, {2}, 3)},
      {"bn.weight", randomTensor(f32, {2}, 4)},       {"bn.bias", randomTensor(f32, {2}, 5)},
      {"bn.running_mean", randomTensor(f32, {2}, 6)}, {"bn.running_var", randomTensor(f32, {2}, 7, 0.5, 2)}};
  TempDir dir;
  Session s(g);
  const nn::StateDictReport r = nn::loadStateDict(s, dir.write("model.safetensors", pythonFile(file)));
  CHECK_MESSAGE(r.complete(), r.str());
  CHECK(r.loaded ==
        std::vector<std::string>{"fc/weight", "fc/bias", "bn/gamma", "bn/beta", "bn/moving_mean", "bn/moving_var"});
  CHECK(g.variables().size() > r.loaded.size());
}

TEST_CASE("an LSTM with two biases loaded from PyTorch's weights computes PyTorch's LSTM") {
  const int64_t in = 3, hidden = 4, steps = 5, batch = 2, g4 = 4 * hidden;
  Graph g;
  nn::LSTM lstm(g, "lstm", in, hidden, f64, {.twoBiases = true});
  const Tensor x = randomTensor(f64, {steps, batch, in}, 20);
  const Output y = lstm(g.constant(x)).y;
  const TensorMap file{{"lstm.weight_ih_l0", randomTensor(f64, {g4, in}, 21)},
                       {"lstm.weight_hh_l0", randomTensor(f64, {g4, hidden}, 22)},
                       {"lstm.bias_ih_l0", randomTensor(f64, {g4}, 23)},
                       {"lstm.bias_hh_l0", randomTensor(f64, {g4}, 24)}};
  TempDir dir;
  Session s(g);
  nn::loadStateDict(s, dir.write("lstm.safetensors", pythonFile(file)));

  // PyTorch's equations: gates = W_ih x + b_ih + W_hh h + b_hh, split i, f, g, o.
  const std::vector<double> wih = file.at("lstm.weight_ih_l0").toDoubles(),
                            whh = file.at("lstm.weight_hh_l0").toDoubles();
  const std::vector<double> bih = file.at("lstm.bias_ih_l0").toDoubles(), bhh = file.at("lstm.bias_hh_l0").toDoubles();
  const std::vector<double> xs = x.toDoubles();
  std::vector<double> h(static_cast<size_t>(batch * hidden), 0), c = h, expected;
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<double> hNext = h;
    for (int64_t b = 0; b < batch; ++b) {
      auto gate = [&](int64_t k) {
        return rowDot(wih, k, &xs[static_cast<size_t>((t * batch + b) * in)], in) + bih[static_cast<size_t>(k)] +
               rowDot(whh, k, &h[static_cast<size_t>(b * hidden)], hidden) + bhh[static_cast<size_t>(k)];
      };
      for (int64_t u = 0; u < hidden; ++u) {
        const size_t at = static_cast<size_t>(b * hidden + u);
        const double i = sigmoid(gate(u)), f = sigmoid(gate(hidden + u)), gg = std::tanh(gate(2 * hidden + u)),
                     o = sigmoid(gate(3 * hidden + u));
        c[at] = f * c[at] + i * gg;
        hNext[at] = o * std::tanh(c[at]);
      }
    }
    h = hNext;
    expected.insert(expected.end(), h.begin(), h.end());
  }
  CHECK_CLOSE(s.run({y})[0], expected, 1e-12);
}

TEST_CASE("a GRUCell loaded from PyTorch's GRUCell weights computes PyTorch's GRUCell") {
  const int64_t in = 3, hidden = 4, batch = 2, g3 = 3 * hidden;
  Graph g;
  nn::GRUCell cell(g, "cell", in, hidden, f64);
  const Tensor x = randomTensor(f64, {batch, in}, 30), h0 = randomTensor(f64, {batch, hidden}, 31);
  const Output hNew = cell(g.constant(x), g.constant(h0));
  const TensorMap file{{"cell.weight_ih", randomTensor(f64, {g3, in}, 32)},
                       {"cell.weight_hh", randomTensor(f64, {g3, hidden}, 33)},
                       {"cell.bias_ih", randomTensor(f64, {g3}, 34)},
                       {"cell.bias_hh", randomTensor(f64, {g3}, 35)}};
  TempDir dir;
  Session s(g);
  nn::loadStateDict(s, dir.write("gru.safetensors", pythonFile(file)));

  // r = s(W_ir x + b_ir + W_hr h + b_hr); z likewise; n = tanh(W_in x + b_in + r (W_hn h + b_hn));
  // h' = (1 - z) n + z h.
  const std::vector<double> wih = file.at("cell.weight_ih").toDoubles(), whh = file.at("cell.weight_hh").toDoubles();
  const std::vector<double> bih = file.at("cell.bias_ih").toDoubles(), bhh = file.at("cell.bias_hh").toDoubles();
  const std::vector<double> xs = x.toDoubles(), h = h0.toDoubles();
  std::vector<double> expected;
  for (int64_t b = 0; b < batch; ++b) {
    const double* xb = &xs[static_cast<size_t>(b * in)];
    const double* hb = &h[static_cast<size_t>(b * hidden)];
    auto fromX = [&](int64_t k) { return rowDot(wih, k, xb, in) + bih[static_cast<size_t>(k)]; };
    auto fromH = [&](int64_t k) { return rowDot(whh, k, hb, hidden) + bhh[static_cast<size_t>(k)]; };
    for (int64_t u = 0; u < hidden; ++u) {
      const double r = sigmoid(fromX(u) + fromH(u)), z = sigmoid(fromX(hidden + u) + fromH(hidden + u));
      const double n = std::tanh(fromX(2 * hidden + u) + r * fromH(2 * hidden + u));
      expected.push_back((1 - z) * n + z * hb[u]);
    }
  }
  CHECK_CLOSE(s.run({hNew})[0], expected, 1e-12);
}

namespace {

/// Two Linears and a file that lacks fc.bias, holds fc.weight in weft's layout rather than
/// PyTorch's, and holds an entry no variable takes.
struct FlawedFile {
  Graph g;
  nn::Linear fc{g, "fc", 3, 2};
  nn::Linear out{g, "out", 2, 2};
  TensorMap tensors{{"fc.weight", randomTensor(f32, {3, 2}, 1)},
                    {"out.weight", randomTensor(f32, {2, 2}, 2)},
                    {"out.bias", randomTensor(f32, {2}, 3)},
                    {"extra.weight", randomTensor(f32, {2}, 4)}};
  TempDir dir;
  std::string path = dir.write("flawed.safetensors", pythonFile(tensors));
};

}  // namespace

TEST_CASE("missing, unexpected and mis-shaped entries are each reported by name") {
  FlawedFile f;
  Session s(f.g);
  const nn::StateDictReport r = nn::loadStateDict(s, f.path, {.strict = false});
  CHECK_FALSE(r.complete());
  CHECK(r.missing == std::vector<std::string>{"fc/bias"});
  CHECK(r.keys.at("fc/bias") == "fc.bias");
  CHECK(r.unexpected == std::vector<std::string>{"extra.weight"});
  REQUIRE(r.misshaped.size() == 1);
  CHECK(r.misshaped[0].variable == "fc/weight");
  CHECK(r.misshaped[0].key == "fc.weight");
  CHECK_MESSAGE(contains(r.misshaped[0].reason, "holds f32[3, 2]"), r.misshaped[0].reason);
  CHECK_MESSAGE(contains(r.misshaped[0].reason, "takes [2, 3] transposed"), r.misshaped[0].reason);
}

TEST_CASE("strict mode throws listing every problem with its file, key and variable, and changes no variable") {
  FlawedFile f;
  Session s(f.g);
  const auto before = values(s);
  const std::string e = errorOf([&] { nn::loadStateDict(s, f.path); });
  CHECK_MESSAGE(contains(e, f.path), e);
  CHECK_MESSAGE(contains(e, "missing: variable 'fc/bias' (key 'fc.bias')"), e);
  CHECK_MESSAGE(contains(e, "unexpected: key 'extra.weight'"), e);
  CHECK_MESSAGE(contains(e, "key 'fc.weight' for variable 'fc/weight': the file holds f32[3, 2]"), e);
  CHECK(values(s) == before);
}

TEST_CASE("non-strict mode loads what fits and leaves the rest as it was") {
  FlawedFile f;
  Session s(f.g);
  const auto before = values(s);
  const nn::StateDictReport r = nn::loadStateDict(s, f.path, {.strict = false});
  CHECK(r.loaded == std::vector<std::string>{"out/weight", "out/bias"});
  const auto after = values(s);
  CHECK(after.at("fc/weight") == before.at("fc/weight"));
  CHECK(after.at("fc/bias") == before.at("fc/bias"));
  const std::vector<double> t = f.tensors.at("out.weight").toDoubles();
  CHECK(after.at("out/weight") == std::vector<double>{t[0], t[2], t[1], t[3]});
  CHECK(after.at("out/bias") == f.tensors.at("out.bias").toDoubles());
}

TEST_CASE("a file as Python's safetensors writes it, header padded with spaces and no checksums, is read") {
  std::string meta;
  SUBCASE("with metadata") { meta = R"("__metadata__":{"format":"pt"},)"; }
  SUBCASE("without metadata") {}
  std::string json = "{" + meta +
                     R"("fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("fc.weight":{"dtype":"F32","shape":[2,1],"data_offsets":[8,16]}})";
  REQUIRE(json.size() % 8 != 0);  // so that the padding is there
  json.append(8 - json.size() % 8, ' ');
  TempDir dir;
  const std::string path =
      dir.write("python.safetensors", withLength(json) + bytesOf({1.5f, -2}) + bytesOf({0.25f, 3}));
  Graph g;
  nn::Linear fc(g, "fc", 1, 2);
  Session s(g);
  CHECK(nn::loadStateDict(s, path).complete());
  CHECK(s.variable("fc/bias").toDoubles() == std::vector<double>{1.5, -2});
  CHECK(s.variable("fc/weight").toDoubles() == std::vector<double>{0.25, 3});
}

TEST_CASE("a dtype weft lacks is refused, naming the file, the tensor and the dtype") {
  const std::string json = R"({"fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("fc.mask":{"dtype":"BOOL","shape":[8],"data_offsets":[8,16]}})";
  TempDir dir;
  const std::string path = dir.write("bool.safetensors", withLength(json) + bytesOf({1, 2}) + std::string(8, '\1'));
  Graph g;
  nn::Linear fc(g, "fc", 1, 2);
  Session s(g);
  const std::string e = errorOf([&] { nn::loadStateDict(s, path); });
  CHECK_MESSAGE(contains(e, path + ": tensor 'fc.mask' has dtype BOOL, which weft does not support"), e);
}

TEST_CASE("floating values of any width convert to the variable's dtype") {
  DType stored = f64;
  SUBCASE("F64") { stored = f64; }
  SUBCASE("F16") { stored = DType::F16; }
  SUBCASE("BF16") { stored = DType::BF16; }
  const TensorMap file{{"fc.weight", randomTensor(f64, {2, 1}, 1).cast(stored)},
                       {"fc.bias", randomTensor(f64, {2}, 2).cast(stored)}};
  TempDir dir;
  Graph g;
  nn::Linear fc(g, "fc", 1, 2);
  Session s(g);
  CHECK(nn::loadStateDict(s, dir.write("wide.safetensors", pythonFile(file))).complete());
  CHECK(s.variable("fc/weight").dtype() == f32);
  // Each value rounded to f32 (exact for the 16-bit types); (2, 1) transposed keeps the order.
  for (const char* name : {"weight", "bias"}) {
    std::vector<double> rounded;
    for (double v : file.at(std::string("fc.") + name).toDoubles()) rounded.push_back(static_cast<float>(v));
    CHECK(s.variable(std::string("fc/") + name).toDoubles() == rounded);
  }
}

TEST_CASE("integer values for a floating variable are a mismatch, named with both dtypes") {
  const TensorMap file{{"fc.weight", randomTensor(f32, {2, 1}, 1)}, {"fc.bias", Tensor::full(i64, {2}, 3)}};
  TempDir dir;
  Graph g;
  nn::Linear fc(g, "fc", 1, 2);
  Session s(g);
  const nn::StateDictReport r =
      nn::loadStateDict(s, dir.write("ints.safetensors", pythonFile(file)), {.strict = false});
  REQUIRE(r.misshaped.size() == 1);
  CHECK(r.misshaped[0].variable == "fc/bias");
  CHECK_MESSAGE(contains(r.misshaped[0].reason, "holds i64[2]; the variable is f32[2]"), r.misshaped[0].reason);
  CHECK(r.loaded == std::vector<std::string>{"fc/weight"});
}

TEST_CASE("a custom keyFor names the keys, and the variable's role still decides the layout") {
  Graph g;
  nn::Linear fc(g, "fc", 3, 2);
  nn::Embedding emb(g, "emb", 4, 2);
  const TensorMap file{{"model.dense.kernel", randomTensor(f32, {2, 3}, 1)},
                       {"model.fc.bias", randomTensor(f32, {2}, 2)},
                       {"model.emb.weight", randomTensor(f32, {4, 2}, 3)}};
  TempDir dir;
  Session s(g);
  nn::StateDictOptions options;
  options.keyFor = [&](const std::string& name) {
    return name == "fc/weight" ? std::string("model.dense.kernel") : "model." + nn::pytorchKey(g, name);
  };
  const nn::StateDictReport r = nn::loadStateDict(s, dir.write("custom.safetensors", pythonFile(file)), options);
  CHECK_MESSAGE(r.complete(), r.str());
  const std::vector<double> w = s.variable("fc/weight").toDoubles(), t = file.at("model.dense.kernel").toDoubles();
  for (int i = 0; i < 3; ++i)
    for (int o = 0; o < 2; ++o) CHECK(w[static_cast<size_t>(i * 2 + o)] == t[static_cast<size_t>(o * 3 + i)]);
  CHECK(s.variable("emb/table").toDoubles() == file.at("model.emb.weight").toDoubles());
}

TEST_CASE("two variables mapped to one key are an error naming both") {
  Graph g;
  nn::Linear a(g, "a", 2, 2), b(g, "b", 2, 2);
  TempDir dir;
  const std::string path = dir.write("one.safetensors", pythonFile({{"w", randomTensor(f32, {2, 2}, 1)}}));
  Session s(g);
  nn::StateDictOptions options;
  options.keyFor = [](const std::string& name) { return name.ends_with("weight") ? std::string("w") : name; };
  const std::string e = errorOf([&] { nn::loadStateDict(s, path, options); });
  CHECK_MESSAGE(contains(e, "variables 'a/weight' and 'b/weight' both map to key 'w'"), e);
}
