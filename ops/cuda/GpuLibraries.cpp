// cuBLAS and cuDNN, opened when a GPU kernel first calls them (core/cuda/GpuLibrary.h): the
// functions weft's CUDA kernels call, each forwarded to the library's own.
#include "core/cuda/GpuLibrary.h"

#include <cublas_v2.h>
#ifdef WEFT_HAVE_CUDNN
#include <cudnn.h>
#endif

namespace {

weft::cuda::GpuLibrary& cublasLibrary() {
  static weft::cuda::GpuLibrary library("cuBLAS", WEFT_CUBLAS_PATH);
  return library;
}

}  // namespace

WEFT_GPU_FORWARD(cublasLibrary(), cublasStatus_t, cublasCreate_v2, (cublasHandle_t* handle), (handle))
WEFT_GPU_FORWARD(cublasLibrary(), cublasStatus_t, cublasSetStream_v2,
                 (cublasHandle_t handle, cudaStream_t streamId),
                 (handle, streamId))
WEFT_GPU_FORWARD(cublasLibrary(), cublasStatus_t, cublasSetMathMode,
                 (cublasHandle_t handle, cublasMath_t mode),
                 (handle, mode))
WEFT_GPU_FORWARD(cublasLibrary(), cublasStatus_t, cublasSgemm_v2,
                 (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                  const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta, float* C,
                  int ldc),
                 (handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
WEFT_GPU_FORWARD(cublasLibrary(), cublasStatus_t, cublasDgemm_v2,
                 (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                  const double* alpha, const double* A, int lda, const double* B, int ldb, const double* beta,
                  double* C, int ldc),
                 (handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
WEFT_GPU_FORWARD(cublasLibrary(), cublasStatus_t, cublasGemmEx,
                 (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                  const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B, cudaDataType Btype,
                  int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                  cublasGemmAlgo_t algo),
                 (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc,
                  computeType, algo))
WEFT_GPU_FORWARD(cublasLibrary(), cublasStatus_t, cublasSgemmStridedBatched,
                 (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                  const float* alpha, const float* A, int lda, long long int strideA, const float* B, int ldb,
                  long long int strideB, const float* beta, float* C, int ldc, long long int strideC, int batchCount),
                 (handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                  batchCount))
WEFT_GPU_FORWARD(cublasLibrary(), cublasStatus_t, cublasDgemmStridedBatched,
                 (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                  const double* alpha, const double* A, int lda, long long int strideA, const double* B, int ldb,
                  long long int strideB, const double* beta, double* C, int ldc, long long int strideC,
                  int batchCount),
                 (handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                  batchCount))
WEFT_GPU_FORWARD(cublasLibrary(), cublasStatus_t, cublasGemmStridedBatchedEx,
                 (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                  const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
                  const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
                  cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
                  cublasComputeType_t computeType, cublasGemmAlgo_t algo),
                 (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C,
                  Ctype, ldc, strideC, batchCount, computeType, algo))
WEFT_GPU_FORWARD(cublasLibrary(), const char*, cublasGetStatusName, (cublasStatus_t status), (status))
WEFT_GPU_FORWARD(cublasLibrary(), const char*, cublasGetStatusString, (cublasStatus_t status), (status))

#ifdef WEFT_HAVE_CUDNN
namespace {

weft::cuda::GpuLibrary& cudnnLibrary() {
  static weft::cuda::GpuLibrary library("cuDNN", WEFT_CUDNN_PATH);
  return library;
}

}  // namespace

WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnCreate, (cudnnHandle_t* handle), (handle))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnSetStream,
                 (cudnnHandle_t handle, cudaStream_t streamId),
                 (handle, streamId))
WEFT_GPU_FORWARD(cudnnLibrary(), const char*, cudnnGetErrorString, (cudnnStatus_t status), (status))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnCreateTensorDescriptor,
                 (cudnnTensorDescriptor_t* tensorDesc),
                 (tensorDesc))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnSetTensor4dDescriptor,
                 (cudnnTensorDescriptor_t tensorDesc, cudnnTensorFormat_t format, cudnnDataType_t dataType, int n,
                  int c, int h, int w),
                 (tensorDesc, format, dataType, n, c, h, w))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnCreateFilterDescriptor,
                 (cudnnFilterDescriptor_t* filterDesc),
                 (filterDesc))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnSetFilter4dDescriptor,
                 (cudnnFilterDescriptor_t filterDesc, cudnnDataType_t dataType, cudnnTensorFormat_t format, int k,
                  int c, int h, int w),
                 (filterDesc, dataType, format, k, c, h, w))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnCreateConvolutionDescriptor,
                 (cudnnConvolutionDescriptor_t* convDesc),
                 (convDesc))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnSetConvolution2dDescriptor,
                 (cudnnConvolutionDescriptor_t convDesc, int pad_h, int pad_w, int u, int v, int dilation_h,
                  int dilation_w, cudnnConvolutionMode_t mode, cudnnDataType_t computeType),
                 (convDesc, pad_h, pad_w, u, v, dilation_h, dilation_w, mode, computeType))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnSetConvolutionMathType,
                 (cudnnConvolutionDescriptor_t convDesc, cudnnMathType_t mathType),
                 (convDesc, mathType))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnGetConvolution2dForwardOutputDim,
                 (const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t inputTensorDesc,
                  const cudnnFilterDescriptor_t filterDesc, int* n, int* c, int* h, int* w),
                 (convDesc, inputTensorDesc, filterDesc, n, c, h, w))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnFindConvolutionForwardAlgorithm,
                 (cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                  const cudnnFilterDescriptor_t filterDesc, const cudnnConvolutionDescriptor_t convDesc,
                  const cudnnTensorDescriptor_t destDesc, const int requestedAlgoCount, int* returnedAlgoCount,
                  cudnnConvolutionFwdAlgoPerf_t* perfResults),
                 (handle, srcDesc, filterDesc, convDesc, destDesc, requestedAlgoCount, returnedAlgoCount,
                  perfResults))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnGetConvolutionForwardWorkspaceSize,
                 (cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
                  const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
                  cudnnConvolutionFwdAlgo_t algo, size_t* sizeInBytes),
                 (handle, xDesc, wDesc, convDesc, yDesc, algo, sizeInBytes))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnConvolutionForward,
                 (cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc, const void* x,
                  const cudnnFilterDescriptor_t wDesc, const void* w, const cudnnConvolutionDescriptor_t convDesc,
                  cudnnConvolutionFwdAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
                  const cudnnTensorDescriptor_t yDesc, void* y),
                 (handle, alpha, xDesc, x, wDesc, w, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, yDesc, y))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnFindConvolutionBackwardDataAlgorithm,
                 (cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc,
                  const cudnnTensorDescriptor_t diffDesc, const cudnnConvolutionDescriptor_t convDesc,
                  const cudnnTensorDescriptor_t gradDesc, const int requestedAlgoCount, int* returnedAlgoCount,
                  cudnnConvolutionBwdDataAlgoPerf_t* perfResults),
                 (handle, filterDesc, diffDesc, convDesc, gradDesc, requestedAlgoCount, returnedAlgoCount,
                  perfResults))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnGetConvolutionBackwardDataWorkspaceSize,
                 (cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
                  const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
                  cudnnConvolutionBwdDataAlgo_t algo, size_t* sizeInBytes),
                 (handle, wDesc, dyDesc, convDesc, dxDesc, algo, sizeInBytes))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnConvolutionBackwardData,
                 (cudnnHandle_t handle, const void* alpha, const cudnnFilterDescriptor_t wDesc, const void* w,
                  const cudnnTensorDescriptor_t dyDesc, const void* dy, const cudnnConvolutionDescriptor_t convDesc,
                  cudnnConvolutionBwdDataAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
                  const cudnnTensorDescriptor_t dxDesc, void* dx),
                 (handle, alpha, wDesc, w, dyDesc, dy, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, dxDesc,
                  dx))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnFindConvolutionBackwardFilterAlgorithm,
                 (cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                  const cudnnTensorDescriptor_t diffDesc, const cudnnConvolutionDescriptor_t convDesc,
                  const cudnnFilterDescriptor_t gradDesc, const int requestedAlgoCount, int* returnedAlgoCount,
                  cudnnConvolutionBwdFilterAlgoPerf_t* perfResults),
                 (handle, srcDesc, diffDesc, convDesc, gradDesc, requestedAlgoCount, returnedAlgoCount, perfResults))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnGetConvolutionBackwardFilterWorkspaceSize,
                 (cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
                  const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
                  cudnnConvolutionBwdFilterAlgo_t algo, size_t* sizeInBytes),
                 (handle, xDesc, dyDesc, convDesc, gradDesc, algo, sizeInBytes))
WEFT_GPU_FORWARD(cudnnLibrary(), cudnnStatus_t, cudnnConvolutionBackwardFilter,
                 (cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc, const void* x,
                  const cudnnTensorDescriptor_t dyDesc, const void* dy, const cudnnConvolutionDescriptor_t convDesc,
                  cudnnConvolutionBwdFilterAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes,
                  const void* beta, const cudnnFilterDescriptor_t dwDesc, void* dw),
                 (handle, alpha, xDesc, x, dyDesc, dy, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, dwDesc,
                  dw))
#endif
