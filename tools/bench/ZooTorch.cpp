// The LibTorch peers of the model zoo's training-step benchmark (`weft train MODEL --bench N`):
// the same architectures, sizes, initial-value scales and optimizers, in LibTorch eager mode at
// the same thread count, timed in the steady state as weft is (warm-up steps on the peer's one
// batch shape, at least 5 and 200 ms, then N timed steps; weft runs its N batches untimed, at
// least once and for 200 ms, then times them again; median, p10, p90, and throughput = items of
// the timed steps / their total time).
//
//     bench_zoo_torch MODEL STEPS [THREADS] [--hidden H] [--hidden-width H] [--batch B] [--width W]
//                     [--precision bf16]
//         MODEL: mlp lm nmt resnet gnn list_reduction
//         --hidden: the recurrent or node state width of lm, nmt, gnn, list_reduction (weft's
//         --hidden); --hidden-width: the MLP's hidden layers' width (weft's flag of that name);
//         --batch: the MLP's examples, ResNet's images, the GGSNN's graphs or list reduction's
//         lists per step; --width: ResNet's first-stage channels (weft's --batch and --width). --precision bf16: the
//         forward pass under CPU autocast to bf16 (as `with torch.autocast("cpu", torch.bfloat16)` in Python; the
//         backward pass follows the dtypes it recorded), against weft's --precision bf16. The sequence models keep
//         their batch: its padded widths below were measured at weft's default batch.
//
// prints {"model": ..., "impl": "libtorch", "steps": N, "threads": T, "median_ms": ...,
// "p10_ms": ..., "p90_ms": ..., "<unit>_per_s": ...} on stdout; on stderr the parameter counts,
// the batch shapes and the loss of the first 5 warm-up steps and of the last timed step (the peers
// train on one fixed random batch, so the loss falls from step to step).
//
// Batches. Each peer runs one random batch with the shape of weft's default batches. weft's
// variable-length batches are padded to their longest member, so a peer's sequence length is the
// mean PADDED width of weft's training batches (what weft computes over, measured over 300
// batches of each model's default data stream), rounded; throughput counts the items weft's
// itemsIn() counts (real words, not padding), per batch their measured mean, scaled by
// (rounded width / mean width) so that rounding does not change the work per item.
//
//   model           weft's default batch (mean of 300)            peer's batch          items credited per batch
//   mlp             128 examples of 32 features                    the same              examples 128
//   lm              64 sentences, padded width 21.50, 1302.8 words 64 x 22, 1024 cand.   words 1302.8 x 22 / 21.50
//   nmt             64 pairs, source and target width 10.09, 632.9 64 x 10 (both)        words 632.9 x 10 / 10.09
//                   target words
//   resnet          128 images 3 x 32 x 32                         the same              images 128
//   gnn             32 graphs: 311.5 nodes, 474.4 edges            312 nodes, 474 edges  nodes 312
//                   (--batch B: 312 B / 32 nodes and 474 B / 32 edges, rounded)
//   list_reduction  64 lists, padded width 11.00                   64 x 11               lists 64
//                   (--batch B >= 64: B x 11, lists B)
//
// Parameters (trainable, weft's count = the peer's): mlp 76,810; lm 19,645,780 (19,251,540 with sparse
// gradients: embedding, softmax weight and bias); nmt 2,473,428 (513,024 sparse: the two
// embeddings); resnet 272,474; gnn 11,683; list_reduction 84,234 (512 sparse: the embedding).
//
// Token ids: the LM's tokens, targets and candidates are drawn from the log-uniform distribution
// weft's sampler uses (frequent words first, so the sparse updates touch a realistic number of
// distinct rows); the other models' ids are uniform.
//
// Models and optimizers (weft's defaults; see models/*.cpp):
//   mlp     Linear(32 -> 256) -> ReLU -> Linear(256 -> 256) -> ReLU -> Linear(256 -> 10), softmax
//           cross-entropy; Adam 1e-3.
//   lm      embedding (50004 x 128) -> LSTM 128 -> 256 -> sampled softmax over 50004 words with 1024
//           shared log-uniform candidates, logQ correction and accidental-hit removal; Adam 2e-3,
//           clip 1.0. The embedding, the softmax weight and the softmax bias are read only through
//           gathers, so their gradients are sparse (torch::embedding(..., sparse=true)) and they are
//           updated by lazy Adam (touched rows only) by hand, LibTorch's C++ API having no
//           SparseAdam; the global norm includes them (duplicates summed first, as weft does).
//   nmt     source and target embeddings (2004 x 128, sparse) -> bidirectional LSTM encoder (256
//           each way, states summed) -> decoder LSTM 256 started from tanh(Linear(backward final))
//           and Linear(backward final) -> Luong dot attention -> tanh(Linear(512 -> 256, no bias))
//           -> Linear(256 -> 2004); Adam 2e-3, clip 5.
//   resnet  ResNet-20 (CIFAR layout, widths 16/32/64, bias-free 3x3 convs + batch norm, 1x1
//           strided projection shortcuts where the shape changes) -> Linear(64 -> 10); momentum
//           SGD 0.05, momentum 0.9, weight decay 5e-4 on every parameter (weft's rule: PyTorch's).
//   gnn     GGSNN: hidden 32, 3 edge types, 5 propagation steps of a typed linear message
//           (Linear 32 -> 3 x 32, the edge type selecting the block), scatter-add per destination
//           and a GRU cell; readout tanh(Linear(64 -> 32)) on [final state, padded features] ->
//           Linear(32 -> 3); Adam 3e-3, clip 5.
//   list_reduction  embedding (16 x 32, sparse) -> LSTM 32 -> 128 -> each list's state at its
//           last real position -> Linear(128 -> 10); Adam 3e-3, clip 5.
//
// weft's LSTM has one bias vector (4H), LibTorch's LSTM two; the peers call at::lstm with the
// trained bias as b_ih and a constant zero b_hh, so the trained parameters match weft's exactly.
#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <optional>
#include <vector>

