// Tests of the CPU matrix product under every op (ops/Blas.h): f32 and f64 against a naive double
// reference across the register tile's and the cache blocks' edges, every transpose, beta, and
// stored rows longer than the operands; and the same bits however the pool cuts the product. The
// bf16 products (AMX tiles or AVX512_BF16, whichever runs here) against the double product of
// their rounded operands.
#include "core/ThreadPool.h"
#include "ops/Blas.h"
#include "ops/OwnSgemm.h"
#include "tests/TestUtil.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace weft;

namespace {

struct Product {
  bool ta, tb;
  int64_t m, n, k;
  int64_t pad = 0;  // extra elements at the end of every stored row
};

/// A stored operand of `rows` x `cols` with `ld` elements a row, uniform in [-1, 1).
template <class T>
std::vector<T> randomMatrix(int64_t rows, int64_t ld, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<T> v(static_cast<size_t>(rows * ld));
  for (T& x : v) x = static_cast<T>(u(rng));
  return v;
}

template <class T>
struct Operands {
  int64_t lda, ldb, ldc;
  std::vector<T> a, b, c;
};

template <class T>
Operands<T> operands(const Product& p) {
  Operands<T> o;
  o.lda = (p.ta ? p.m : p.k) + p.pad;
  o.ldb = (p.tb ? p.k : p.n) + p.pad;
  o.ldc = p.n + p.pad;
  o.a = randomMatrix<T>(p.ta ? p.k : p.m, o.lda, 1);
  o.b = randomMatrix<T>(p.tb ? p.n : p.k, o.ldb, 2);
  o.c = randomMatrix<T>(p.m, o.ldc, 3);
  return o;
}

/// Checks gemm's C against sum_k op(A) op(B) + beta C0 in double, and that the padding of
/// every row of C is untouched.
template <class T>
void checkAgainstReference(const Product& p, T beta, bool nanInC) {
  Operands<T> o = operands<T>(p);
  std::vector<T> c = o.c;
  if (nanInC) {
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.n; ++j) c[static_cast<size_t>(i * o.ldc + j)] = std::numeric_limits<T>::quiet_NaN();
  }
  blas::gemm<T>(p.ta, p.tb, p.m, p.n, p.k, o.a.data(), o.lda, o.b.data(), o.ldb, beta, c.data(), o.ldc);
  const double eps = std::numeric_limits<T>::epsilon();
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t q = 0; q < p.k; ++q) {
        const double x = o.a[static_cast<size_t>(p.ta ? q * o.lda + i : i * o.lda + q)];
        const double y = o.b[static_cast<size_t>(p.tb ? j * o.ldb + q : q * o.ldb + j)];
        sum += x * y;
        magnitude += std::abs(x * y);
      }
      const double c0 = o.c[static_cast<size_t>(i * o.ldc + j)];
      if (beta != T(0)) {
        sum += static_cast<double>(beta) * c0;
        magnitude += std::abs(static_cast<double>(beta) * c0);
      }
      const double got = c[static_cast<size_t>(i * o.ldc + j)];
      if (!(std::abs(got - sum) <= 2 * eps * (static_cast<double>(p.k) + 2) * (magnitude + 1e-30))) {
        FAIL_CHECK("C[" << i << ", " << j << "] = " << got << ", expected " << sum);
        return;
      }
    }
    for (int64_t j = p.n; j < o.ldc; ++j)
      REQUIRE(c[static_cast<size_t>(i * o.ldc + j)] == o.c[static_cast<size_t>(i * o.ldc + j)]);
  }
}

// Around the f32 kernels' register tiles (AVX-512: 12 x 32; AVX2: 6 x 16), their depth block
// (256), their row blocks (120; 96), their column panel (1024) and the widest B with A read in
// place (64; 32); and the small and skinny shapes of the models' backward passes.
const std::vector<Product> kShapes = {
    {false, false, 1, 1, 1},       {false, false, 11, 31, 7},    {false, false, 12, 32, 256},
    {false, false, 13, 33, 257},   {false, false, 121, 17, 300}, {false, false, 25, 1030, 40},
    {false, false, 130, 70, 520},  {false, false, 3, 500, 2},    {false, false, 500, 3, 90},
    {false, false, 37, 45, 53, 5}, {false, false, 40, 64, 300},  {false, false, 41, 65, 300},
    {false, false, 6, 16, 256},    {false, false, 7, 17, 9},     {false, false, 9, 33, 20},
    {false, false, 97, 48, 258}};

