// CUDA kernels of the gate math of the LSTM and GRU ops (ops/Rnn.cpp defines the ops and the
// formulas; ops/cuda/Rnn.cpp runs the matrix products and calls these once per step).
#include "ops/cuda/Device.cuh"

namespace weft::cudaops {
namespace {

template <class T>
__device__ T sigmoid(T x) {
  return T(1) / (T(1) + ::exp(-x));
}

template <class T>
__global__ void lstmStepKernel(int64_t batch, int64_t hidden, const T* bias, const T* cPrev, T* gates, T* c, T* h) {
  WEFT_GRID_STRIDE(k, batch * hidden) {
    const int64_t r = k / hidden, j = k % hidden;
    T* g = gates + r * 4 * hidden + j;
    const T i = sigmoid(g[0] + bias[j]);
    const T f = sigmoid(g[hidden] + bias[hidden + j]);
    const T gg = ::tanh(g[2 * hidden] + bias[2 * hidden + j]);
    const T o = sigmoid(g[3 * hidden] + bias[3 * hidden + j]);
    g[0] = i;
    g[hidden] = f;
    g[2 * hidden] = gg;
    g[3 * hidden] = o;
    const T cv = f * cPrev[k] + i * gg;
    c[k] = cv;
    h[k] = o * ::tanh(cv);
  }
}

template <class T>
__global__ void lstmStepGradKernel(int64_t batch, int64_t hidden, const T* gates, const T* c, const T* cPrev,
                                   const T* dy, T* dh, T* dc, T* dGates) {
  WEFT_GRID_STRIDE(k, batch * hidden) {
    const int64_t r = k / hidden, j = k % hidden;
    const T* g = gates + r * 4 * hidden + j;
    const T i = g[0], f = g[hidden], gg = g[2 * hidden], o = g[3 * hidden];
    const T tc = ::tanh(c[k]);
    const T dhv = dh[k] + dy[k];
    const T dcv = dc[k] + dhv * o * (T(1) - tc * tc);
    T* d = dGates + r * 4 * hidden + j;
    d[0] = dcv * gg * i * (T(1) - i);
    d[hidden] = dcv * cPrev[k] * f * (T(1) - f);
    d[2 * hidden] = dcv * i * (T(1) - gg * gg);
    d[3 * hidden] = dhv * tc * o * (T(1) - o);
    dc[k] = dcv * f;
  }
}

template <class T>
__global__ void gruCellKernel(int64_t batch, int64_t hidden, const T* bx, const T* bh, const T* h, T* gates, T* hn,
                              T* hNew) {
  WEFT_GRID_STRIDE(k, batch * hidden) {
    const int64_t r = k / hidden, j = k % hidden;
    T* g = gates + r * 3 * hidden + j;
    const T rg = sigmoid(g[0] + bx[j] + bh[j]);
    const T z = sigmoid(g[hidden] + bx[hidden + j] + bh[hidden + j]);
    const T hnv = hn[k] + bh[2 * hidden + j];
    const T n = ::tanh(g[2 * hidden] + bx[2 * hidden + j] + rg * hnv);
    g[0] = rg;
    g[hidden] = z;
    g[2 * hidden] = n;
    hn[k] = hnv;
    hNew[k] = (T(1) - z) * n + z * h[k];
  }
}

template <class T>
__global__ void gruCellGradKernel(int64_t batch, int64_t hidden, const T* gates, const T* hn, const T* h,
                                  const T* dhNew, T* dGx, T* dGh, T* dh) {
  WEFT_GRID_STRIDE(k, batch * hidden) {
    const int64_t r = k / hidden, j = k % hidden;
    const T* g = gates + r * 3 * hidden + j;
    const T rg = g[0], z = g[hidden], n = g[2 * hidden];
    const T d = dhNew[k];
    const T dn = d * (T(1) - z) * (T(1) - n * n);
    const T dz = d * (h[k] - n) * z * (T(1) - z);
    const T dr = dn * hn[k] * rg * (T(1) - rg);
    T* x = dGx + r * 3 * hidden + j;
    T* hh = dGh + r * 3 * hidden + j;
    x[0] = dr;
    x[hidden] = dz;
    x[2 * hidden] = dn;
    hh[0] = dr;
    hh[hidden] = dz;
    hh[2 * hidden] = dn * rg;
    dh[k] = d * z;
  }
}

}  // namespace

namespace launch {

template <class T>
cudaError_t lstmStep(int64_t batch, int64_t hidden, const T* bias, const T* cPrev, T* gates, T* c, T* h,
                     cudaStream_t stream) {
  lstmStepKernel<T><<<blocksFor(batch * hidden), kThreads, 0, stream>>>(batch, hidden, bias, cPrev, gates, c, h);
  return cudaGetLastError();
}

template <class T>
cudaError_t lstmStepGrad(int64_t batch, int64_t hidden, const T* gates, const T* c, const T* cPrev, const T* dy,
                         T* dh, T* dc, T* dGates, cudaStream_t stream) {
  lstmStepGradKernel<T><<<blocksFor(batch * hidden), kThreads, 0, stream>>>(batch, hidden, gates, c, cPrev, dy, dh, dc,
                                                                            dGates);
  return cudaGetLastError();
}

template <class T>
cudaError_t gruCell(int64_t batch, int64_t hidden, const T* bx, const T* bh, const T* h, T* gates, T* hn, T* hNew,
                    cudaStream_t stream) {
  gruCellKernel<T><<<blocksFor(batch * hidden), kThreads, 0, stream>>>(batch, hidden, bx, bh, h, gates, hn, hNew);
  return cudaGetLastError();
}

template <class T>
cudaError_t gruCellGrad(int64_t batch, int64_t hidden, const T* gates, const T* hn, const T* h, const T* dhNew,
                        T* dGx, T* dGh, T* dh, cudaStream_t stream) {
  gruCellGradKernel<T><<<blocksFor(batch * hidden), kThreads, 0, stream>>>(batch, hidden, gates, hn, h, dhNew, dGx,
                                                                           dGh, dh);
  return cudaGetLastError();
}

#define WEFT_RNN(T)                                                                                           \
  template cudaError_t lstmStep<T>(int64_t, int64_t, const T*, const T*, T*, T*, T*, cudaStream_t);           \
  template cudaError_t lstmStepGrad<T>(int64_t, int64_t, const T*, const T*, const T*, const T*, T*, T*, T*,  \
                                       cudaStream_t);                                                         \
  template cudaError_t gruCell<T>(int64_t, int64_t, const T*, const T*, const T*, T*, T*, T*, cudaStream_t);  \
  template cudaError_t gruCellGrad<T>(int64_t, int64_t, const T*, const T*, const T*, const T*, T*, T*, T*,   \
                                      cudaStream_t);
WEFT_RNN(float)
WEFT_RNN(double)
#undef WEFT_RNN

}  // namespace launch
}  // namespace weft::cudaops