namespace {

using torch::Tensor;

constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEpsilon = 1e-8;

// ---- initialisers (weft's scales) --------------------------------------------------------------

Tensor param(Tensor t) { return t.set_requires_grad(true); }
Tensor uniform(std::vector<int64_t> shape, double limit) { return param(torch::rand(shape) * (2 * limit) - limit); }
Tensor normal(std::vector<int64_t> shape, double stddev) { return param(torch::randn(shape) * stddev); }
/// A (out, in) Linear weight, Glorot-uniform (weft stores it as (in, out)).
Tensor glorot(int64_t out, int64_t in) { return uniform({out, in}, std::sqrt(6.0 / static_cast<double>(in + out))); }
Tensor zeros(std::vector<int64_t> shape) { return param(torch::zeros(shape)); }

// ---- the update rules: weft's Adam (dense, and lazy for sparse gradients) and momentum SGD ----

/// Dense parameters, updated by a LibTorch optimizer, and parameters read only through
/// torch::embedding(sparse=true), updated by lazy Adam by hand; optional global-norm clipping.
class Updater {
 public:
  struct Spec {
    std::string name;  // adam or momentum
    double lr = 1e-3, momentum = 0.9, weightDecay = 0, clip = 0;
  };

  Updater(std::vector<Tensor> dense, std::vector<Tensor> sparse, Spec spec)
      : dense_(std::move(dense)), sparse_(std::move(sparse)), spec_(std::move(spec)) {
    if (spec_.name == "adam") {
      optimizer_ = std::make_unique<torch::optim::Adam>(
          dense_,
          torch::optim::AdamOptions(spec_.lr).betas({kBeta1, kBeta2}).eps(kEpsilon).weight_decay(spec_.weightDecay));
    } else {
      optimizer_ = std::make_unique<torch::optim::SGD>(
          dense_, torch::optim::SGDOptions(spec_.lr).momentum(spec_.momentum).weight_decay(spec_.weightDecay));
    }
    for (const Tensor& p : sparse_) {
      TORCH_CHECK(spec_.name == "adam" && spec_.weightDecay == 0, "sparse parameters: Adam without weight decay only");
      m_.push_back(torch::zeros_like(p));
      v_.push_back(torch::zeros_like(p));
    }
  }

  void zeroGrad() {
    for (auto* list : {&dense_, &sparse_}) {
      for (Tensor& p : *list) p.mutable_grad() = Tensor();
    }
  }