/// Calls check(p) for every shape of kShapes with every transpose of A and B.
template <class F>
void forEveryTranspose(F check) {
  for (Product p : kShapes) {
    for (const auto& [ta, tb] : {std::pair{false, false}, {false, true}, {true, false}, {true, true}}) {
      p.ta = ta;
      p.tb = tb;
      CAPTURE(p.ta);
      CAPTURE(p.tb);
      CAPTURE(p.m);
      CAPTURE(p.n);
      CAPTURE(p.k);
      CAPTURE(p.pad);
      check(p);
    }
  }
}

template <class T>
void checkEveryTranspose(T beta, bool nanInC) {
  forEveryTranspose([&](const Product& p) { checkAgainstReference<T>(p, beta, nanInC); });
}

}  // namespace

TEST_CASE("gemm in f32 matches a double reference across tile and block edges, for every transpose") {
  checkEveryTranspose<float>(0.0f, false);
}

TEST_CASE("gemm in f64 matches a double reference for every transpose") { checkEveryTranspose<double>(0.0, false); }

TEST_CASE("gemm with beta 0 never reads C, whatever C holds") {
  checkEveryTranspose<float>(0.0f, true);
  checkEveryTranspose<double>(0.0, true);
}

TEST_CASE("gemm adds beta C: beta 1 accumulates, other betas scale") {
  for (float beta : {1.0f, 0.5f, -2.0f}) {
    CAPTURE(beta);
    checkEveryTranspose<float>(beta, false);
  }
  checkEveryTranspose<double>(1.0, false);
}

TEST_CASE("gemm with an empty depth gives beta C, and with no rows or columns writes nothing") {
  std::vector<float> c = {1, 2, 3, 4};
  blas::gemm<float>(false, false, 2, 2, 0, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2);
  CHECK(c == std::vector<float>{0.5f, 1, 1.5f, 2});
  blas::gemm<float>(false, false, 2, 2, 0, nullptr, 1, nullptr, 2, 0.0f, c.data(), 2);
  CHECK(c == std::vector<float>{0, 0, 0, 0});
  blas::gemm<float>(false, false, 0, 2, 3, nullptr, 3, nullptr, 2, 0.0f, nullptr, 2);
  blas::gemm<float>(false, false, 2, 0, 3, nullptr, 3, nullptr, 0, 0.0f, nullptr, 0);
}

TEST_CASE("parallelGemm gives the same bits at any thread count") {
  for (const Product& p : {Product{false, false, 700, 90, 300}, Product{true, true, 60, 900, 270},
                           Product{false, true, 257, 333, 513}}) {
    CAPTURE(p.m);
    const Operands<float> o = operands<float>(p);
    std::vector<float> first;
    for (int threads : {1, 2, 3, 8}) {
      CAPTURE(threads);
      ThreadPool pool(threads);
      KernelContext ctx;
      ctx.pool = &pool;
      std::vector<float> c = o.c;
      blas::parallelGemm<float>(ctx, p.ta, p.tb, p.m, p.n, p.k, o.a.data(), o.lda, o.b.data(), o.ldb, 1.0f, c.data(),
                                o.ldc);
      if (first.empty()) first = c;
      CHECK(c == first);
    }
    // weft's own kernel computes every element alike wherever it lies: one call gives the bits too.
    if (blas::detail::kHaveOwnSgemm) {
      std::vector<float> whole = o.c;
      blas::gemm<float>(p.ta, p.tb, p.m, p.n, p.k, o.a.data(), o.lda, o.b.data(), o.ldb, 1.0f, whole.data(), o.ldc);
      CHECK(whole == first);
    }
  }
}

