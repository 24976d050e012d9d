// A transform's or a loss's subgraph compiled for the AMP runtime: its forward and backward
// passes and its optimizer's update in a session of their own, fed one instance's payloads.
#pragma once

#include "amp/AmpGraph.h"
#include "core/Session.h"

#include <memory>
#include <string>
#include <vector>

namespace weft::amp {

struct Param {
  std::string name;
  Output variable;
  Grad grad;
  Output densePh, indicesPh, valuesPh;
  Tensor sum;                         // dense gradients summed
  std::vector<Tensor> indices, values;  // sparse gradients gathered
};

struct Compiled {
  std::unique_ptr<weft::Graph> graph;
  std::unique_ptr<Session> session;
  std::vector<Output> payloads, fromState;
  Output y, dy;
  std::vector<Output> kept;        // forward values the backward pass reads
  std::vector<Output> inputGrads;  // per payload; invalid where none flows
  std::vector<Param> params;
  weft::Node* updateStep = nullptr;
  LossOutputs loss;
  Output lossGrad;
};

/// The subgraph of a transform or loss node for inputs of `inputs`: the gradients of its
/// payloads and (when `needsGradients`) of its variables, and `optimizer`'s update of them, all
/// placed on `device` ("" or "cpu": the CPU; "cuda:N"), fed and fetched through the host.
std::unique_ptr<Compiled> compileTransform(const amp::Node& node, const std::vector<TensorType>& inputs,
                                           optim::Optimizer* optimizer, bool needsGradients,
                                           const std::string& device = "");

}  // namespace weft::amp