  /// Clips (when the spec says so) and applies the gradients of the last backward().
  void step() {
    torch::NoGradGuard noGrad;
    ++step_;
    // Duplicate rows summed first, as weft's sparse norm and sparse Adam do.
    for (Tensor& p : sparse_) p.mutable_grad() = p.grad().coalesce();
    if (spec_.clip > 0) {
      std::vector<Tensor> squares;
      for (const Tensor& p : dense_) {
        if (p.grad().defined()) squares.push_back(p.grad().square().sum());
      }
      for (const Tensor& p : sparse_) squares.push_back(p.grad()._values().square().sum());
      const double norm = torch::stack(squares).sum().sqrt().item<double>();
      const double scale = spec_.clip / std::max(norm, spec_.clip);
      for (Tensor& p : dense_) {
        if (p.grad().defined()) p.mutable_grad().mul_(scale);
      }
      for (Tensor& p : sparse_) p.mutable_grad()._values().mul_(scale);
    }
    optimizer_->step();
    const double c1 = 1 - std::pow(kBeta1, static_cast<double>(step_));
    const double c2 = 1 - std::pow(kBeta2, static_cast<double>(step_));
    for (size_t i = 0; i < sparse_.size(); ++i) {
      const Tensor& grad = sparse_[i].grad();
      const Tensor rows = grad._indices()[0];
      const Tensor g = grad._values();
      Tensor mr = m_[i].index_select(0, rows).mul_(kBeta1).add_(g, 1 - kBeta1);
      Tensor vr = v_[i].index_select(0, rows).mul_(kBeta2).addcmul_(g, g, 1 - kBeta2);
      m_[i].index_copy_(0, rows, mr);
      v_[i].index_copy_(0, rows, vr);
      const Tensor update = (mr / c1) / ((vr / c2).sqrt() + kEpsilon) * spec_.lr;
      sparse_[i].index_add_(0, rows, -update);
    }
  }

  int64_t denseCount() const { return count(dense_); }
  int64_t sparseCount() const { return count(sparse_); }

 private:
  static int64_t count(const std::vector<Tensor>& ps) {
    int64_t n = 0;
    for (const Tensor& p : ps) n += p.numel();
    return n;
  }

  std::vector<Tensor> dense_, sparse_;
  Spec spec_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<Tensor> m_, v_;
  int64_t step_ = 0;
};

// ---- layers with weft's parameters ---------------------------------------------------------------

/// weft's nn::LSTM: wx (I, 4H), wh (H, 4H), one bias (4H) with the forget gate's at 1; gate order
/// i, f, g, o (LibTorch's too). Runs LibTorch's LSTM over x (T, B, I).
struct Lstm {
  Tensor wih, whh, bias, zeroBias;
  int64_t hidden;

  Lstm(int64_t in, int64_t h) : hidden(h) {
    const double limit = 1.0 / std::sqrt(static_cast<double>(h));
    wih = uniform({4 * h, in}, limit);
    whh = uniform({4 * h, h}, limit);
    Tensor b = torch::zeros({4 * h});
    b.slice(0, h, 2 * h).fill_(1);
    bias = param(b);
    zeroBias = torch::zeros({4 * h});
  }
  std::vector<Tensor> params() const { return {wih, whh, bias}; }
  /// (outputs (T, B, H), last h (B, H), last c (B, H)); zero initial state unless given.
  std::tuple<Tensor, Tensor, Tensor> operator()(const Tensor& x, Tensor h0 = {}, Tensor c0 = {}) const {
    if (!h0.defined()) h0 = torch::zeros({x.size(1), hidden});
    if (!c0.defined()) c0 = torch::zeros({x.size(1), hidden});
    auto [y, h, c] = at::lstm(x, {h0.unsqueeze(0), c0.unsqueeze(0)}, {wih, whh, bias, zeroBias}, /*has_biases=*/true,
                              /*num_layers=*/1, /*dropout=*/0.0, /*train=*/true, /*bidirectional=*/false,
                              /*batch_first=*/false);
    return {y, h.squeeze(0), c.squeeze(0)};
  }
};

/// weft's nn::Linear: Glorot-uniform weight, zero bias (optional).
struct Linear {
  Tensor weight, bias;
  Linear(int64_t in, int64_t out, bool hasBias = true) : weight(glorot(out, in)) {
    if (hasBias) bias = zeros({out});
  }
  std::vector<Tensor> params() const {
    return bias.defined() ? std::vector<Tensor>{weight, bias} : std::vector<Tensor>{weight};
  }
  Tensor operator()(const Tensor& x) const { return torch::linear(x, weight, bias); }
};

/// Rows of `table` with a sparse gradient, like weft's gather on a variable.
Tensor gatherRows(const Tensor& table, const Tensor& ids) {
  return torch::embedding(table, ids, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false, /*sparse=*/true);
}

/// Ids in [0, range) drawn from weft's LogUniformSampler distribution.
Tensor logUniform(std::vector<int64_t> shape, int64_t range) {
  const double logRange = std::log1p(static_cast<double>(range));
  return (torch::rand(shape, torch::kFloat64) * logRange).exp().floor().sub(1).clamp(0, range - 1).to(torch::kLong);
}

/// log(draws * P(id)) under the log-uniform distribution over [0, range).
Tensor logQ(const Tensor& ids, int64_t range, int64_t draws) {
  const Tensor p = (1.0 / (ids.to(torch::kFloat64) + 1)).log1p() / std::log1p(static_cast<double>(range));
  return (p * static_cast<double>(draws)).log().to(torch::kFloat);
}

/// Masked mean of per-position losses, as weft's zoo models compute it.
Tensor maskedMean(const Tensor& perPosition, const Tensor& mask) {
  return (perPosition * mask).sum() / torch::clamp_min(mask.sum(), 1.0);
}

Tensor perTokenCrossEntropy(const Tensor& logits, const Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits, targets,
                                              torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
}

// ---- the peers -------------------------------------------------------------------------------------

/// Turns CPU autocast to bf16 on or off, in either LibTorch's API.
void autocastBf16(bool on) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, on);
#else
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  at::autocast::set_cpu_enabled(on);
#endif
  if (!on) at::autocast::clear_cache();  // as leaving Python's outermost autocast block does
}