namespace {

/// Checks products with a packed B, rounded to bf16 or not, against the unpacked product
/// (parallelGemmBf16 or parallelGemm), for beta 0 and 1 at 1, 2 and 3 threads.
void checkPackedProducts(bool roundToBf16) {
  // Depth blocks (1030 > 512 and 257 > 256), odd depths, tile and panel edges, padded rows.
  for (const Product& p : {Product{false, false, 64, 512, 128}, Product{false, true, 64, 128, 1030},
                           Product{true, false, 300, 70, 257, 3}, Product{false, true, 5, 33, 9}}) {
    CAPTURE(p.m);
    CAPTURE(p.n);
    const Operands<float> o = operands<float>(p);
    for (int threads : {1, 2, 3}) {
      CAPTURE(threads);
      ThreadPool pool(threads);
      KernelContext ctx;
      ctx.pool = &pool;
      const blas::PackedOperand<float> packed(ctx, p.tb, p.k, p.n, o.b.data(), o.ldb, roundToBf16);
      for (const float beta : {0.0f, 1.0f}) {
        CAPTURE(beta);
        std::vector<float> plain = o.c, withPacked = o.c;
        if (roundToBf16) {
          blas::parallelGemmBf16(ctx, p.ta, p.tb, p.m, p.n, p.k, o.a.data(), o.lda, o.b.data(), o.ldb, beta,
                                 plain.data(), o.ldc);
        } else {
          blas::parallelGemm<float>(ctx, p.ta, p.tb, p.m, p.n, p.k, o.a.data(), o.lda, o.b.data(), o.ldb, beta,
                                    plain.data(), o.ldc);
        }
        blas::parallelGemm<float>(ctx, p.ta, p.m, o.a.data(), o.lda, packed, beta, withPacked.data(), o.ldc);
        CHECK(withPacked == plain);
      }
    }
  }
}

}  // namespace

TEST_CASE("products with a packed operand give parallelGemm's bits, for either layout of B and any thread count") {
  checkPackedProducts(false);
}

TEST_CASE("a packed f64 operand multiplies as gemm does") {
  const Product p{false, true, 20, 30, 40};
  const Operands<double> o = operands<double>(p);
  ThreadPool pool(2);
  KernelContext ctx;
  ctx.pool = &pool;
  const blas::PackedOperand<double> packed(ctx, p.tb, p.k, p.n, o.b.data(), o.ldb);
  std::vector<double> plain = o.c, withPacked = o.c;
  blas::gemm<double>(p.ta, p.tb, p.m, p.n, p.k, o.a.data(), o.lda, o.b.data(), o.ldb, 0.0, plain.data(), o.ldc);
  blas::parallelGemm<double>(ctx, p.ta, p.m, o.a.data(), o.lda, packed, 0.0, withPacked.data(), o.ldc);
  CHECK(withPacked == plain);
}

namespace {

/// The operands of p in bfloat16, a C to start from (its rows' padding -7), and op(A) op(B) of
/// them in double (m x ldc).
struct Bf16Product {
  std::vector<float> wideA, wideB;  // the f32 operands the bf16 ones were rounded from
  std::vector<BFloat16> a, b;
  std::vector<float> c0;
  std::vector<double> exact, magnitude;
  int64_t lda, ldb, ldc;
};

Bf16Product bf16Product(const Product& p) {
  const Operands<float> o = operands<float>(p);
  Bf16Product r{o.a, o.b, {}, {}, o.c, {}, {}, o.lda, o.ldb, o.ldc};
  for (int64_t i = 0; i < p.m; ++i) std::fill(r.c0.begin() + i * o.ldc + p.n, r.c0.begin() + (i + 1) * o.ldc, -7.0f);
  for (float x : o.a) r.a.emplace_back(x);
  for (float x : o.b) r.b.emplace_back(x);
  r.exact.assign(static_cast<size_t>(p.m * o.ldc), 0.0);
  r.magnitude = r.exact;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      for (int64_t q = 0; q < p.k; ++q) {
        const double x = static_cast<float>(r.a[static_cast<size_t>(p.ta ? q * o.lda + i : i * o.lda + q)]);
        const double y = static_cast<float>(r.b[static_cast<size_t>(p.tb ? j * o.ldb + q : q * o.ldb + j)]);
        r.exact[static_cast<size_t>(i * o.ldc + j)] += x * y;
        r.magnitude[static_cast<size_t>(i * o.ldc + j)] += std::abs(x * y);
      }
    }
  }
  return r;
}

