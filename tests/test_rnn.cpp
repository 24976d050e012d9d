// Tests of the fused recurrent ops (LSTM, GRUCell): forward against naive double references,
// gradients against finite differences, shape errors.
#include "ops/Ops.h"
#include "tests/TestUtil.h"

#include <array>
#include <cmath>

using namespace weft;
using weft::testing::randomTensor;
using weft::testing::toleranceFor;

namespace {

double sigmoidRef(double v) { return 1 / (1 + std::exp(-v)); }

struct LstmRef {
  std::vector<double> y, h, c;
};

/// The LSTM by definition, one batch row and one gate unit at a time.
LstmRef lstmReference(const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& wx, const Tensor& wh,
                      const Tensor& b) {
  const int64_t steps = x.shape()[0], batch = x.shape()[1], in = x.shape()[2], hid = h0.shape()[1];
  const auto X = x.toDoubles(), WX = wx.toDoubles(), WH = wh.toDoubles(), B = b.toDoubles();
  LstmRef r{{}, h0.toDoubles(), c0.toDoubles()};
  std::vector<double> a(static_cast<size_t>(4 * hid));
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t n = 0; n < batch; ++n) {
      for (int64_t k = 0; k < 4 * hid; ++k) {
        double s = B[k];
        for (int64_t i = 0; i < in; ++i) s += X[(t * batch + n) * in + i] * WX[i * 4 * hid + k];
        for (int64_t j = 0; j < hid; ++j) s += r.h[n * hid + j] * WH[j * 4 * hid + k];
        a[k] = s;
      }
      for (int64_t j = 0; j < hid; ++j) {
        const double ig = sigmoidRef(a[j]), fg = sigmoidRef(a[hid + j]), gg = std::tanh(a[2 * hid + j]),
                     og = sigmoidRef(a[3 * hid + j]);
        double& c = r.c[n * hid + j];
        c = fg * c + ig * gg;
        r.h[n * hid + j] = og * std::tanh(c);
      }
    }
    r.y.insert(r.y.end(), r.h.begin(), r.h.end());
  }
  return r;
}

/// One GRU step by definition.
std::vector<double> gruReference(const Tensor& x, const Tensor& h, const Tensor& wx, const Tensor& wh,
                                 const Tensor& bx, const Tensor& bh) {
  const int64_t batch = x.shape()[0], in = x.shape()[1], hid = h.shape()[1];
  const auto X = x.toDoubles(), H = h.toDoubles(), WX = wx.toDoubles(), WH = wh.toDoubles(),
             BX = bx.toDoubles(), BH = bh.toDoubles();
  std::vector<double> out(static_cast<size_t>(batch * hid));
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t j = 0; j < hid; ++j) {
      double ax[3], ah[3];
      for (int g = 0; g < 3; ++g) {
        const int64_t k = g * hid + j;
        ax[g] = BX[k];
        ah[g] = BH[k];
        for (int64_t i = 0; i < in; ++i) ax[g] += X[n * in + i] * WX[i * 3 * hid + k];
        for (int64_t i = 0; i < hid; ++i) ah[g] += H[n * hid + i] * WH[i * 3 * hid + k];
      }
      const double r = sigmoidRef(ax[0] + ah[0]), z = sigmoidRef(ax[1] + ah[1]), nn = std::tanh(ax[2] + r * ah[2]);
      out[n * hid + j] = (1 - z) * nn + z * H[n * hid + j];
    }
  }
  return out;
}

struct LstmGraph {
  Output x, h0, c0, wx, wh, b;
  LstmOutputs out;
  FeedMap feeds;
  std::vector<Tensor> values;  // x, h0, c0, wx, wh, b
};

LstmGraph buildLstm(Graph& g, DType dt, int64_t steps, int64_t batch, int64_t in, int64_t hid, uint64_t seed = 1) {
  LstmGraph l;
  const std::vector<Shape> shapes{{steps, batch, in}, {batch, hid},   {batch, hid},
                                  {in, 4 * hid},      {hid, 4 * hid}, {4 * hid}};
  const char* names[] = {"x", "h0", "c0", "wx", "wh", "b"};
  std::vector<Output> ph;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ph.push_back(g.placeholder(names[i], dt, shapes[i]));
    l.values.push_back(randomTensor(dt, shapes[i], seed + i));
    l.feeds.push_back({ph.back(), l.values.back()});
  }
  l.x = ph[0], l.h0 = ph[1], l.c0 = ph[2], l.wx = ph[3], l.wh = ph[4], l.b = ph[5];
  l.out = lstm(l.x, l.h0, l.c0, l.wx, l.wh, l.b);
  return l;
}