/// One model: its update rule, a training-step loss on its fixed batch, and what a batch counts.
/// The sizes a run overrides; 0 keeps the model's default.
struct Sizes {
  int64_t hidden = 0, batch = 0, width = 0;
};

int64_t orDefault(int64_t value, int64_t fallback) { return value > 0 ? value : fallback; }

struct Peer {
  std::unique_ptr<Updater> updater;
  std::function<Tensor()> loss;
  std::string unit;
  double items = 0;  // per batch
  std::string shapes;
};

Peer lm(const Sizes& sizes) {
  const int64_t hiddenSize = orDefault(sizes.hidden, 256);
  constexpr int64_t kVocab = 50000 + 4, kEmbed = 128, kSampled = 1024, kBatch = 64, kWidth = 22;
  constexpr double kMeanWidth = 21.503, kMeanWords = 1302.79;
  auto embedding = normal({kVocab, kEmbed}, 1.0 / std::sqrt(static_cast<double>(kEmbed)));
  auto lstm = std::make_shared<Lstm>(kEmbed, hiddenSize);
  auto outW = normal({kVocab, hiddenSize}, 1.0 / std::sqrt(static_cast<double>(hiddenSize)));
  // The bias is a (V, 1) table so that its rows, too, are gathered with a sparse gradient.
  const Tensor all = torch::arange(kVocab);
  auto outB = param(logQ(all, kVocab, 1).reshape({kVocab, 1}).clone());
  const Tensor tokens = logUniform({kBatch, kWidth}, kVocab), targets = logUniform({kBatch * kWidth}, kVocab);
  const Tensor mask = torch::ones({kBatch * kWidth});
  const Tensor candidates = logUniform({kSampled}, kVocab);
  const Tensor candidateLogQ = logQ(candidates, kVocab, kSampled), targetLogQ = logQ(targets, kVocab, kSampled);
  Peer p;
  std::vector<Tensor> dense = lstm->params();
  p.updater = std::make_unique<Updater>(dense, std::vector<Tensor>{embedding, outW, outB},
                                        Updater::Spec{"adam", 2e-3, 0.9, 0, 1.0});
  p.loss = [=] {
    // (B, T) -> time-major (T, B, E), as weft's graph does.
    const Tensor x = gatherRows(embedding, tokens).transpose(0, 1);
    const Tensor hidden = std::get<0>((*lstm)(x)).transpose(0, 1).reshape({-1, hiddenSize});
    const Tensor trueLogit = (hidden * gatherRows(outW, targets)).sum(1, true) +
                             (gatherRows(outB, targets).reshape({-1}) - targetLogQ).unsqueeze(1);
    const Tensor hits = targets.unsqueeze(1).eq(candidates.unsqueeze(0)).to(torch::kFloat);
    const Tensor sampledLogits = torch::mm(hidden, gatherRows(outW, candidates).t()) +
                                 (gatherRows(outB, candidates).reshape({-1}) - candidateLogQ) - hits * 1e9;
    const Tensor logits = torch::cat({trueLogit, sampledLogits}, 1);
    return maskedMean(-torch::log_softmax(logits, 1).select(1, 0), mask);
  };
  p.unit = "words";
  p.items = kMeanWords * static_cast<double>(kWidth) / kMeanWidth;
  p.shapes =
      "tokens 64 x 22 (" + std::to_string(std::get<0>(at::_unique(tokens)).numel()) + " distinct), 1024 candidates";
  return p;
}

