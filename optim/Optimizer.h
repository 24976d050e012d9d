// Optimizers as graph builders: minimize() differentiates the loss, creates slot variables and
// emits one update op per variable (dense or row-sparse, following the recorded gradient links),
// a global-step increment, and the graph's "update_ops" (e.g. batch-norm moving statistics),
// grouped into one step node to run as a target.
#pragma once

#include "autodiff/Gradients.h"
#include "ops/Ops.h"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace weft::optim {

/// A learning rate as a function of the global step (an f64 scalar output); a plain number is a
/// constant rate.
///
///     optim::Adam opt(optim::warmup(optim::cosineDecay(1e-3, 10000), 500));
class LearningRate {
 public:
  LearningRate(double constant);  // NOLINT: numbers convert implicitly
  explicit LearningRate(std::function<Output(Output step)> schedule) : schedule_(std::move(schedule)) {}
  Output operator()(Output step) const { return schedule_(step); }

 private:
  std::function<Output(Output)> schedule_;
};

/// lr * rate^(step / steps), with the exponent floored when staircase.
LearningRate exponentialDecay(double lr, double rate, double steps, bool staircase = false);
/// Cosine from lr down to minLr over totalSteps, then minLr.
LearningRate cosineDecay(double lr, double totalSteps, double minLr = 0.0);
/// Linear ramp from 0 to the schedule's value over warmupSteps.
LearningRate warmup(LearningRate after, double warmupSteps);

/// Loss scaling for float16 training: the loss is multiplied by a scale before differentiation
/// and the gradients divided by it afterwards, so small gradients survive f16's narrow range. A
/// step whose gradients overflow (any NaN or infinity) applies no update and does not count
/// (global_step, and so learning-rate schedules, stay put); the forward pass's update_ops
/// (batch-norm statistics) still run. A dynamic scale halves after such a step (down to 1) and
/// doubles after `growthInterval` good steps in a row (up to 2^24). The scale and the count of
/// good steps are variables ("loss_scale", "loss_scale/good_steps"), so checkpoints carry them.
/// A Session's checkNumerics leaves the scaled backward pass to this skipping and still checks the
/// forward pass and the updates.
struct LossScaling {
  double initial = 65536;
  bool dynamic = true;
  int64_t growthInterval = 2000;
};

struct MinimizeOptions {
  /// Clip all gradients together to this global norm (0: no clipping).
  double clipGlobalNorm = 0.0;
  /// Variables to train; empty means every trainable variable.
  std::vector<Output> variables;
  /// Scale the loss (for f16 mixed precision); unset: no scaling.
  std::optional<LossScaling> lossScaling;
  /// Under mixed precision with 16-bit copies (Graph::MixedOps::CastOperands), keep the
  /// activations between ops that take 16-bit values in 16 bits once the step is built
  /// (keepActivationsLow, ops/MixedPrecision.h): no casts back and forth between convolutions.
  bool keepActivationsLow = true;
  /// Once the step is built, fuse ops whose values are the same bits computed in one pass (a
  /// batch norm and the ReLU after it, forward and backward; ops/Fusion.h).
  bool fuse = true;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  /// Builds gradients and updates; returns the node to run as a training step.
  Node* minimize(Output loss, const MinimizeOptions& options = {});
  /// Updates each variable with its gradient (dense or sparse); returns the step node. With a
  /// `condition` (a scalar), the updates and the step increment run only when it is nonzero.
  Node* applyGradients(const std::vector<std::pair<Grad, Output>>& gradsAndVariables, Output condition = {});

  /// The graph's i64 step counter ("global_step"), created on first use.
  static Output globalStep(Graph& graph);
  /// A slot this optimizer created for `variable` ("m", "v", "accumulator", "momentum").
  Output slot(Output variable, const std::string& name) const;
  /// The learning rate at the current step, as built into the graph by the last minimize().
  Output learningRate() const { return lrOutput_; }
  /// The loss scale variable of the last minimize() with loss scaling (invalid without).
  Output lossScale() const { return lossScale_; }

