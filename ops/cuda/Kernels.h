// Entry points of the CUDA kernels. Each op family file registers them beside its CPU kernels
// with WEFT_CUDA_KERNEL(name), which is null when weft is built without CUDA, so an op's
// definition, shape function, kernels and gradient stay in one place.
#pragma once

#include "core/OpRegistry.h"

#ifdef WEFT_HAVE_CUDA
#define WEFT_CUDA_KERNEL(...) (&::weft::cudaops::__VA_ARGS__)
#else
#define WEFT_CUDA_KERNEL(...) (static_cast<::weft::Kernel>(nullptr))
#endif
// Kernels on cuDNN, which a CUDA toolkit may lack.
#ifdef WEFT_HAVE_CUDNN
#define WEFT_CUDNN_KERNEL(...) WEFT_CUDA_KERNEL(__VA_ARGS__)
#else
#define WEFT_CUDNN_KERNEL(...) (static_cast<::weft::Kernel>(nullptr))
#endif

namespace weft::cudaops {

// ops/cuda/Elementwise.cpp
template <class Functor>
void binary(KernelContext& ctx);  // functors from ops/ElementwiseFunctors.h
void div(KernelContext& ctx);     // also reports integer division by zero
void neg(KernelContext& ctx);
void exp(KernelContext& ctx);
void log(KernelContext& ctx);
void tanh(KernelContext& ctx);
void sigmoid(KernelContext& ctx);
void relu(KernelContext& ctx);
void sqrt(KernelContext& ctx);
void rsqrt(KernelContext& ctx);
void abs(KernelContext& ctx);
void square(KernelContext& ctx);
void reciprocal(KernelContext& ctx);
void sign(KernelContext& ctx);
void sin(KernelContext& ctx);
void cos(KernelContext& ctx);
void reluGrad(KernelContext& ctx);
void sigmoidGrad(KernelContext& ctx);
void tanhGrad(KernelContext& ctx);
void where(KernelContext& ctx);
void cast(KernelContext& ctx);
void addN(KernelContext& ctx);
void copy(KernelContext& ctx);
void zeros(KernelContext& ctx);
void ones(KernelContext& ctx);
void broadcastLike(KernelContext& ctx);

// ops/cuda/Reduce.cpp
void sum(KernelContext& ctx);
void mean(KernelContext& ctx);
void max(KernelContext& ctx);
void argmax(KernelContext& ctx);
void reduceToLike(KernelContext& ctx);
void broadcastReduced(KernelContext& ctx);

// ops/cuda/Shape.cpp
void transpose(KernelContext& ctx);
void concat(KernelContext& ctx);
void split(KernelContext& ctx);
void concatGrad(KernelContext& ctx);
void slice(KernelContext& ctx);
void sliceGrad(KernelContext& ctx);
void pad(KernelContext& ctx);
void padGrad(KernelContext& ctx);
void reverseSequence(KernelContext& ctx);

// ops/cuda/Embedding.cpp
void gather(KernelContext& ctx);
void scatterAdd(KernelContext& ctx);
void segmentSum(KernelContext& ctx);

// ops/cuda/Rnn.cpp
void lstm(KernelContext& ctx);
void lstmGrad(KernelContext& ctx);
void lstmInputGrad(KernelContext& ctx);
void lstmWeightGrad(KernelContext& ctx);
void gruCell(KernelContext& ctx);
void gruCellGrad(KernelContext& ctx);
void gruCellInputGrad(KernelContext& ctx);
void gruCellWeightGrad(KernelContext& ctx);

// ops/cuda/Random.cpp and ops/cuda/Clip.cpp
void dropout(KernelContext& ctx);
void squaredNorm(KernelContext& ctx);
void sparseSquaredNorm(KernelContext& ctx);
void allFinite(KernelContext& ctx);

// ops/cuda/Norm.cpp
void batchNormTrain(KernelContext& ctx);
void batchNormGrad(KernelContext& ctx);
void batchNormReluTrain(KernelContext& ctx);
void batchNormReluGrad(KernelContext& ctx);
void batchNormInference(KernelContext& ctx);

// ops/cuda/Conv.cpp (cuDNN)
void conv2d(KernelContext& ctx);
void conv2dBackpropInput(KernelContext& ctx);
void conv2dBackpropFilter(KernelContext& ctx);

// ops/cuda/Pool.cpp
void maxPool(KernelContext& ctx);
void maxPoolGrad(KernelContext& ctx);
void avgPool(KernelContext& ctx);
void avgPoolGrad(KernelContext& ctx);

// ops/cuda/MatMul.cpp
void matmul(KernelContext& ctx);

// ops/cuda/Softmax.cpp
void softmax(KernelContext& ctx);
void logSoftmax(KernelContext& ctx);
void sparseSoftmaxXent(KernelContext& ctx);
void sparseSoftmaxXentGrad(KernelContext& ctx);
void penalizeMatches(KernelContext& ctx);
void sampledSoftmaxXent(KernelContext& ctx);
void sampledSoftmaxXentGrad(KernelContext& ctx);

// ops/cuda/Optimizers.cpp (dense optimizer updates and variable updates)
void applySGD(KernelContext& ctx);
void applyMomentum(KernelContext& ctx);
void applyAdam(KernelContext& ctx);
void applyAdagrad(KernelContext& ctx);
void sparseApplySGD(KernelContext& ctx);
void sparseApplyMomentum(KernelContext& ctx);
void sparseApplyAdam(KernelContext& ctx);
void sparseApplyAdagrad(KernelContext& ctx);
void assign(KernelContext& ctx);
void assignAdd(KernelContext& ctx);
void assignMovingAverage(KernelContext& ctx);

}  // namespace weft::cudaops