Peer nmt(const Sizes& sizes) {
  const int64_t hiddenSize = orDefault(sizes.hidden, 256);
  constexpr int64_t kVocab = 2000 + 4, kEmbed = 128, kBatch = 64, kWidth = 10;
  constexpr double kMeanWidth = 10.093, kMeanWords = 632.88;
  const double embedScale = 1.0 / std::sqrt(static_cast<double>(kEmbed));
  auto sourceEmbedding = normal({kVocab, kEmbed}, embedScale), targetEmbedding = normal({kVocab, kEmbed}, embedScale);
  auto forward = std::make_shared<Lstm>(kEmbed, hiddenSize), backward = std::make_shared<Lstm>(kEmbed, hiddenSize),
       decoder = std::make_shared<Lstm>(kEmbed, hiddenSize);
  auto initH = std::make_shared<Linear>(hiddenSize, hiddenSize),
       initC = std::make_shared<Linear>(hiddenSize, hiddenSize);
  auto attentional = std::make_shared<Linear>(2 * hiddenSize, hiddenSize, false);
  auto output = std::make_shared<Linear>(hiddenSize, kVocab);
  const Tensor source = torch::randint(4, kVocab, {kBatch, kWidth}),
               targetIn = torch::randint(4, kVocab, {kBatch, kWidth});
  const Tensor targetOut = torch::randint(4, kVocab, {kBatch * kWidth});
  const Tensor sourceMask = torch::ones({kBatch, kWidth}), targetMask = torch::ones({kBatch * kWidth});
  std::vector<Tensor> dense;
  for (const auto& l : {forward, backward, decoder}) {
    for (const Tensor& t : l->params()) dense.push_back(t);
  }
  for (const auto& l : {initH, initC, attentional, output}) {
    for (const Tensor& t : l->params()) dense.push_back(t);
  }
  Peer p;
  p.updater = std::make_unique<Updater>(dense, std::vector<Tensor>{sourceEmbedding, targetEmbedding},
                                        Updater::Spec{"adam", 2e-3, 0.9, 0, 5.0});
  p.loss = [=] {
    const Tensor x = gatherRows(sourceEmbedding, source).transpose(0, 1);  // (Ts, B, E)
    const Tensor fwd = std::get<0>((*forward)(x));
    // No padding in the peer's batch: weft's reverseSequence by lengths is a flip.
    const Tensor bwd = std::get<0>((*backward)(x.flip({0}))).flip({0});
    const Tensor encoded = (fwd + bwd).transpose(0, 1);  // (B, Ts, H)
    const Tensor summary = bwd[0];
    const Tensor h0 = torch::tanh((*initH)(summary)), c0 = (*initC)(summary);
    const Tensor y = gatherRows(targetEmbedding, targetIn).transpose(0, 1);
    const Tensor states = std::get<0>((*decoder)(y, h0, c0)).transpose(0, 1);  // (B, Tt, H)
    const Tensor scores = torch::bmm(states, encoded.transpose(1, 2)) + ((sourceMask - 1.0) * 1e9).unsqueeze(1);
    const Tensor context = torch::bmm(torch::softmax(scores, -1), encoded);
    const Tensor attended = torch::tanh((*attentional)(torch::cat({states, context}, 2).reshape({-1, 2 * hiddenSize})));
    return maskedMean(perTokenCrossEntropy((*output)(attended), targetOut), targetMask);
  };
  p.unit = "words";
  p.items = kMeanWords * static_cast<double>(kWidth) / kMeanWidth;
  p.shapes = "source 64 x 10, target 64 x 10";
  return p;
}

