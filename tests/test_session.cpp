// The executor: pruning, ordering of variable reads and writes, memory plan, plan cache,
// determinism, feeds and their errors, and the bytes a trace records per op.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "core/Trace.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"

#include <nlohmann/json.hpp>

#include <map>

using namespace weft;

TEST_CASE("a run computes only what its fetches need") {
  Graph g;
  Output x = g.placeholder("x", f32, {2});
  Output y = x * 2.0;
  // A branch that would fail if it ran: id 7 is out of range for a 3-row table.
  Output table = g.constant(Tensor::zeros(f32, {3, 2}));
  Output bad = gather(table, g.constant(Tensor::fromVector<int64_t>({7}, {1})));
  (void)bad;
  Session s(g);
  const Tensor out = s.run({y}, {{x, Tensor::fromVector<float>({1, 2}, {2})}})[0];
  CHECK_CLOSE(out, (std::vector<double>{2, 4}), 0);
  CHECK(s.planStats({y}, {{x, Tensor::fromVector<float>({1, 2}, {2})}}).opCount == 1);
}

TEST_CASE("a fed output cuts the graph above it") {
  Graph g;
  Output x = g.placeholder("x", f32, {2});
  Output h = exp(x);
  Output y = h + 1.0;
  Session s(g);
  // x is not fed: feeding h makes it unnecessary.
  const Tensor out = s.run({y}, {{h, Tensor::fromVector<float>({5, 6}, {2})}})[0];
  CHECK_CLOSE(out, (std::vector<double>{6, 7}), 0);
}

TEST_CASE("reads of a variable in a run see its value from before the run's updates") {
  Graph g;
  Output w = g.variable("w", f64, {2}, Initializer::constant(3));
  Output read = w * 1.0;  // created before the update
  Node* update = assign(w, g.constant(Tensor::fromVector<double>({10, 20}, {2})));
  Output readAfter = w + 0.0;  // created after the update, still a reader
  Session s(g);
  const auto out = s.run({read, readAfter}, {}, {update});
  CHECK_CLOSE(out[0], (std::vector<double>{3, 3}), 0);
  CHECK_CLOSE(out[1], (std::vector<double>{3, 3}), 0);
  CHECK_CLOSE(s.variable("w"), (std::vector<double>{10, 20}), 0);
}

TEST_CASE("an op that depends on an update runs after it") {
  Graph g;
  Output w = g.variable("w", f64, {1}, Initializer::constant(1));
  Node* update = assignAdd(w, g.constant(Tensor::fromVector<double>({1}, {1})));
  Output after = identity(w);
  after.node()->controlInputs.push_back(update);
  Session s(g);
  CHECK(s.run({after})[0].item() == 2);
}

TEST_CASE("a reshape shares its input's buffer, and an op in place waits until neither is read") {
  Graph g;
  Output x = g.placeholder("x", f32, {6, 4});
  const Output doubled = x * 2.0;
  const Output flat = reshape(doubled, {24});
  const Output rectified = relu(flat);  // in place on flat's buffer only if doubled were dead
  const Output y = doubled + reshape(rectified, {6, 4});
  Session s(g);
  const Tensor input = testing::randomTensor(f32, {6, 4}, 3);
  const PlanStats stats = s.planStats({y}, {{x, input}});
  CHECK(stats.viewOps == 2);
  const std::vector<double> in = input.toDoubles();
  std::vector<double> expected(in.size());
  for (size_t i = 0; i < in.size(); ++i) expected[i] = 2 * in[i] + std::max(0.0, 2 * in[i]);
  CHECK_CLOSE(s.run({y}, {{x, input}})[0], expected, 0);
}