 protected:
  Optimizer(LearningRate lr, double weightDecay, std::string name)
      : lr_(std::move(lr)), weightDecay_(weightDecay), name_(std::move(name)) {}

  /// The op name suffix ("SGD", "Adam", ...), slot names, and extra attributes of this rule.
  virtual std::vector<std::string> slotNames() const = 0;
  virtual Attrs ruleAttrs() const = 0;
  virtual bool needsStep() const { return false; }

 private:
  Node* applyOne(const Grad& grad, Output variable, Output lr, Output step);
  /// Gradients of loss * scale, divided by the scale; `finite` says whether all of them are.
  std::vector<Grad> scaledGradients(Output loss, const std::vector<Output>& vars, const LossScaling& scaling,
                                    Output& finite);
  /// The ops that halve or grow the loss scale after a step (`finite`: the step's verdict).
  std::vector<Node*> updateLossScale(const LossScaling& scaling, Output finite);

  LearningRate lr_;
  double weightDecay_;
  std::string name_;
  std::map<std::pair<Node*, std::string>, Output> slots_;
  Output lrOutput_;
  Output lossScale_, goodSteps_;
};

/// w -= lr (g + wd w)
class SGD : public Optimizer {
 public:
  explicit SGD(LearningRate lr, double weightDecay = 0) : Optimizer(std::move(lr), weightDecay, "SGD") {}

 protected:
  std::vector<std::string> slotNames() const override { return {}; }
  Attrs ruleAttrs() const override { return {}; }
};

/// Heavy-ball momentum (PyTorch's form): a = m a + g; w -= lr (nesterov ? g + m a : a)
class Momentum : public Optimizer {
 public:
  Momentum(LearningRate lr, double momentum, bool nesterov = false, double weightDecay = 0)
      : Optimizer(std::move(lr), weightDecay, "Momentum"), momentum_(momentum), nesterov_(nesterov) {}

 protected:
  std::vector<std::string> slotNames() const override { return {"momentum"}; }
  Attrs ruleAttrs() const override { return {{"momentum", momentum_}, {"nesterov", nesterov_}}; }

 private:
  double momentum_;
  bool nesterov_;
};

/// Adam with bias correction; decoupled weight decay gives AdamW. Sparse updates are lazy: only
/// the touched rows' moments decay.
class Adam : public Optimizer {
 public:
  explicit Adam(LearningRate lr, double beta1 = 0.9, double beta2 = 0.999, double epsilon = 1e-8,
                double weightDecay = 0, bool decoupled = false)
      : Optimizer(std::move(lr), weightDecay, "Adam"), beta1_(beta1), beta2_(beta2), epsilon_(epsilon),
        decoupled_(decoupled) {}

 protected:
  std::vector<std::string> slotNames() const override { return {"m", "v"}; }
  Attrs ruleAttrs() const override {
    return {{"beta1", beta1_}, {"beta2", beta2_}, {"epsilon", epsilon_}, {"decoupled", decoupled_}};
  }
  bool needsStep() const override { return true; }

 private:
  double beta1_, beta2_, epsilon_;
  bool decoupled_;
};

/// a += g^2; w -= lr g / (sqrt(a) + eps)
class Adagrad : public Optimizer {
 public:
  explicit Adagrad(LearningRate lr, double epsilon = 1e-10, double weightDecay = 0)
      : Optimizer(std::move(lr), weightDecay, "Adagrad"), epsilon_(epsilon) {}

 protected:
  std::vector<std::string> slotNames() const override { return {"accumulator"}; }
  Attrs ruleAttrs() const override { return {{"epsilon", epsilon_}}; }

 private:
  double epsilon_;
};

/// Shadow copies of variables that track avg = decay avg + (1 - decay) w.
class ExponentialMovingAverage {
 public:
  explicit ExponentialMovingAverage(double decay) : decay_(decay) {}

  /// Update ops for `variables`, run after `after` (e.g. the training step) when given.
  Node* apply(const std::vector<Output>& variables, Node* after = nullptr);
  /// The shadow of a variable passed to apply().
  Output average(Output variable) const;

 private:
  double decay_;
  std::map<Node*, Output> shadows_;
};

}  // namespace weft::optim