/// A bias-free convolution and batch normalisation (decay 0.9 = LibTorch momentum 0.1).
struct ConvBnImpl : torch::nn::Module {
  ConvBnImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel)
                                                           .stride(stride)
                                                           .padding(kernel / 2)
                                                           .bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(out).momentum(0.1).eps(1e-5)))) {
    // weft's He-normal filter.
    torch::NoGradGuard noGrad;
    conv->weight.normal_(0, std::sqrt(2.0 / static_cast<double>(in * kernel * kernel)));
  }
  Tensor forward(const Tensor& x) { return bn(conv(x)); }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(ConvBn);

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module("conv1", ConvBn(in, out, 3, stride))),
        conv2(register_module("conv2", ConvBn(out, out, 3, 1))) {
    if (stride != 1 || in != out) shortcut = register_module("shortcut", ConvBn(in, out, 1, stride));
  }
  Tensor forward(const Tensor& x) {
    const Tensor h = conv2(torch::relu(conv1(x)));
    return torch::relu(h + (shortcut.is_empty() ? x : shortcut(x)));
  }
  ConvBn conv1, conv2, shortcut{nullptr};
};
TORCH_MODULE(Block);

struct ResNet20Impl : torch::nn::Module {
  explicit ResNet20Impl(int64_t width) : stem(register_module("stem", ConvBn(3, width, 3, 1))) {
    int64_t in = width;
    for (int64_t stage = 0; stage < 3; ++stage) {
      const int64_t out = width << stage;
      for (int64_t b = 0; b < 3; ++b) {
        blocks.push_back(
            register_module("block" + std::to_string(stage * 3 + b), Block(in, out, stage > 0 && b == 0 ? 2 : 1)));
        in = out;
      }
    }
    fc = register_module("fc", torch::nn::Linear(in, 10));
    torch::NoGradGuard noGrad;
    const double limit = std::sqrt(6.0 / static_cast<double>(in + 10));
    fc->weight.uniform_(-limit, limit);
    fc->bias.zero_();
  }
  Tensor forward(Tensor x) {
    x = torch::relu(stem(x));
    for (auto& b : blocks) x = b(x);
    return fc(x.mean({2, 3}));
  }
  ConvBn stem;
  std::vector<Block> blocks;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet20);

Peer resnet(const Sizes& sizes) {
  const int64_t kBatch = orDefault(sizes.batch, 128);
  ResNet20 net(orDefault(sizes.width, 16));
  net->train();
  const Tensor images = torch::randn({kBatch, 3, 32, 32});
  const Tensor labels = torch::randint(0, 10, {kBatch});
  Peer p;
  p.updater = std::make_unique<Updater>(net->parameters(), std::vector<Tensor>{},
                                        Updater::Spec{"momentum", 0.05, 0.9, 5e-4, 0});
  p.loss = [=]() mutable { return torch::nn::functional::cross_entropy(net(images), labels); };
  p.unit = "images";
  p.items = kBatch;
  p.shapes = "images " + std::to_string(kBatch) + " x 3 x 32 x 32";
  return p;
}

Peer gnn(const Sizes& sizes) {
  const int64_t hiddenSize = orDefault(sizes.hidden, 32);
  // weft's batches of 32 graphs average 311.5 nodes and 474.4 edges; other batch sizes scale them.
  const int64_t graphs = orDefault(sizes.batch, 32);
  const int64_t nodes = (312 * graphs + 16) / 32, edges = (474 * graphs + 16) / 32;
  constexpr int64_t kFeatures = 2, kTypes = 3, kSteps = 5, kClasses = 3;
  auto message = std::make_shared<Linear>(hiddenSize, kTypes * hiddenSize);
  const double limit = 1.0 / std::sqrt(static_cast<double>(hiddenSize));
  auto gru = std::make_shared<std::vector<Tensor>>(
      std::vector<Tensor>{uniform({3 * hiddenSize, hiddenSize}, limit), uniform({3 * hiddenSize, hiddenSize}, limit),
                          zeros({3 * hiddenSize}), zeros({3 * hiddenSize})});
  auto readout = std::make_shared<Linear>(2 * hiddenSize, hiddenSize),
       logits = std::make_shared<Linear>(hiddenSize, kClasses);
  const Tensor features = torch::rand({nodes, kFeatures}).round();
  const Tensor src = torch::randint(0, nodes, {edges}), dst = torch::randint(0, nodes, {edges});
  const Tensor types = torch::randint(0, kTypes, {edges});
  const Tensor labels = torch::randint(0, kClasses, {nodes});
  std::vector<Tensor> dense = message->params();
  for (const Tensor& t : *gru) dense.push_back(t);
  for (const auto& l : {readout, logits}) {
    for (const Tensor& t : l->params()) dense.push_back(t);
  }
  Peer p;
  p.updater = std::make_unique<Updater>(dense, std::vector<Tensor>{}, Updater::Spec{"adam", 3e-3, 0.9, 0, 5.0});
  p.loss = [=] {
    const Tensor messageRow = src * kTypes + types;
    const Tensor h0 = torch::constant_pad_nd(features, {0, hiddenSize - kFeatures});
    Tensor h = h0;
    for (int64_t t = 0; t < kSteps; ++t) {
      const Tensor perType = (*message)(h).reshape({-1, hiddenSize});
      const Tensor sent = perType.index_select(0, messageRow);  // bf16 under autocast
      const Tensor incoming = torch::zeros({h.size(0), hiddenSize}, sent.options()).index_add(0, dst, sent);
      h = torch::gru_cell(incoming, h, (*gru)[0], (*gru)[1], (*gru)[2], (*gru)[3]);
    }
    const Tensor states = torch::cat({h, h0}, 1);
    return torch::nn::functional::cross_entropy((*logits)(torch::tanh((*readout)(states))), labels);
  };
  p.unit = "nodes";
  p.items = static_cast<double>(nodes);
  p.shapes = std::to_string(nodes) + " nodes, " + std::to_string(edges) + " edges";
  return p;
}