TEST_CASE("the memory plan reuses dead buffers and works in place") {
  Graph g;
  Output x = g.placeholder("x", f32, {1024});
  Output y = x;
  for (int i = 0; i < 10; ++i) y = tanh(y * 1.5);
  Session s(g);
  const Tensor input = testing::randomTensor(f32, {1024}, 1);
  const PlanStats stats = s.planStats({y}, {{x, input}});
  CHECK(stats.opCount == 20);
  CHECK(stats.inplaceOps > 0);
  CHECK(stats.arenaBytes <= 2 * 1024 * sizeof(float));
  CHECK(stats.unplannedBytes >= 19 * 1024 * sizeof(float));
  CHECK(stats.peakBytes == stats.arenaBytes + 1024 * sizeof(float));

  // The planned run computes the same values as the reference.
  std::vector<double> expected(1024);
  for (int i = 0; i < 1024; ++i) {
    double v = input.at(i);
    for (int k = 0; k < 10; ++k) v = std::tanh(v * 1.5);
    expected[static_cast<size_t>(i)] = v;
  }
  CHECK_CLOSE(s.run({y}, {{x, input}})[0], expected, 1e-5);
}

TEST_CASE("a fetched value survives later runs") {
  Graph g;
  Output x = g.placeholder("x", f32, {2});
  Output y = x * 3.0;
  Session s(g);
  const Tensor first = s.run({y}, {{x, Tensor::fromVector<float>({1, 1}, {2})}})[0];
  s.run({y}, {{x, Tensor::fromVector<float>({5, 5}, {2})}});
  CHECK_CLOSE(first, (std::vector<double>{3, 3}), 0);
}

TEST_CASE("plans are cached by fetches and feed shapes") {
  Graph g;
  Output x = g.placeholder("x", f32, {-1, 3});
  Output y = sum(x * x, {1});
  Session s(g);
  s.run({y}, {{x, Tensor::zeros(f32, {2, 3})}});
  s.run({y}, {{x, Tensor::zeros(f32, {2, 3})}});
  CHECK(s.cachedPlans() == 1);
  const Tensor out = s.run({y}, {{x, Tensor::full(f32, {5, 3}, 2)}})[0];
  CHECK(s.cachedPlans() == 2);
  CHECK(out.shape() == Shape{5});
  CHECK_CLOSE(out, std::vector<double>(5, 12), 0);
}

TEST_CASE("variables initialise deterministically from the graph seed and their names") {
  auto initial = [](uint64_t seed, bool extra) {
    Graph g;
    g.setSeed(seed);
    if (extra) g.variable("other", f32, {7}, Initializer::normal(0, 1));
    g.variable("w", f32, {4, 4}, Initializer::glorotUniform());
    Session s(g);
    return s.variable("w").toDoubles();
  };
  CHECK(initial(3, false) == initial(3, false));
  CHECK(initial(3, false) == initial(3, true));  // adding a variable changes no other
  CHECK(initial(3, false) != initial(4, false));
}

TEST_CASE("a sharded variable starts as its elements of the whole value its initializer makes") {
  const std::vector<Initializer> initializers{
      Initializer::glorotUniform(), Initializer::heNormal(), Initializer::truncatedNormal(0.5),
      Initializer::uniform(-1, 2), Initializer::fromTensor(Tensor::fromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3}))};
  for (size_t k = 0; k < initializers.size(); ++k) {
    CAPTURE(k);
    Graph whole;
    whole.variable("copy", f32, {2, 3}, Initializer::copyOf(whole.variable("w", f32, {2, 3}, initializers[k])));
    Session wholeSession(whole);
    for (const char* name : {"w", "copy"}) {
      CAPTURE(name);
      const std::vector<double> expected = wholeSession.variable(name).toDoubles();
      Graph sharded;
      sharded.variable("copy", f32, {2, 3}, Initializer::copyOf(sharded.variable("w", f32, {2, 3}, initializers[k])));
      sharded.shardVariable(sharded.find("w"), 2, 3);
      sharded.shardVariable(sharded.find("copy"), 2, 3);
      Session shardSession(sharded);
      // The glorot and He scales come from the whole's fans, not the shard's.
      CHECK(shardSession.variable(name).toDoubles() == std::vector<double>(expected.begin() + 2, expected.begin() + 5));
    }
  }
}

