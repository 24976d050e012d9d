// Matrix products on a GPU through weft's MatMul op against cuBLAS called directly on the same
// operands, for the target "weft's GEMM reaches at least 90% of cuBLAS".
//
//     bench_gpu_gemm [REPS]        (default 20; needs a GPU)
//
// Each measurement runs kChain independent products of A (m x k) and B (k x n), row-major: weft as
// one Session run of a graph holding kChain MatMul nodes (one launch sequence and the run's final
// synchronisation), cuBLAS as kChain calls on one stream followed by one synchronisation. So both
// pay one host round trip per kChain products and the ratio compares the products themselves
// plus weft's per-op dispatch. f32 runs with TF32 off (weft's default) and on (allowTF32 against
// CUBLAS_TF32_TENSOR_OP_MATH); bf16 accumulates in f32 on both sides (cublasGemmEx,
// CUBLAS_COMPUTE_32F). Prints one JSON line per shape and type: both sides' medians over REPS
// measurements, their TFLOP/s and weft / cuBLAS.
#include "tools/bench/BenchUtil.h"

#include "core/Half.h"
#include "core/Session.h"
#include "ops/Ops.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace weft;

namespace {

constexpr int kChain = 10;

struct GemmShape {
  const char* name;
  int64_t m, n, k;
};

// Squares, and the LM's two largest products per step (time steps x batch rows against the
// LSTM's gate weights; rows against the sampled softmax's candidates).
const GemmShape kShapes[] = {{"square_1024", 1024, 1024, 1024},
                             {"square_4096", 4096, 4096, 4096},
                             {"square_8192", 8192, 8192, 8192},
                             {"lm_gates", 1408, 1024, 128},
                             {"lm_candidates", 1408, 1024, 256}};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cublasGetStatusString(s));
}

/// Seconds per kChain products through weft: a graph of kChain MatMul nodes on cuda:0.
bench::Timing timeWeft(const GemmShape& s, DType type, bool tf32, int reps) {
  allowTF32(tf32);
  Graph g;
  auto placed = g.onDevice("cuda:0");
  const Output a = g.variable("a", type, {s.m, s.k}, Initializer::uniform(-1, 1), false);
  const Output b = g.variable("b", type, {s.k, s.n}, Initializer::uniform(-1, 1), false);
  std::vector<Node*> products;
  for (int i = 0; i < kChain; ++i) products.push_back(matmul(a, b).node());
  Node* all = g.group(products, "products");
  Session session(g);
  return bench::time([&] { session.run(all); }, 3, reps);
}

/// Fills `count` elements of `type` (f32 or bf16) at device address `to` with values uniform in
/// [-1, 1), as weft's Initializer::uniform(-1, 1) draws its operands.
void uploadUniform(void* to, int64_t count, DType type, unsigned seed) {
  std::mt19937 draw(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  if (type == f32) {
    std::vector<float> host(static_cast<size_t>(count));
    for (float& v : host) v = uniform(draw);
    check(cudaMemcpy(to, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  } else {
    std::vector<BFloat16> host(static_cast<size_t>(count));
    for (BFloat16& v : host) v = BFloat16(uniform(draw));
    check(cudaMemcpy(to, host.data(), host.size() * sizeof(BFloat16), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
}

/// Seconds per kChain products through cuBLAS directly, on operands of the same size and kind.
bench::Timing timeCublas(const GemmShape& s, DType type, bool tf32, int reps) {
  const size_t element = type == f32 ? 4 : 2;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  check(cudaMalloc(&a, static_cast<size_t>(s.m * s.k) * element), "cudaMalloc");
  check(cudaMalloc(&b, static_cast<size_t>(s.k * s.n) * element), "cudaMalloc");
  check(cudaMalloc(&c, static_cast<size_t>(s.m * s.n) * element), "cudaMalloc");
  // Values drawn as weft's operands are: a large product's speed depends on its data (a GPU
  // held at its power limit clocks higher on constant operands, whose bits rarely toggle).
  uploadUniform(a, s.m * s.k, type, 1);
  uploadUniform(b, s.k * s.n, type, 2);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cublasHandle_t h = nullptr;
  check(cublasCreate(&h), "cublasCreate");
  check(cublasSetStream(h, stream), "cublasSetStream");
  check(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  const float one = 1, zero = 0;
  // Row-major C = A B is column-major C^T = B^T A^T.
  auto products = [&] {
    for (int i = 0; i < kChain; ++i) {
      if (type == f32) {
        check(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, static_cast<const float*>(b), n,
                          static_cast<const float*>(a), k, &zero, static_cast<float*>(c), n),
              "cublasSgemm");
      } else {
        check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b, CUDA_R_16BF, n, a, CUDA_R_16BF, k, &zero, c,
                           CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
      }
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  };
  const bench::Timing t = bench::time(products, 3, reps);
  cublasDestroy(h);
  cudaStreamDestroy(stream);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  if (reps < 1) {
    std::fprintf(stderr, "usage: %s [REPS]   (REPS positive)\n", argv[0]);
    return 2;
  }
  if (cudaDeviceCount() == 0) {
    std::fprintf(stderr, "bench_gpu_gemm: no GPU: %s\n", cudaUnavailableReason().c_str());
    return 1;
  }
  struct Variant {
    const char* name;
    DType type;
    bool tf32;
  };
  const Variant variants[] = {{"f32", f32, false}, {"tf32", f32, true}, {"bf16", bf16, false}};
  try {
    for (const GemmShape& s : kShapes) {
      for (const Variant& v : variants) {
        const bench::Timing w = timeWeft(s, v.type, v.tf32, reps), c = timeCublas(s, v.type, v.tf32, reps);
        const double flops = 2.0 * static_cast<double>(s.m * s.n * s.k) * kChain;
        std::printf(
            "{\"bench\": \"%s\", \"type\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"weft_ms\": %.4f, "
            "\"cublas_ms\": %.4f, \"weft_tflops\": %.1f, \"cublas_tflops\": %.1f, \"weft_over_cublas\": %.3f}\n",
            s.name, v.name, static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
            w.median * 1e3 / kChain, c.median * 1e3 / kChain, flops / w.median / 1e12, flops / c.median / 1e12,
            c.median / w.median);
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
