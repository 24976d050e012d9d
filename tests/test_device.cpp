// Device placement as the graph records it and as the executor checks it; these run on any
// machine (the GPU suite, test_cuda, runs the placed graphs).
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "nn/Layers.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"

using namespace weft;

TEST_CASE("a device scope places the nodes created inside it") {
  Graph g;
  Output x = g.placeholder("x", f32, {2});
  Output y, z;
  {
    auto placed = g.onDevice("cuda:1");
    y = exp(x);
    {
      auto back = g.onDevice("");
      z = y + 1.0;
    }
  }
  CHECK(y.node()->device == "cuda:1");
  CHECK(z.node()->device.empty());
  CHECK(contains(errorOf([&] { g.onDevice("tpu:0"); }), "invalid device 'tpu:0'"));
}

TEST_CASE("gradient ops are placed on their forward op's device") {
  Graph g;
  Output x = g.placeholder("x", f64, {3, 4});
  Output w = g.variable("w", f64, {4, 2}, Initializer::uniform(-1, 1));
  Output h;
  {
    auto placed = g.onDevice("cuda:0");
    h = tanh(matmul(x, w));
  }
  Output loss = sum(h);  // on the default device
  const Grad dw = gradients(loss, {w})[0];
  CHECK(dw.dense.node()->device == "cuda:0");  // MatMul's gradient
  int placedOnGpu = 0;
  for (const auto& n : g.nodes()) {
    if (n->name.rfind("gradients/", 0) != 0) continue;
    const bool forwardOnGpu = contains(n->name, "MatMul") || contains(n->name, "Tanh");
    if (forwardOnGpu) {
      CHECK(n->device == "cuda:0");
      ++placedOnGpu;
    }
  }
  CHECK(placedOnGpu >= 2);
}

TEST_CASE("optimizer slots and updates live on their variable's device") {
  Graph g;
  Output x = g.placeholder("x", f32, {4, 3});
  Output w;
  {
    auto placed = g.onDevice("cuda:0");
    w = g.variable("w", f32, {3, 2}, Initializer::uniform(-1, 1));
  }
  Output loss = mean(square(matmul(x, w)));
  optim::Adam adam(1e-3);
  Node* step = adam.minimize(loss);
  CHECK(adam.slot(w, "m").node()->device == "cuda:0");
  CHECK(adam.slot(w, "v").node()->device == "cuda:0");
  bool found = false;
  for (Node* update : step->controlInputs) {
    if (update->op == "ApplyAdam") {
      CHECK(update->device == "cuda:0");
      found = true;
    }
  }
  CHECK(found);
}

TEST_CASE("a node placed on an absent GPU fails at its first run, naming the node and the reason") {
  if (cudaDeviceCount() > 3) return;  // cuda:3 exists here: nothing to refuse
  Graph g;
  Output x = g.placeholder("x", f32, {2});
  Output y;
  {
    auto placed = g.onDevice("cuda:3");
    y = exp(x);
  }
  Session s(g);
  const std::string e = errorOf([&] { s.run({y}, {{x, Tensor::zeros(f32, {2})}}); });
  CHECK(contains(e, "op 'Exp'"));
  CHECK(contains(e, "is placed on cuda:3, which is not available"));
}

TEST_CASE("without a GPU the reason is stated") {
  if (cudaDeviceCount() > 0) return;
  CHECK_FALSE(cudaUnavailableReason().empty());
  CHECK(contains(errorOf([] { Tensor(f32, {2}, Device::parse("cuda:0")); }), "cuda:0 is not available"));
}

TEST_CASE("moving a tensor to the device it is on returns the tensor itself") {
  const Tensor t = Tensor::fromVector<float>({1, 2}, {2});
  const Tensor same = t.to(cpu());
  CHECK(same.raw() == t.raw());
}

TEST_CASE("a pinned tensor is a host tensor, page-locked only where a GPU is visible") {
  Tensor t = Tensor::pinned(f32, {3});
  CHECK(t.device() == cpu());
  t.fill(2.5);
  CHECK(t.toDoubles() == std::vector<double>{2.5, 2.5, 2.5});
  CHECK(hostMemoryPinnable() == (cudaDeviceCount() > 0));
  if (!hostMemoryPinnable()) CHECK(pinnedMemoryStats().allocations == 0);
}

TEST_CASE("uploading to the CPU hands back host tensors") {
  const Tensor t = Tensor::fromVector<float>({1, 2}, {2});
  const std::vector<Tensor> up = uploadTo({t}, cpu());
  REQUIRE(up.size() == 1);
  CHECK(up[0].raw() == t.raw());
}

TEST_CASE("uploading to an absent GPU, or an empty tensor, is refused naming it") {
  CHECK(contains(errorOf([] { uploadTo({Tensor()}, cpu()); }), "tensor 0 is empty"));
  if (cudaDeviceCount() > 3) return;
  CHECK(contains(errorOf([] { uploadTo({Tensor::zeros(f32, {2})}, Device::parse("cuda:3")); }),
                 "cuda:3 is not available"));
}