struct GruGraph {
  std::vector<Output> inputs;  // x, h, wx, wh, bx, bh
  Output y;
  FeedMap feeds;
  std::vector<Tensor> values;
};

GruGraph buildGru(Graph& g, DType dt, int64_t batch, int64_t in, int64_t hid, uint64_t seed = 1) {
  GruGraph r;
  const std::vector<Shape> shapes{{batch, in}, {batch, hid}, {in, 3 * hid}, {hid, 3 * hid}, {3 * hid}, {3 * hid}};
  const char* names[] = {"x", "h", "wx", "wh", "bx", "bh"};
  for (size_t i = 0; i < shapes.size(); ++i) {
    r.inputs.push_back(g.placeholder(names[i], dt, shapes[i]));
    r.values.push_back(randomTensor(dt, shapes[i], seed + i));
    r.feeds.push_back({r.inputs.back(), r.values.back()});
  }
  const auto& p = r.inputs;
  r.y = gruCell(p[0], p[1], p[2], p[3], p[4], p[5]);
  return r;
}

struct Dims {
  int64_t steps, batch, in, hid;
};

void checkLstmForward(DType dt, Dims d) {
  CAPTURE(d.steps);
  CAPTURE(d.batch);
  CAPTURE(d.in);
  CAPTURE(d.hid);
  Graph g;
  LstmGraph l = buildLstm(g, dt, d.steps, d.batch, d.in, d.hid);
  Session s(g, {.threads = 2});
  const auto got = s.run({l.out.y, l.out.hLast, l.out.cLast}, l.feeds);
  const auto& v = l.values;
  const LstmRef ref = lstmReference(v[0], v[1], v[2], v[3], v[4], v[5]);
  CHECK(got[0].shape() == Shape{d.steps, d.batch, d.hid});
  CHECK_CLOSE(got[0], ref.y, toleranceFor(dt));
  CHECK_CLOSE(got[1], ref.h, toleranceFor(dt));
  CHECK_CLOSE(got[2], ref.c, toleranceFor(dt));
}

/// The graph's one node of `op`.
Node* onlyNode(const Graph& g, const std::string& op) {
  std::vector<Node*> found;
  for (const auto& n : g.nodes())
    if (n->op == op) found.push_back(n.get());
  REQUIRE(found.size() == 1);
  return found.front();
}

/// `halves`, the outputs of a fused gradient's two halves in the fused op's order, equal the
/// fused op's outputs bit for bit.
void checkSameBits(Graph& g, const FeedMap& feeds, Node* fused, const std::vector<Output>& halves) {
  std::vector<Output> fetches = halves;
  for (size_t i = 0; i < fused->outputs.size(); ++i) fetches.push_back(fused->output(static_cast<int>(i)));
  REQUIRE(fetches.size() == 2 * halves.size());
  Session s(g, {.threads = 2});
  const std::vector<Tensor> got = s.run(fetches, feeds);
  for (size_t i = 0; i < halves.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].shape() == got[halves.size() + i].shape());
    CHECK(got[i].toDoubles() == got[halves.size() + i].toDoubles());
  }
}

const std::vector<Dims> kForwardDims{{4, 3, 5, 6}, {1, 2, 3, 4}, {3, 1, 2, 5}, {1, 1, 1, 1}, {5, 20, 24, 40}};

}  // namespace

TEST_CASE("LSTM forward matches the reference") {
  for (DType dt : {f32, f64}) {
    SUBCASE(dtypeName(dt)) {
      for (const Dims& d : kForwardDims) checkLstmForward(dt, d);
    }
  }
}

TEST_CASE("LSTM over an empty sequence returns the initial state") {
  Graph g;
  LstmGraph l = buildLstm(g, f64, 0, 2, 3, 4);
  Session s(g);
  const auto got = s.run({l.out.y, l.out.hLast, l.out.cLast}, l.feeds);
  CHECK(got[0].shape() == Shape{0, 2, 4});
  CHECK_CLOSE(got[1], l.values[1].toDoubles(), 0);
  CHECK_CLOSE(got[2], l.values[2].toDoubles(), 0);
}

TEST_CASE("LSTM infers the output shape with unknown dimensions") {
  Graph g;
  auto x = g.placeholder("x", f32, {-1, -1, 3});
  auto h0 = g.placeholder("h0", f32, {-1, -1});
  auto c0 = g.placeholder("c0", f32, {-1, -1});
  auto wx = g.placeholder("wx", f32, {3, 8});
  auto wh = g.placeholder("wh", f32, {-1, -1});
  auto b = g.placeholder("b", f32, {-1});
  LstmOutputs o = lstm(x, h0, c0, wx, wh, b);
  CHECK(o.y.shape() == Shape{-1, -1, 2});
  CHECK(o.hLast.shape() == Shape{-1, 2});
  CHECK(o.cLast.shape() == Shape{-1, 2});
}