Peer mlp(const Sizes& sizes) {
  const int64_t width = orDefault(sizes.hidden, 256), batch = orDefault(sizes.batch, 128);
  constexpr int64_t kInputs = 32, kClasses = 10;
  auto fc1 = std::make_shared<Linear>(kInputs, width);
  auto fc2 = std::make_shared<Linear>(width, width);
  auto out = std::make_shared<Linear>(width, kClasses);
  const Tensor features = torch::randn({batch, kInputs});
  const Tensor labels = torch::randint(0, kClasses, {batch});
  std::vector<Tensor> dense;
  for (const auto& layer : {fc1, fc2, out}) {
    for (const Tensor& t : layer->params()) dense.push_back(t);
  }
  Peer p;
  p.updater = std::make_unique<Updater>(dense, std::vector<Tensor>{}, Updater::Spec{"adam", 1e-3, 0.9, 0, 0});
  p.loss = [=] {
    const Tensor h = torch::relu((*fc2)(torch::relu((*fc1)(features))));
    return torch::nn::functional::cross_entropy((*out)(h), labels);
  };
  p.unit = "examples";
  p.items = static_cast<double>(batch);
  p.shapes = "features " + std::to_string(batch) + " x 32";
  return p;
}

Peer listReduction(const Sizes& sizes) {
  const int64_t hiddenSize = orDefault(sizes.hidden, 128);
  constexpr int64_t kVocab = 16, kEmbed = 32, kClasses = 10, kWidth = 11;
  const int64_t batch = orDefault(sizes.batch, 64);
  auto embedding = normal({kVocab, kEmbed}, 1.0 / std::sqrt(static_cast<double>(kEmbed)));
  auto lstm = std::make_shared<Lstm>(kEmbed, hiddenSize);
  auto out = std::make_shared<Linear>(hiddenSize, kClasses);
  const Tensor tokens = torch::randint(0, kVocab, {batch, kWidth});
  // Each list's real length (1 + 1..10 digits) as a prefix mask.
  const Tensor lengths = torch::randint(2, kWidth + 1, {batch, 1});
  const Tensor mask = torch::arange(kWidth).unsqueeze(0).lt(lengths).to(torch::kFloat);
  const Tensor labels = torch::randint(0, kClasses, {batch});
  std::vector<Tensor> dense = lstm->params();
  for (const Tensor& t : out->params()) dense.push_back(t);
  Peer p;
  p.updater =
      std::make_unique<Updater>(dense, std::vector<Tensor>{embedding}, Updater::Spec{"adam", 3e-3, 0.9, 0, 5.0});
  p.loss = [=] {
    const Tensor y = std::get<0>((*lstm)(gatherRows(embedding, tokens).transpose(0, 1)));  // (T, B, H)
    // mask[t] - mask[t + 1] is 1 exactly at each list's last real position.
    const Tensor last = mask - torch::constant_pad_nd(mask.slice(1, 1), {0, 1});
    const Tensor states = (y * last.t().unsqueeze(2)).sum(0);
    return torch::nn::functional::cross_entropy((*out)(states), labels);
  };
  p.unit = "lists";
  p.items = static_cast<double>(batch);
  p.shapes = "tokens " + std::to_string(batch) + " x 11";
  return p;
}

}  // namespace

