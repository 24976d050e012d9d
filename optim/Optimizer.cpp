#include "optim/Optimizer.h"

#include "ops/Fusion.h"
#include "ops/MixedPrecision.h"

#include <cmath>
#include <map>

namespace weft::optim {
namespace {

Output stepAsFloat(Output step) { return cast(step, f64); }

// Far above what f16 gradients need, and far from f32's overflow.
constexpr double kMaxLossScale = 16777216.0;  // 2^24

}  // namespace

LearningRate::LearningRate(double constant)
    : schedule_([constant](Output step) { return step.graph().scalar(constant, f64); }) {}

LearningRate exponentialDecay(double lr, double rate, double steps, bool staircase) {
  return LearningRate([=](Output step) {
    Graph& g = step.graph();
    Output exponent = stepAsFloat(step) / steps;
    if (staircase) exponent = cast(cast(exponent, i64), f64);  // floor, for step >= 0
    return g.scalar(lr, f64) * pow(g.scalar(rate, f64), exponent);
  });
}

LearningRate cosineDecay(double lr, double totalSteps, double minLr) {
  return LearningRate([=](Output step) {
    Graph& g = step.graph();
    Output progress = minimum(stepAsFloat(step) / totalSteps, g.scalar(1.0, f64));
    return minLr + (lr - minLr) * 0.5 * (1.0 + cos(progress * M_PI));
  });
}

LearningRate warmup(LearningRate after, double warmupSteps) {
  return LearningRate([=](Output step) {
    Output ramp = minimum((stepAsFloat(step) + 1.0) / warmupSteps, step.graph().scalar(1.0, f64));
    return ramp * after(step);
  });
}

Output Optimizer::globalStep(Graph& graph) {
  if (Node* n = graph.find("global_step")) return n->output();
  return graph.variable("global_step", i64, {}, Initializer::zeros(), false);
}

Output Optimizer::slot(Output variable, const std::string& name) const {
  auto it = slots_.find({variable.node(), name});
  WEFT_CHECK(it != slots_.end(), "{} has no slot '{}' for variable '{}'", name_, name, variable.node()->name);
  return it->second;
}

Node* Optimizer::minimize(Output loss, const MinimizeOptions& options) {
  std::vector<Output> vars = options.variables;
  if (vars.empty()) {
    for (Node* v : loss.graph().trainableVariables()) vars.push_back(v->output());
  }
  WEFT_CHECK(!vars.empty(), "{}::minimize: the graph has no trainable variables", name_);
  Graph& g = loss.graph();
  const size_t firstBackwardNode = g.nodes().size();
  Output finite;
  std::vector<Grad> grads = options.lossScaling ? scaledGradients(loss, vars, *options.lossScaling, finite)
                                                : gradients(loss, vars);
  if (options.clipGlobalNorm > 0) grads = clipByGlobalNorm(grads, options.clipGlobalNorm).first;
  if (options.lossScaling) {
    for (size_t i = firstBackwardNode; i < g.nodes().size(); ++i)
      g.addToCollection(kLossScaledCollection, g.nodes()[i].get());
  }
  std::vector<std::pair<Grad, Output>> pairs;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (grads[i].valid()) pairs.emplace_back(grads[i], vars[i]);
  }
  Node* step = applyGradients(pairs, finite);
  if (options.lossScaling) {
    std::vector<Node*> all = updateLossScale(*options.lossScaling, finite);
    all.push_back(step);
    step = g.group(all, "train_step_scaled");
  }
  if (options.keepActivationsLow) keepActivationsLow(g);
  if (options.fuse) fuseBatchNormRelu(g);
  return step;
}

std::vector<Grad> Optimizer::scaledGradients(Output loss, const std::vector<Output>& vars, const LossScaling& scaling,
                                             Output& finite) {
  WEFT_CHECK(scaling.initial >= 1 && scaling.growthInterval >= 1,
             "{}: loss scaling needs an initial scale >= 1 and a growth interval >= 1, got {} and {}", name_,
             scaling.initial, scaling.growthInterval);
  Graph& g = loss.graph();
  WEFT_CHECK(g.collection("loss_scale").empty(),
             "{}: the graph already has a loss scale (one minimize() per graph scales)", name_);
  WEFT_CHECK(scaling.initial <= kMaxLossScale, "{}: the initial loss scale {} is above the largest, 2^24", name_,
             scaling.initial);
  lossScale_ = g.variable("loss_scale", f32, {}, Initializer::constant(scaling.initial), false);
  g.addToCollection("loss_scale", lossScale_.node());
  goodSteps_ = g.variable("loss_scale/good_steps", f32, {}, Initializer::zeros(), false);
  std::vector<Grad> grads = gradients(loss * cast(lossScale_, loss.dtype()), vars);
  const Output inverse = 1.0 / lossScale_;
  std::vector<Output> values;
  for (Grad& grad : grads) {
    if (!grad.valid()) continue;
    Output& v = grad.isSparse() ? grad.values : grad.dense;
    v = v * cast(inverse, v.dtype());
    values.push_back(v);
  }
  finite = allFinite(values);
  return grads;
}

