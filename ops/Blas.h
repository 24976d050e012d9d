// Row-major matrix products on the CPU, for the op kernels (the CPU twin of ops/cuda/Blas.h):
// f32 through weft's own kernel on AVX-512 and AVX2 builds (ops/OwnSgemm.h), everything else
// through OpenBLAS's CBLAS; the one place weft calls CBLAS. Each call is single-threaded: weft's pool
// spreads a product's blocks, so the thread count is the session's.
#pragma once

#include "core/Half.h"
#include "core/OpRegistry.h"

#include <memory>

namespace weft::blas {

/// C (m x n) = op(A) op(B) + beta C, row-major, as one single-threaded call. A is stored (k x m)
/// when ta, B (n x k) when tb; lda, ldb, ldc are stored row lengths. Empty extents, which BLAS
/// rejects, are fine (k = 0 gives beta C).
template <class T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T beta,
          T* c, int64_t ldc);

/// The same product with C cut into blocks of rows or of columns that the kernel's pool
/// computes. Results never depend on the number of threads: for BLAS, which may round a block
/// of another shape differently, the blocks follow from the shape alone; weft's own kernel gives
/// the same bits however C is cut, so it takes one block per thread.
template <class T>
void parallelGemm(const KernelContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                  const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

/// op(B) (k x n; B stored n x k when tb) laid out once for many products with it: an RNN
/// multiplies its recurrent weight at every step. Holds a copy when weft's own kernel runs the
/// products (f32 on AVX-512 or AVX2), packed on ctx's pool, otherwise B's address, which must then
/// outlive it. With roundToBf16 (f32 only, where haveBf16Gemm()) the copy holds B rounded to
/// bf16, and the products with it are parallelGemmBf16's: A is rounded too.
template <class T>
class PackedOperand {
 public:
  PackedOperand(const KernelContext& ctx, bool tb, int64_t k, int64_t n, const T* b, int64_t ldb,
                bool roundToBf16 = false);
  bool tb;
  int64_t k, n;
  const T* b;
  int64_t ldb;
  std::unique_ptr<float[]> packed;         // empty unless weft's f32 kernel runs the products
  std::unique_ptr<uint32_t[]> packedBf16;  // empty unless rounded to bf16
};

/// parallelGemm with a packed B, with the bits parallelGemm (or, for a B rounded to bf16,
/// parallelGemmBf16) gives; C is cut into blocks of rows where it is tall enough, since no block
/// then packs anything twice.
template <class T>
void parallelGemm(const KernelContext& ctx, bool ta, int64_t m, const T* a, int64_t lda, const PackedOperand<T>& b,
                  T beta, T* c, int64_t ldc);

/// What runs this build's CPU products, for reports such as `weft train --bench`: the widest
/// vector instruction set the build targets ("AVX-512", "AVX2", ...), the f32 kernel ("weft
/// AVX-512", "weft AVX2" or "OpenBLAS") and the bf16 one ("weft AMX-BF16", "weft AVX512_BF16", or
/// "none" where bf16 products widen to f32).
struct KernelReport {
  const char* vectorIsa;
  const char* f32Gemm;
  const char* bf16Gemm;
};
KernelReport kernelReport();

/// Whether parallelGemmBf16 runs here: weft's bf16 kernel on AMX tiles where the CPU has AMX-BF16
/// (chosen at run time in every x86-64 build; WEFT_AMX=0 declines it), else its AVX512_BF16
/// kernel where the build targets AVX512_BF16.
bool haveBf16Gemm();

/// C (m x n, f32) = op(A) op(B) + beta C for A and B in bfloat16 (T = BFloat16), or in f32
/// rounded to bfloat16 element by element as the kernel packs them (T = float), with f32
/// accumulation (products of bf16 values are exact in f32); C cut into blocks across ctx's pool
/// with the bits of one call; blas::gemm's layout conventions. Only where haveBf16Gemm().
template <class T>
void parallelGemmBf16(const KernelContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a,
                      int64_t lda, const T* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace weft::blas