/// Checks C (rows of r.ldc) against the double product of the bf16 operands plus beta C0: f32
/// accumulation of exact products, and the padding of every row of C (-7) as it was.
void checkBf16Product(const Product& p, const Bf16Product& r, float beta, const std::vector<float>& c) {
  const double eps = std::numeric_limits<float>::epsilon();
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < r.ldc; ++j) {
      const size_t at = static_cast<size_t>(i * r.ldc + j);
      const double expected = r.exact[at] + beta * static_cast<double>(r.c0[at]);
      const double magnitude = r.magnitude[at] + std::abs(beta * static_cast<double>(r.c0[at]));
      const double bound = 2 * eps * (static_cast<double>(p.k) + 2) * (magnitude + 1e-30);
      if (j < p.n ? std::abs(c[at] - expected) > bound : c[at] != -7.0f) {
        FAIL_CHECK("C[" << i << ", " << j << "] = " << c[at] << ", expected " << expected);
        return;
      }
    }
  }
}

/// Checks the bf16 product of every shape and transpose against the double reference, with beta
/// 0 and 1, its operands given in bf16, or (wide) in f32 for the kernel to round.
void checkEveryBf16Product(bool wide) {
  ThreadPool pool(1);
  KernelContext ctx;
  ctx.pool = &pool;
  forEveryTranspose([&](const Product& p) {
    const Bf16Product r = bf16Product(p);
    for (const float beta : {0.0f, 1.0f}) {
      CAPTURE(beta);
      std::vector<float> c = r.c0;
      if (wide) {
        blas::parallelGemmBf16(ctx, p.ta, p.tb, p.m, p.n, p.k, r.wideA.data(), r.lda, r.wideB.data(), r.ldb, beta,
                               c.data(), r.ldc);
      } else {
        blas::parallelGemmBf16(ctx, p.ta, p.tb, p.m, p.n, p.k, r.a.data(), r.lda, r.b.data(), r.ldb, beta, c.data(),
                               r.ldc);
      }
      checkBf16Product(p, r, beta, c);
    }
  });
}

}  // namespace

TEST_CASE("the bf16 product matches the double product of its bf16 operands, for every transpose") {
  if (!blas::haveBf16Gemm()) {
    MESSAGE("this build has no bf16 matrix product (no AVX512_BF16)");
    return;
  }
  checkEveryBf16Product(false);
}

TEST_CASE("the bf16 product of f32 operands rounds them to bf16 as it packs them, for every transpose") {
  if (!blas::haveBf16Gemm()) return;
  checkEveryBf16Product(true);
}

TEST_CASE("the bf16 product gives the same bits for any thread count, and for f32 operands as for rounded ones") {
  if (!blas::haveBf16Gemm()) return;
  for (const Product& p :
       {Product{false, false, 130, 70, 520}, Product{true, true, 25, 1030, 40}, Product{false, true, 300, 20, 33}}) {
    CAPTURE(p.m);
    const Bf16Product r = bf16Product(p);
    std::vector<float> first;
    for (int threads : {1, 2, 3, 8}) {
      CAPTURE(threads);
      ThreadPool pool(threads);
      KernelContext ctx;
      ctx.pool = &pool;
      std::vector<float> c(r.exact.size()), fromWide(r.exact.size());
      blas::parallelGemmBf16(ctx, p.ta, p.tb, p.m, p.n, p.k, r.a.data(), r.lda, r.b.data(), r.ldb, 0.0f, c.data(),
                             r.ldc);
      blas::parallelGemmBf16(ctx, p.ta, p.tb, p.m, p.n, p.k, r.wideA.data(), r.lda, r.wideB.data(), r.ldb, 0.0f,
                             fromWide.data(), r.ldc);
      if (first.empty()) first = c;
      CHECK(c == first);
      CHECK(fromWide == first);
    }
  }
}

TEST_CASE(
    "a packed operand rounded to bf16 gives parallelGemmBf16's bits, for either layout of B and any thread count") {
  if (!blas::haveBf16Gemm()) return;
  checkPackedProducts(true);
}

TEST_CASE("a packed operand is rounded to bf16 only for f32 on a CPU with a bf16 product") {
  ThreadPool pool(1);
  KernelContext ctx;
  ctx.pool = &pool;
  const std::vector<double> b(12, 1.0);
  CHECK_THROWS_WITH_AS(blas::PackedOperand<double>(ctx, false, 3, 4, b.data(), 4, true),
                       doctest::Contains("rounding to bf16 needs f32 operands"), Error);
}

namespace {

/// Whether /proc/cpuinfo lists the flag (Linux's name for a CPU feature), read independently of
/// the kernel's own detection.
bool cpuinfoHasFlag(const std::string& flag) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    for (std::string word; words >> word;)
      if (word == flag) return true;
    return false;
  }
  return false;
}