/// The peer of the weft model `model`; none for a name it does not know.
std::optional<Peer> makePeer(const std::string& model, const Sizes& sizes) {
  if (model == "mlp") return mlp(sizes);
  if (model == "lm") return lm(sizes);
  if (model == "nmt") return nmt(sizes);
  if (model == "resnet") return resnet(sizes);
  if (model == "gnn") return gnn(sizes);
  if (model == "list_reduction") return listReduction(sizes);
  return std::nullopt;
}

/// Warms up, times `steps` steps and prints the JSON line.
void benchmark(Peer& peer, const std::string& model, int steps, int threads, bool bf16) {
  std::fprintf(stderr, "%s: %lld parameters (%lld dense, %lld with sparse gradients); %s\n", model.c_str(),
               static_cast<long long>(peer.updater->denseCount() + peer.updater->sparseCount()),
               static_cast<long long>(peer.updater->denseCount()), static_cast<long long>(peer.updater->sparseCount()),
               peer.shapes.c_str());

  auto step = [&] {
    peer.updater->zeroGrad();
    if (bf16) autocastBf16(true);
    Tensor loss = peer.loss();
    if (bf16) autocastBf16(false);
    loss.backward();
    peer.updater->step();
    return loss.item<double>();
  };
  constexpr int kWarmup = 5;
  std::fprintf(stderr, "%s: warm-up losses", model.c_str());
  // At least kWarmup steps and 200 ms, as weft's --bench: a new thread team takes
  // milliseconds to spread over the cores.
  const auto warmupEnd = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  for (int i = 0; i < kWarmup || std::chrono::steady_clock::now() < warmupEnd; ++i) {
    const double loss = step();
    if (i < kWarmup) std::fprintf(stderr, " %.4f", loss);
  }
  std::vector<double> times;
  double last = 0;
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    last = step();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::fprintf(stderr, "; after %d more steps %.4f\n", steps, last);

  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  auto at = [&](double q) { return sorted[static_cast<size_t>(q * static_cast<double>(sorted.size() - 1))] * 1e3; };
  double total = 0;
  for (double t : times) total += t;
  std::printf(
      "{\"model\": \"%s\", \"impl\": \"libtorch\", \"steps\": %d, \"threads\": %d, \"median_ms\": %.4f, \"p10_ms\": "
      "%.4f, \"p90_ms\": %.4f, \"%s_per_s\": %.6g}\n",
      model.c_str(), steps, threads, at(0.5), at(0.1), at(0.9), peer.unit.c_str(),
      peer.items * static_cast<double>(steps) / total);
}

int main(int argc, char** argv) {
  const auto usage = [&] {
    std::fprintf(stderr,
                 "usage: %s MODEL STEPS [THREADS] [--hidden H] [--hidden-width H] [--batch B] [--width W] "
                 "[--precision bf16]   "
                 "(MODEL: mlp lm nmt resnet gnn list_reduction)\n",
                 argv[0]);
    return 2;
  };
  if (argc < 3) return usage();
  const std::string model = argv[1];
  const int steps = std::atoi(argv[2]);
  int next = 3;
  const int threads = argc > 3 && argv[3][0] != '-' ? std::atoi(argv[next++]) : 2;
  Sizes sizes;
  bool bf16 = false;
  for (; next + 1 < argc; next += 2) {
    const std::string flag = argv[next];
    if (flag == "--precision" && (std::string(argv[next + 1]) == "bf16" || std::string(argv[next + 1]) == "f32")) {
      bf16 = std::string(argv[next + 1]) == "bf16";
      continue;
    }
    const int64_t value = std::atoll(argv[next + 1]);
    if (value < 1) return usage();
    if (flag == "--hidden" && model != "resnet" && model != "mlp") sizes.hidden = value;
    else if (flag == "--hidden-width" && model == "mlp") sizes.hidden = value;
    else if (flag == "--batch" && model != "lm" && model != "nmt") sizes.batch = value;
    else if (flag == "--width" && model == "resnet") sizes.width = value;
    else return usage();
  }
  if (next != argc || steps < 1 || threads < 1) return usage();
  torch::set_num_threads(threads);
  torch::manual_seed(1);
  std::optional<Peer> peer = makePeer(model, sizes);
  if (!peer) {
    std::fprintf(stderr, "unknown model '%s' (known: mlp lm nmt resnet gnn list_reduction)\n", model.c_str());
    return 2;
  }
  benchmark(*peer, model, steps, threads, bf16);
  return 0;
}