TEST_CASE("LSTM gradients match finite differences") {
  Graph g;
  LstmGraph l = buildLstm(g, f64, 3, 2, 3, 2);
  const std::vector<Output> xs{l.x, l.h0, l.c0, l.wx, l.wh, l.b};
  SUBCASE("y only") { CHECK_GRADIENTS(checkGradients(g, l.out.y, xs, l.feeds)); }
  SUBCASE("hLast only") { CHECK_GRADIENTS(checkGradients(g, l.out.hLast, xs, l.feeds)); }
  SUBCASE("cLast only") { CHECK_GRADIENTS(checkGradients(g, l.out.cLast, xs, l.feeds)); }
  SUBCASE("all outputs") {
    Output loss = sum(l.out.y * l.out.y) + sum(l.out.hLast * l.out.cLast);
    CHECK_GRADIENTS(checkGradients(g, loss, xs, l.feeds));
  }
}

TEST_CASE("LSTM gradients with a single step and batch row") {
  Graph g;
  LstmGraph l = buildLstm(g, f64, 1, 1, 2, 3, 11);
  Output loss = sum(l.out.y) + sum(l.out.cLast * l.out.cLast);
  CHECK_GRADIENTS(checkGradients(g, loss, {l.x, l.h0, l.c0, l.wx, l.wh, l.b}, l.feeds));
}

TEST_CASE("LSTMInputGrad and LSTMWeightGrad give LSTMGrad's six outputs, bit for bit") {
  for (DType dt : {f32, f64}) {
    for (const Dims d : std::vector<Dims>{{4, 3, 5, 6}, {1, 1, 1, 1}, {0, 2, 3, 4}, {6, 20, 24, 40}}) {
      CAPTURE(dtypeName(dt));
      CAPTURE(d.steps);
      Graph g;
      LstmGraph l = buildLstm(g, dt, d.steps, d.batch, d.in, d.hid);
      const Output loss = sum(l.out.y * l.out.y) + sum(l.out.hLast * l.out.cLast);
      gradients(loss, {l.x, l.h0, l.c0, l.wx, l.wh, l.b});
      Node* fused = onlyNode(g, "LSTMGrad");
      const std::vector<Output>& in = fused->inputs;
      Node* input = g.addNode("LSTMInputGrad", in, fused->attrs);
      Node* weights = g.addNode("LSTMWeightGrad", {in[0], in[1], in[7], input->output(3)}, fused->attrs);
      CHECK(input->output(3).shape() == Shape{d.steps, d.batch, 4 * d.hid});
      checkSameBits(g, l.feeds, fused,
                    {input->output(0), input->output(1), input->output(2), weights->output(0), weights->output(1),
                     weights->output(2)});
    }
  }
}

TEST_CASE("GRUCellInputGrad and GRUCellWeightGrad give GRUCellGrad's six outputs, bit for bit") {
  for (DType dt : {f32, f64}) {
    for (const Dims d : std::vector<Dims>{{1, 3, 5, 6}, {1, 1, 1, 1}, {1, 20, 24, 40}}) {
      CAPTURE(dtypeName(dt));
      CAPTURE(d.batch);
      Graph g;
      GruGraph r = buildGru(g, dt, d.batch, d.in, d.hid);
      gradients(sum(r.y * r.y), r.inputs);
      Node* fused = onlyNode(g, "GRUCellGrad");
      const std::vector<Output>& in = fused->inputs;
      Node* input = g.addNode("GRUCellInputGrad", in, fused->attrs);
      Node* weights =
          g.addNode("GRUCellWeightGrad", {in[0], in[1], input->output(2), input->output(3)}, fused->attrs);
      checkSameBits(g, r.feeds, fused,
                    {input->output(0), input->output(1), weights->output(0), weights->output(1), weights->output(2),
                     weights->output(3)});
    }
  }
}

TEST_CASE("LSTMWeightGrad refuses gate gradients that do not fit its sequence") {
  Graph g;
  LstmGraph l = buildLstm(g, f32, 3, 2, 3, 4);
  const Output badGates = g.placeholder("dG", f32, {3, 2, 12});
  CHECK_THROWS_WITH_AS(g.addNode("LSTMWeightGrad", {l.x, l.h0, l.out.y, badGates}), doctest::Contains("do not fit"),
                       weft::Error);
}