std::vector<Node*> Optimizer::updateLossScale(const LossScaling& scaling, Output finite) {
  Graph& g = finite.graph();
  auto scope = g.scope("loss_scale");
  if (!scaling.dynamic) return {};
  const Output zero = g.scalar(0.0), one = g.scalar(1.0);
  const Output counted = goodSteps_ + 1.0;
  const Output grow = greaterEqual(counted, g.scalar(static_cast<double>(scaling.growthInterval)));
  const Output afterGood = where(grow, minimum(lossScale_ * 2.0, g.scalar(kMaxLossScale)), lossScale_);
  const Output afterOverflow = maximum(lossScale_ * 0.5, one);
  return {assign(lossScale_, where(finite, afterGood, afterOverflow)),
          assign(goodSteps_, where(finite, where(grow, zero, counted), zero))};
}

Node* Optimizer::applyGradients(const std::vector<std::pair<Grad, Output>>& gradsAndVariables, Output condition) {
  WEFT_CHECK(!gradsAndVariables.empty(), "{}: no gradients to apply", name_);
  Graph& g = gradsAndVariables[0].second.graph();
  registerAllOps();
  Output step = globalStep(g);
  auto scope = g.scope(name_);
  lrOutput_ = lr_(step);
  std::map<DType, Output> lrIn;  // the learning rate in each variable dtype, cast once
  std::vector<Node*> updates;
  for (const auto& [grad, var] : gradsAndVariables) {
    Output& lr = lrIn[var.dtype()];
    if (!lr.valid()) lr = cast(lrOutput_, var.dtype());
    updates.push_back(applyOne(grad, var, lr, step));
  }
  updates.push_back(assignAdd(step, g.scalar(1, i64)));
  if (condition.valid()) {
    for (Node* u : updates) g.runOnlyIf(u, condition);
  }
  // Side effects of the forward pass (batch-norm statistics) happened whatever the gradients.
  for (Node* u : g.collection("update_ops")) updates.push_back(u);
  return g.group(updates, "train_step");
}

Node* Optimizer::applyOne(const Grad& grad, Output variable, Output lr, Output step) {
  Graph& g = variable.graph();
  WEFT_CHECK(variable.node()->op == "Variable", "{}: {} is not a variable", name_, variable.name());
  auto placed = g.onDevice(variable.node()->device);  // slots and the update live with the variable
  std::vector<Output> inputs{variable};
  for (const std::string& s : slotNames()) {
    auto key = std::make_pair(variable.node(), s);
    if (!slots_.count(key)) {
      slots_[key] =
          g.variable(variable.node()->name + "/" + s, variable.dtype(), variable.shape(), Initializer::zeros(), false);
    }
    inputs.push_back(slots_[key]);
  }
  if (grad.isSparse()) {
    inputs.push_back(grad.indices);
    inputs.push_back(grad.values);
  } else {
    inputs.push_back(grad.dense);
  }
  inputs.push_back(lr);
  if (needsStep()) inputs.push_back(step);
  Attrs attrs = ruleAttrs();
  attrs.set("weight_decay", weightDecay_);
  const std::string op = (grad.isSparse() ? "SparseApply" : "Apply") + name_;
  return g.addNode(op, inputs, attrs, op + "_" + variable.node()->name);
}

Node* ExponentialMovingAverage::apply(const std::vector<Output>& variables, Node* after) {
  WEFT_CHECK(!variables.empty(), "ExponentialMovingAverage::apply: no variables");
  Graph& g = variables[0].graph();
  std::vector<Node*> updates;
  for (const Output& v : variables) {
    auto placed = g.onDevice(v.node()->device);
    auto it = shadows_.find(v.node());
    if (it == shadows_.end()) {
      Output shadow = g.variable(v.node()->name + "/ExponentialMovingAverage", v.dtype(), v.shape(),
                                 Initializer::copyOf(v), false);
      it = shadows_.emplace(v.node(), shadow).first;
    }
    Node* update = assignMovingAverage(it->second, v, decay_);
    if (after) g.addControlInput(update, after);
    updates.push_back(update);
  }
  return g.group(updates, "moving_average");
}

Output ExponentialMovingAverage::average(Output variable) const {
  auto it = shadows_.find(variable.node());
  WEFT_CHECK(it != shadows_.end(), "no moving average for variable '{}'", variable.node()->name);
  return it->second;
}

}  // namespace weft::optim