TEST_CASE("initializers draw from the stated distributions") {
  Graph g;
  g.variable("u", f64, {20000}, Initializer::uniform(2, 4));
  g.variable("n", f64, {20000}, Initializer::normal(1, 0.5));
  g.variable("t", f64, {20000}, Initializer::truncatedNormal(1));
  g.variable("glorot", f64, {100, 200}, Initializer::glorotUniform());
  Session s(g);
  auto moments = [&](const char* name) {
    const std::vector<double> v = s.variable(name).toDoubles();
    double m = 0, m2 = 0, lo = v[0], hi = v[0];
    for (double x : v) {
      m += x;
      m2 += x * x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    m /= static_cast<double>(v.size());
    return std::array<double, 4>{m, std::sqrt(m2 / static_cast<double>(v.size()) - m * m), lo, hi};
  };
  auto u = moments("u");
  CHECK(u[0] == doctest::Approx(3).epsilon(0.01));
  CHECK(u[2] >= 2);
  CHECK(u[3] < 4);
  auto n = moments("n");
  CHECK(n[0] == doctest::Approx(1).epsilon(0.02));
  CHECK(n[1] == doctest::Approx(0.5).epsilon(0.02));
  auto t = moments("t");
  CHECK(t[2] >= -2);
  CHECK(t[3] <= 2);
  auto gl = moments("glorot");
  const double limit = std::sqrt(6.0 / 300.0);
  CHECK(gl[3] <= limit);
  CHECK(gl[1] == doctest::Approx(limit / std::sqrt(3.0)).epsilon(0.03));
}

TEST_CASE("feed errors name the placeholder and the shapes") {
  Graph g;
  Output x = g.placeholder("images", f32, {-1, 3});
  Output y = x * 2.0;
  Session s(g);
  CHECK_THROWS_WITH_AS(s.run({y}), doctest::Contains("placeholder 'images'"), Error);
  CHECK_THROWS_WITH_AS(s.run({y}, {{x, Tensor::zeros(f32, {2, 4})}}), doctest::Contains("[2, 4]"), Error);
  CHECK_THROWS_WITH_AS(s.run({y}, {{x, Tensor::zeros(f64, {2, 3})}}), doctest::Contains("f64"), Error);
}

TEST_CASE("the numerics check names the op that produced a NaN") {
  Graph g;
  Output x = g.placeholder("x", f32, {2});
  Output y = log(x);
  Session checked(g, {1, true});
  CHECK_THROWS_WITH_AS(checked.run({y}, {{x, Tensor::fromVector<float>({1, -1}, {2})}}), doctest::Contains("'Log'"),
                       Error);
  Session unchecked(g, {1, false});
  CHECK(std::isnan(unchecked.run({y}, {{x, Tensor::fromVector<float>({1, -1}, {2})}})[0].at(1)));
}

TEST_CASE("kernel errors carry the op and node name") {
  Graph g;
  auto scope = g.scope("embedding");
  Output table = g.variable("table", f32, {4, 2}, Initializer::zeros());
  Output ids = g.placeholder("ids", i64, {-1});
  Output rows = gather(table, ids);
  Session s(g);
  CHECK_THROWS_WITH_AS(s.run({rows}, {{ids, Tensor::fromVector<int64_t>({1, 9}, {2})}}),
                       doctest::Contains("node 'embedding/Gather'"), Error);
}

TEST_CASE("resetVariables restores initial values in place") {
  Graph g;
  Output w = g.variable("w", f32, {3}, Initializer::constant(1));
  Node* bump = assignAdd(w, g.constant(Tensor::full(f32, {3}, 1)));
  Output read = w * 1.0;
  Session s(g);
  s.run(bump);
  CHECK(s.variable("w").at(0) == 2);
  s.resetVariables();
  CHECK(s.run({read})[0].at(0) == 1);
}

TEST_CASE("setVariable checks shape and dtype") {
  Graph g;
  g.variable("w", f32, {3}, Initializer::zeros());
  Session s(g);
  s.setVariable("w", Tensor::full(f32, {3}, 5));
  CHECK(s.variable("w").at(2) == 5);
  CHECK_THROWS_AS(s.setVariable("w", Tensor::full(f32, {4}, 5)), Error);
  CHECK_THROWS_WITH_AS(s.setVariable("nope", Tensor::full(f32, {3}, 5)), doctest::Contains("'nope'"), Error);
}

TEST_CASE("a variable placed on a device without a backend is refused at plan time") {
  Graph g;
  Output y;
  {
    auto device = g.onDevice("cuda:0");
    y = g.constant(Tensor::zeros(f32, {2})) * 2.0;
  }
  Session s(g);
  CHECK_THROWS_WITH_AS(s.run({y}), doctest::Contains("cuda:0"), Error);
}

TEST_CASE("plans share one arena, sized for the largest") {
  Graph g;
  Output x = g.placeholder("x", f32, {-1});
  Output y = tanh(exp(x) * 2.0) + 1.0;
  Session s(g);
  const Tensor small = testing::randomTensor(f32, {1000}, 1), large = testing::randomTensor(f32, {100000}, 2);
  const Tensor a = s.run({y}, {{x, small}})[0];
  const Tensor b = s.run({y}, {{x, large}})[0];  // grows the arena; the small plan re-binds
  const Tensor c = s.run({y}, {{x, small}})[0];
  CHECK(a.toDoubles() == c.toDoubles());
  CHECK(s.cachedPlans() == 2);
  CHECK(b.at(99999) == doctest::Approx(std::tanh(std::exp(large.at(99999)) * 2.0) + 1.0).epsilon(1e-5));
}

TEST_CASE("profile times every op of a training step and leaves the variables as they were") {
  Graph g;
  const Output x = g.placeholder("x", f32, {-1, 3});
  const Output w = g.variable("w", f32, {3, 2}, Initializer::constant(0.5));
  const Output loss = mean(square(matmul(x, w)));
  Node* step = optim::SGD(0.1).minimize(loss);
  Session s(g);
  const FeedMap feeds{{x, Tensor::full(f32, {4, 3}, 1.0)}};
  const std::unordered_map<const Node*, double> seconds = s.profile({loss}, feeds, {step}, 2);
  CHECK(seconds.count(loss.node()) == 1);
  CHECK(seconds.size() > 5);  // the forward, backward and update ops
  for (const auto& [node, t] : seconds) CHECK(t >= 0);
  CHECK(s.variable("w").toDoubles() == std::vector<double>(6, 0.5));
  CHECK(s.variable("global_step").item() == 0);
}

TEST_CASE("a traced op records the bytes of its inputs and outputs, and a view of its input none") {
  Graph g;
  Output x = g.placeholder("x", f32, {3, 4});
  Output sum = x + x;                      // two 48-byte inputs and a 48-byte output
  Output flat = reshape(sum, {12});        // a view of its input: moves nothing
  Output wide = cast(flat, f64);           // 48 bytes in, 96 out
  Session s(g);
  startTracing();
  s.run({wide}, {{x, Tensor::zeros(f32, {3, 4})}});
  const nlohmann::json trace = nlohmann::json::parse(traceEventsJson(0, "test"));
  stopTracing();
  std::map<std::string, int64_t> bytes;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") bytes[e["cat"].get<std::string>()] = e["args"]["bytes"].get<int64_t>();
  }
  CHECK(bytes.at("Add") == 3 * 48);
  CHECK(bytes.at("Reshape") == 0);
  CHECK(bytes.at("Cast") == 48 + 96);
}