TEST_CASE("LSTM rejects mismatched shapes") {
  Graph g;
  auto ph = [&](const char* name, Shape s) { return g.placeholder(name, f32, std::move(s)); };
  auto x = ph("x", {3, 2, 3});
  auto h0 = ph("h0", {2, 4}), c0 = ph("c0", {2, 4});
  auto wx = ph("wx", {3, 16}), wh = ph("wh", {4, 16}), b = ph("b", {16});
  SUBCASE("wx not (I, 4H)") {
    CHECK_THROWS_WITH_AS(lstm(x, h0, c0, ph("wxBad", {4, 16}), wh, b), doctest::Contains("LSTM"), weft::Error);
    CHECK_THROWS_WITH_AS(lstm(x, h0, c0, ph("wxBad2", {3, 12}), wh, b), doctest::Contains("wx must be (I, 4H)"),
                         weft::Error);
    CHECK_THROWS_WITH_AS(lstm(x, h0, c0, ph("wxBad3", {3, 16, 1}), wh, b), doctest::Contains("wx must have rank 2"),
                         weft::Error);
  }
  SUBCASE("h0 batch mismatch") {
    CHECK_THROWS_WITH_AS(lstm(x, ph("h0Bad", {5, 4}), c0, wx, wh, b), doctest::Contains("h0 must be (B, H)"),
                         weft::Error);
  }
  SUBCASE("bias not 4H") {
    CHECK_THROWS_WITH_AS(lstm(x, h0, c0, wx, wh, ph("bBad", {15})), doctest::Contains("LSTM"), weft::Error);
  }
  SUBCASE("x not rank 3") {
    CHECK_THROWS_WITH_AS(lstm(ph("x2", {2, 3}), h0, c0, wx, wh, b), doctest::Contains("x must have rank 3"),
                         weft::Error);
  }
  SUBCASE("dtype mismatch") {
    auto h64 = g.placeholder("h64", f64, {2, 4});
    CHECK_THROWS_WITH_AS(lstm(x, h64, c0, wx, wh, b), doctest::Contains("LSTM"), weft::Error);
  }
}

TEST_CASE("GRUCell forward matches the reference") {
  const std::vector<std::array<int64_t, 3>> dims{{3, 4, 5}, {1, 1, 1}, {2, 3, 1}, {1, 5, 2}, {24, 20, 40}};
  for (DType dt : {f32, f64}) {
    SUBCASE(dtypeName(dt)) {
      for (const auto& [batch, in, hid] : dims) {
        CAPTURE(batch);
        CAPTURE(in);
        CAPTURE(hid);
        Graph g;
        GruGraph r = buildGru(g, dt, batch, in, hid);
        const auto& v = r.values;
        const Tensor got = weft::testing::evaluate(g, r.y, r.feeds, 2);
        CHECK(got.shape() == Shape{batch, hid});
        CHECK_CLOSE(got, gruReference(v[0], v[1], v[2], v[3], v[4], v[5]), toleranceFor(dt));
      }
    }
  }
}

TEST_CASE("GRUCell gradients match finite differences") {
  Graph g;
  SUBCASE("batch 2") {
    GruGraph r = buildGru(g, f64, 2, 3, 2);
    CHECK_GRADIENTS(checkGradients(g, r.y, r.inputs, r.feeds));
  }
  SUBCASE("batch 1, hidden 1") {
    GruGraph r = buildGru(g, f64, 1, 2, 1, 5);
    CHECK_GRADIENTS(checkGradients(g, r.y, r.inputs, r.feeds));
  }
  SUBCASE("two chained steps") {
    GruGraph r = buildGru(g, f64, 2, 2, 3, 9);
    const auto& p = r.inputs;
    Output h2 = gruCell(p[0], r.y, p[2], p[3], p[4], p[5]);
    CHECK_GRADIENTS(checkGradients(g, h2, r.inputs, r.feeds));
  }
}

TEST_CASE("GRUCell rejects mismatched shapes") {
  Graph g;
  auto ph = [&](const char* name, Shape s) { return g.placeholder(name, f32, std::move(s)); };
  auto x = ph("x", {2, 3}), h = ph("h", {2, 4});
  auto wx = ph("wx", {3, 12}), wh = ph("wh", {4, 12}), bx = ph("bx", {12}), bh = ph("bh", {12});
  SUBCASE("wx not (I, 3H)") {
    CHECK_THROWS_WITH_AS(gruCell(x, h, ph("wxBad", {3, 8}), wh, bx, bh), doctest::Contains("GRUCell"), weft::Error);
  }
  SUBCASE("h batch mismatch") {
    CHECK_THROWS_WITH_AS(gruCell(x, ph("hBad", {3, 4}), wx, wh, bx, bh), doctest::Contains("h must be (B, H)"),
                         weft::Error);
  }
  SUBCASE("bh not 3H") {
    CHECK_THROWS_WITH_AS(gruCell(x, h, wx, wh, bx, ph("bhBad", {9})), doctest::Contains("bh must be (3H)"),
                         weft::Error);
  }
}
