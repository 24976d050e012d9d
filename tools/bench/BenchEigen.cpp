// Eigen's own GEMM, called directly, as the reference next to weft's MatMul. Eigen parallelises
// GEMM with OpenMP; it lives in its own binary because a loaded OpenMP runtime slows other
// threads' work in the same process.
#include "tools/bench/BenchUtil.h"

#include <Eigen/Core>

#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  Eigen::setNbThreads(threads);
  for (int64_t n : bench::kGemmSizes) {
    Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
    const auto t = bench::time([&] { c.noalias() = a * b; }, 3, 20);
    bench::report("gemm_" + std::to_string(n), "eigen", t, "gflops",
                  2.0 * static_cast<double>(n * n * n) / t.median / 1e9);
  }
}
