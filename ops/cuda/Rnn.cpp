// The CUDA kernels of the fused LSTM and GRU ops (ops/Rnn.cpp defines the ops and the formulas):
// the sequence of ops/RnnSequence.h with products through cuBLAS (ops/cuda/Blas.h) and the gate
// math of each step in ops/cuda/Rnn.cu.
#include "ops/RnnSequence.h"
#include "ops/cuda/Blas.h"
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

namespace weft::cudaops {
namespace {

template <class T>
struct CudaBackend {
  const KernelContext& ctx;
  DType low;                         // what the products round f32 operands to (f32: nothing)
  std::vector<Tensor> scratchStore;  // freed in stream order when the op returns

  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
            T beta, T* c, int64_t ldc) {
    if constexpr (std::is_same_v<T, float>) {
      if (low != f32) return gemmRounded(ctx, low, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
    }
    cudaops::gemm<T>(ctx, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
  }
  /// cuBLAS packs nothing ahead: the "packed" operand is B where it lies.
  struct Operand {
    bool tb;
    int64_t k, n;
    const T* b;
    int64_t ldb;
  };
  Operand pack(bool tb, int64_t k, int64_t n, const T* b, int64_t ldb) { return {tb, k, n, b, ldb}; }
  void gemm(int64_t m, const T* a, int64_t lda, const Operand& b, T beta, T* c, int64_t ldc) {
    gemm(false, b.tb, m, b.n, b.k, a, lda, b.b, b.ldb, beta, c, ldc);
  }
  void lstmStep(int64_t batch, int64_t hidden, const T* bias, const T* cPrev, T* gates, T* c, T* h) {
    if (batch * hidden != 0)
      WEFT_CUDA_CHECK(launch::lstmStep<T>(batch, hidden, bias, cPrev, gates, c, h, streamOf(ctx)));
  }
  void lstmStepGrad(int64_t batch, int64_t hidden, const T* gates, const T* c, const T* cPrev, const T* dy, T* dh,
                    T* dc, T* dGates) {
    if (batch * hidden != 0) {
      WEFT_CUDA_CHECK(launch::lstmStepGrad<T>(batch, hidden, gates, c, cPrev, dy, dh, dc, dGates, streamOf(ctx)));
    }
  }
  void gruStep(int64_t batch, int64_t hidden, const T* bx, const T* bh, const T* h, T* gates, T* hn, T* hNew) {
    if (batch * hidden != 0)
      WEFT_CUDA_CHECK(launch::gruCell<T>(batch, hidden, bx, bh, h, gates, hn, hNew, streamOf(ctx)));
  }
  void gruStepGrad(int64_t batch, int64_t hidden, const T* gates, const T* hn, const T* h, const T* dhNew, T* dGx,
                   T* dGh, T* dh) {
    if (batch * hidden != 0) {
      WEFT_CUDA_CHECK(launch::gruCellGrad<T>(batch, hidden, gates, hn, h, dhNew, dGx, dGh, dh, streamOf(ctx)));
    }
  }
  void copy(const T* src, T* dst, int64_t n) {
    if (n && src != dst) {
      WEFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(T), cudaMemcpyDeviceToDevice,
                                      streamOf(ctx)));
    }
  }
  void zero(T* dst, int64_t n) {
    if (n) WEFT_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(n) * sizeof(T), streamOf(ctx)));
  }
  /// dst (cols) = the sum of the rows of src (rows, cols).
  void columnSums(int64_t rows, int64_t cols, const T* src, T* dst) {
    if (cols == 0) return;
    ReducePlan plan;
    plan.kept.rank = 1;
    plan.kept.dims[0] = cols;
    plan.kept.strides[0] = 1;
    plan.reduced.rank = 1;
    plan.reduced.dims[0] = std::max<int64_t>(rows, 1);
    plan.reduced.strides[0] = cols;
    plan.outputs = cols;
    plan.count = rows;
    WEFT_CUDA_CHECK(launch::reduce<T>(Reduction::Sum, src, dst, plan, streamOf(ctx)));
  }
  T* scratch(int64_t n) {
    scratchStore.emplace_back(DTypeOf<T>::value, Shape{std::max<int64_t>(n, 1)}, ctx.device);
    return scratchStore.back().template data<T>();
  }
};

template <class F>
void run(KernelContext& ctx, F sequence) {
  dispatchFloating(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    CudaBackend<T> backend{ctx, ctx.attrs().get<DType>("round_operands_to", f32), {}};
    sequence(z, backend);
  });
}

}  // namespace

void lstm(KernelContext& ctx) {
  run(ctx, [&](auto z, auto& backend) { rnn::lstmForward<decltype(z)>(ctx, backend); });
}
void lstmGrad(KernelContext& ctx) {
  run(ctx, [&](auto z, auto& backend) { rnn::lstmBackward<decltype(z)>(ctx, backend); });
}
void lstmInputGrad(KernelContext& ctx) {
  run(ctx, [&](auto z, auto& backend) { rnn::lstmInputBackward<decltype(z)>(ctx, backend); });
}
void lstmWeightGrad(KernelContext& ctx) {
  run(ctx, [&](auto z, auto& backend) { rnn::lstmWeightBackward<decltype(z)>(ctx, backend); });
}
void gruCell(KernelContext& ctx) {
  run(ctx, [&](auto z, auto& backend) { rnn::gruForward<decltype(z)>(ctx, backend); });
}
void gruCellGrad(KernelContext& ctx) {
  run(ctx, [&](auto z, auto& backend) { rnn::gruBackward<decltype(z)>(ctx, backend); });
}
void gruCellInputGrad(KernelContext& ctx) {
  run(ctx, [&](auto z, auto& backend) { rnn::gruInputBackward<decltype(z)>(ctx, backend); });
}
void gruCellWeightGrad(KernelContext& ctx) {
  run(ctx, [&](auto z, auto& backend) { rnn::gruWeightBackward<decltype(z)>(ctx, backend); });
}

}  // namespace weft::cudaops
