// The partition search on synthetic timing curves t(P) = theta0 + theta1 / P + theta2 * P: the
// least-squares fit, the order of the samples (double from the machines while faster, then halve
// while faster) and the choice, compared with the true minimum found by brute force.
#include "tests/TestUtil.h"

#include "dist/launch/PartitionSearch.h"

#include <cmath>
#include <functional>
#include <vector>

using namespace weft;
using namespace weft::dist;

namespace {

/// Runs a search to its end on `curve`; returns the counts in the order they were sampled.
std::vector<int> runSearch(PartitionSearch& search, const std::function<double(int)>& curve, int rows = 1 << 30) {
  std::vector<int> order;
  while (search.next()) {
    const int p = *search.next();
    order.push_back(p);
    search.record(curve(std::min(p, rows)), std::min(p, rows));
  }
  return order;
}

/// The integer P in [1, most] with the least true time.
int bruteForceBest(const PartitionModel& truth, int most) {
  int best = 1;
  for (int p = 2; p <= most; ++p)
    if (truth.predict(p) < truth.predict(best)) best = p;
  return best;
}

}  // namespace

TEST_CASE("the fit recovers the parameters of a noiseless curve") {
  const PartitionModel truth{0.05, 0.8, 0.002};
  std::vector<PartitionSample> samples;
  for (int p : {2, 4, 8, 16, 32}) samples.push_back({p, truth.predict(p)});
  const PartitionModel fit = fitPartitionModel(samples);
  CHECK(fit.theta0 == doctest::Approx(0.05).epsilon(1e-9));
  CHECK(fit.theta1 == doctest::Approx(0.8).epsilon(1e-9));
  CHECK(fit.theta2 == doctest::Approx(0.002).epsilon(1e-9));
}

TEST_CASE("the fit is the least-squares one when the samples are noisy") {
  // Four samples, three parameters: the residual is orthogonal to every basis function.
  const std::vector<PartitionSample> samples{{1, 1.0}, {2, 0.7}, {4, 0.62}, {8, 0.69}};
  const PartitionModel fit = fitPartitionModel(samples);
  double r1 = 0, rInv = 0, rP = 0;
  for (const PartitionSample& s : samples) {
    const double r = s.seconds - fit.predict(s.partitions);
    r1 += r;
    rInv += r / s.partitions;
    rP += r * s.partitions;
  }
  CHECK(std::abs(r1) < 1e-12);
  CHECK(std::abs(rInv) < 1e-12);
  CHECK(std::abs(rP) < 1e-12);
}

TEST_CASE("the fit refuses fewer than three partition counts, naming how many") {
  CHECK_THROWS_WITH_AS(fitPartitionModel({{2, 1.0}, {2, 1.1}, {4, 0.9}}),
                       doctest::Contains("at least 3 partition counts, not 2"), Error);
}

TEST_CASE("samples double from the machine count while faster, then halve from it while faster") {
  // Minimum at sqrt(0.8 / 0.002) = 20.
  const PartitionModel truth{0.05, 0.8, 0.002};
  PartitionSearch search(4, 1024);
  const std::vector<int> order = runSearch(search, [&](int p) { return truth.predict(p); });
  // 4 -> 8 -> 16 faster, 32 slower: down from 4, where 2 is slower already.
  CHECK(order == std::vector<int>{4, 8, 16, 32, 2});
  const PartitionSearch::Choice choice = search.choose();
  CHECK(choice.partitions == 20);
  REQUIRE(choice.model.has_value());
  CHECK(choice.model->theta1 == doctest::Approx(0.8).epsilon(1e-9));
}

TEST_CASE("a curve that only rises with P is searched downwards to one partition") {
  const PartitionModel truth{0.1, 0.001, 0.01};
  PartitionSearch search(4, 1024);
  CHECK(runSearch(search, [&](int p) { return truth.predict(p); }) == std::vector<int>{4, 8, 2, 1});
  CHECK(search.choose().partitions == 1);
}

TEST_CASE("a curve that only falls is searched up to the most partitions allowed") {
  const PartitionModel truth{0.1, 1.0, 0.0};
  PartitionSearch search(2, 16);
  CHECK(runSearch(search, [&](int p) { return truth.predict(p); }) == std::vector<int>{2, 4, 8, 16, 1});
  CHECK(search.choose().partitions == 16);
}

TEST_CASE("doubling stops once the job's variables have no more rows to split") {
  const PartitionModel truth{0.1, 1.0, 0.0};
  PartitionSearch search(1, 1024);
  // Every variable has at most 6 rows: asking for 8 runs 6 partitions.
  CHECK(runSearch(search, [&](int p) { return truth.predict(p); }, 6) == std::vector<int>{1, 2, 4, 8});
  CHECK(search.samples().back().partitions == 6);
  CHECK(search.choose().partitions == 6);
}

TEST_CASE("with fewer than three counts sampled the fastest sample is chosen") {
  PartitionSearch search(1, 1024);
  CHECK(runSearch(search, [](int p) { return p == 1 ? 0.2 : 0.3; }) == std::vector<int>{1, 2});
  const PartitionSearch::Choice choice = search.choose();
  CHECK(choice.partitions == 1);
  CHECK_FALSE(choice.model.has_value());
  CHECK(choice.reason.find("too few to fit") != std::string::npos);
}

TEST_CASE("an ended search takes no more samples, and nothing sampled is nothing to choose") {
  PartitionSearch search(2, 64);
  search.stop();
  CHECK_FALSE(search.next().has_value());
  CHECK_THROWS_WITH_AS(search.record(1.0, 2), doctest::Contains("after the search ended"), Error);
  CHECK_THROWS_WITH_AS(search.choose(), doctest::Contains("no partition count was sampled"), Error);
}

TEST_CASE("on noisy curves the choice is within a few percent of the brute-force best") {
  // Deterministic multiplicative noise of up to +-3% per sample, as run-to-run jitter would give.
  uint64_t state = 12345;
  auto noise = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return 1.0 + 0.06 * (static_cast<double>(state >> 11) / 9007199254740992.0 - 0.5);
  };
  const std::vector<PartitionModel> curves{
      {0.05, 0.8, 0.002}, {0.2, 3.0, 0.0005}, {0.02, 0.1, 0.003}, {0.5, 10.0, 0.01}, {0.1, 0.05, 0.0001}};
  for (const PartitionModel& truth : curves) {
    for (int machines : {1, 2, 8}) {
      CAPTURE(truth.theta1);
      CAPTURE(machines);
      PartitionSearch search(machines, 512);
      runSearch(search, [&](int p) { return truth.predict(p) * noise(); });
      const int chosen = search.choose().partitions;
      const double best = truth.predict(bruteForceBest(truth, 512));
      CHECK(truth.predict(chosen) <= best * 1.05);
    }
  }
}