bool amxDeclined() {
  const char* choice = std::getenv("WEFT_AMX");
  return choice != nullptr && std::string(choice) == "0";
}

}  // namespace

TEST_CASE("the bf16 product runs on AMX tiles where the CPU has AMX-BF16, unless WEFT_AMX=0 declines them") {
  const bool amxCpu = cpuinfoHasFlag("amx_bf16") && cpuinfoHasFlag("amx_tile") && cpuinfoHasFlag("avx512_bf16");
  CAPTURE(amxCpu);
  CHECK(blas::detail::amxBf16Usable() == (blas::detail::kAmxBuilt && amxCpu && !amxDeclined()));
  const std::string kernel = blas::kernelReport().bf16Gemm;
  if (blas::detail::amxBf16Usable()) {
    CHECK(kernel == "weft AMX-BF16");
  } else {
    CHECK(kernel == (blas::detail::kHaveBf16GemmAvx512 ? "weft AVX512_BF16" : "none"));
  }
}

TEST_CASE("the AMX and AVX512_BF16 kernels each match the double product across AMX's tiles and blocks") {
  std::vector<const blas::detail::Bf16Kernel*> kernels;
  if (blas::detail::amxBf16Usable()) kernels.push_back(&blas::detail::bf16Amx());
  if constexpr (blas::detail::kHaveBf16GemmAvx512) kernels.push_back(&blas::detail::bf16Avx512());
  // AMX: tiles of 16 rows, 16 columns and 32 depths, blocks of C of 32 x 32, 128 rows of A and
  // 512 columns of B packed at once, depth blocks of 512.
  for (const Product& p : {Product{false, false, 32, 32, 32}, Product{false, true, 16, 16, 64},
                           Product{true, false, 129, 513, 1025}, Product{true, true, 33, 47, 31, 3},
                           Product{false, false, 1, 530, 1}, Product{false, true, 140, 1, 600}}) {
    CAPTURE(p.ta);
    CAPTURE(p.tb);
    CAPTURE(p.m);
    CAPTURE(p.n);
    CAPTURE(p.k);
    const Bf16Product r = bf16Product(p);
    for (const blas::detail::Bf16Kernel* kernel : kernels) {
      CAPTURE(kernel->name);
      for (const float beta : {0.0f, 1.0f}) {
        std::vector<float> c = r.c0, fromWide = r.c0;
        kernel->gemm(p.ta, p.tb, p.m, p.n, p.k, reinterpret_cast<const uint16_t*>(r.a.data()), r.lda,
                     reinterpret_cast<const uint16_t*>(r.b.data()), r.ldb, beta, c.data(), r.ldc);
        kernel->gemmRounding(p.ta, p.tb, p.m, p.n, p.k, r.wideA.data(), r.lda, r.wideB.data(), r.ldb, beta,
                             fromWide.data(), r.ldc);
        checkBf16Product(p, r, beta, c);
        CHECK(fromWide == c);
      }
    }
  }
}

TEST_CASE("an infinity in B reaches only its own column of the bf16 product: padding multiplies nothing") {
  if (!blas::haveBf16Gemm()) return;
  ThreadPool pool(2);
  KernelContext ctx;
  ctx.pool = &pool;
  for (const Product& p : {Product{false, false, 20, 40, 7}, Product{false, true, 20, 40, 33}}) {
    CAPTURE(p.tb);
    Bf16Product r = bf16Product(p);
    const int64_t column = 17, depth = p.k - 1;  // the last depth: the padding begins after it
    r.b[static_cast<size_t>(p.tb ? column * r.ldb + depth : depth * r.ldb + column)] =
        BFloat16(std::numeric_limits<float>::infinity());
    std::vector<float> c(static_cast<size_t>(p.m * r.ldc), 0.0f);
    blas::parallelGemmBf16(ctx, p.ta, p.tb, p.m, p.n, p.k, r.a.data(), r.lda, r.b.data(), r.ldb, 0.0f, c.data(),
                           r.ldc);
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.n; ++j) {
        const float got = c[static_cast<size_t>(i * r.ldc + j)];
        if (j == column ? std::isfinite(got) : !std::isfinite(got)) {
          FAIL_CHECK("C[" << i << ", " << j << "] = " << got);
          return;
        }
      }
    }
  }
}
