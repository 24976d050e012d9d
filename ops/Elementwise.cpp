// Elementwise ops: broadcasting binary arithmetic and comparisons, unary math, casts, AddN and
// the broadcast adjoints (ReduceToLike / BroadcastLike) that their gradients use.
#include "ops/Broadcast.h"
#include "ops/ElementwiseFunctors.h"
#include "ops/cuda/Kernels.h"
#include "ops/OpUtil.h"

#include <Eigen/Core>

#include <cmath>

namespace weft {
namespace {

using detail::addOp1;
using detail::Broadcaster;

template <class T>
using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using ConstArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// ---- shape functions -----------------------------------------------------------------------

std::vector<TensorType> broadcastInfer(const InferContext& c) {
  detail::requireSameDType(c, 0, 1);
  Shape out;
  c.check(detail::broadcastShapes(c.shape(0), c.shape(1), out), "shapes {} and {} do not broadcast",
          c.shape(0).str(), c.shape(1).str());
  return {{c.dtype(0), out}};
}

std::vector<TensorType> floatUnaryInfer(const InferContext& c) {
  detail::requireFloat(c, 0);
  return {c.inputs[0]};
}

std::vector<TensorType> gradHelperInfer(const InferContext& c) {
  detail::requireSameDType(c, 0, 1);
  c.check(c.shape(0).compatibleWith(c.shape(1)), "gradient and value shapes differ");
  return {c.inputs[1]};
}

// ---- kernels -------------------------------------------------------------------------------

/// out = f(a, b) with broadcasting; `cost` is rough nanoseconds per element.
template <class T, class F>
void binaryLoop(const KernelContext& ctx, F f, int64_t cost = 1) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  Tensor& out = ctx.output(0);
  const T* pa = static_cast<const T*>(a.raw());
  const T* pb = static_cast<const T*>(b.raw());
  T* po = static_cast<T*>(out.raw());
  const int64_t n = out.numel();
  if (a.numel() == n && b.numel() == n) {
    ctx.parallelFor(n, cost, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) po[i] = f(pa[i], pb[i]);
    });
  } else if (b.numel() == 1 && a.numel() == n) {
    const T s = pb[0];
    ctx.parallelFor(n, cost, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) po[i] = f(pa[i], s);
    });
  } else if (a.numel() == 1 && b.numel() == n) {
    const T s = pa[0];
    ctx.parallelFor(n, cost, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) po[i] = f(s, pb[i]);
    });
  } else {
    const Broadcaster ba(out.shape(), a.shape()), bb(out.shape(), b.shape());
    const int64_t inner = ba.inner(), sa = ba.innerStride(), sb = bb.innerStride();
    ctx.parallelFor(ba.rows(), inner * cost, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* ra = pa + ba.rowOffset(r);
        const T* rb = pb + bb.rowOffset(r);
        T* ro = po + r * inner;
        // Strides known at compile time let the common cases (a bias row, a scale per row)
        // vectorise.
        if (sa == 1 && sb == 1) {
          for (int64_t j = 0; j < inner; ++j) ro[j] = f(ra[j], rb[j]);
        } else if (sa == 1 && sb == 0) {
          for (int64_t j = 0; j < inner; ++j) ro[j] = f(ra[j], rb[0]);
        } else if (sa == 0 && sb == 1) {
          for (int64_t j = 0; j < inner; ++j) ro[j] = f(ra[0], rb[j]);
        } else {
          for (int64_t j = 0; j < inner; ++j) ro[j] = f(ra[j * sa], rb[j * sb]);
        }
      }
    });
  }
}

template <class Op>
void binaryKernel(KernelContext& ctx) {
  dispatchDType(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    // A lambda, not a function pointer, so the loop inlines and vectorises.
    binaryLoop<T>(ctx, [](T a, T b) { return Op::template apply<T>(a, b); }, Op::kCost);
  });
}

void divKernel(KernelContext& ctx) {
  if (isInteger(ctx.input(1).dtype())) {
    dispatchIndex(ctx.input(1).dtype(), [&](auto z) {
      using T = decltype(z);
      const T* pb = ctx.input(1).data<T>();
      for (int64_t i = 0, n = ctx.input(1).numel(); i < n; ++i) {
        if (pb[i] == 0) ctx.fail("integer division by zero (divisor element {})", i);
      }
    });
  }
  binaryKernel<functors::Div>(ctx);
}

/// parallelFor over [0, n) in ranges that start at multiples of kChunk. Eigen evaluates the
/// tail of a range with scalar code that may round differently from its vector code, so fixed
/// boundaries keep results independent of the thread count.
template <class F>
void forAlignedChunks(const KernelContext& ctx, int64_t n, int64_t cost, F body) {
  constexpr int64_t kChunk = 256;
  ctx.parallelFor((n + kChunk - 1) / kChunk, cost * kChunk, [&](int64_t lo, int64_t hi) {
    body(lo * kChunk, std::min(n, hi * kChunk));
  });
}

/// out = f(x) chunk-wise on Eigen arrays (vectorised transcendental functions).
template <class F>
void floatUnary(KernelContext& ctx, int64_t cost, F f) {
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const T* pi = static_cast<const T*>(ctx.input(0).raw());
    T* po = static_cast<T*>(ctx.output(0).raw());
    forAlignedChunks(ctx, ctx.input(0).numel(), cost, [&](int64_t lo, int64_t hi) {
      ArrayMap<T> o(po + lo, hi - lo);
      ConstArrayMap<T> x(pi + lo, hi - lo);
      f(o, x);
    });
  });
}

#define WEFT_UNARY_KERNEL(Name, cost, expr)                                  \
  void Name(KernelContext& ctx) {                                            \
    floatUnary(ctx, cost, [](auto& o, const auto& x) { o = (expr); });       \
  }

using Eigen::numext::exp;
WEFT_UNARY_KERNEL(negKernel, 1, -x)
WEFT_UNARY_KERNEL(expKernel, 10, x.exp())
WEFT_UNARY_KERNEL(logKernel, 10, x.log())
WEFT_UNARY_KERNEL(tanhKernel, 10, x.tanh())
WEFT_UNARY_KERNEL(sigmoidKernel, 10, x.logistic())
WEFT_UNARY_KERNEL(reluKernel, 1, x.max(typename std::decay_t<decltype(x)>::Scalar(0)))
WEFT_UNARY_KERNEL(sqrtKernel, 5, x.sqrt())
WEFT_UNARY_KERNEL(rsqrtKernel, 5, x.rsqrt())
WEFT_UNARY_KERNEL(absKernel, 1, x.abs())
WEFT_UNARY_KERNEL(squareKernel, 1, x.square())
WEFT_UNARY_KERNEL(reciprocalKernel, 2, x.inverse())
WEFT_UNARY_KERNEL(signKernel, 1, x.sign())
WEFT_UNARY_KERNEL(sinKernel, 10, x.sin())
WEFT_UNARY_KERNEL(cosKernel, 10, x.cos())
#undef WEFT_UNARY_KERNEL

/// out = f(dy, y) for the fused activation gradients.
template <class F>
void gradHelper(KernelContext& ctx, F f) {
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const T* dy = static_cast<const T*>(ctx.input(0).raw());
    const T* y = static_cast<const T*>(ctx.input(1).raw());
    T* po = static_cast<T*>(ctx.output(0).raw());
    forAlignedChunks(ctx, ctx.output(0).numel(), 2, [&](int64_t lo, int64_t hi) {
      ArrayMap<T> o(po + lo, hi - lo);
      ConstArrayMap<T> g(dy + lo, hi - lo), v(y + lo, hi - lo);
      f(o, g, v);
    });
  });
}

// d/dx relu(x) = [y > 0]
void reluGradKernel(KernelContext& ctx) {
  gradHelper(ctx, [](auto& o, const auto& g, const auto& y) {
    using T = typename std::decay_t<decltype(g)>::Scalar;
    o = (y > T(0)).select(g, T(0));
  });
}
// d/dx sigmoid(x) = y (1 - y)
void sigmoidGradKernel(KernelContext& ctx) {
  gradHelper(ctx, [](auto& o, const auto& g, const auto& y) { o = g * y * (1 - y); });
}
// d/dx tanh(x) = 1 - y^2
void tanhGradKernel(KernelContext& ctx) {
  gradHelper(ctx, [](auto& o, const auto& g, const auto& y) { o = g * (1 - y.square()); });
}

void whereKernel(KernelContext& ctx) {
  const Tensor& c = ctx.input(0);
  Tensor& out = ctx.output(0);
  dispatchDType(out.dtype(), [&](auto z) {
    using T = decltype(z);
    dispatchDType(c.dtype(), [&](auto zc) {
      using C = decltype(zc);
      const Broadcaster bc(out.shape(), c.shape()), ba(out.shape(), ctx.input(1).shape()),
          bb(out.shape(), ctx.input(2).shape());
      const C* pc = static_cast<const C*>(c.raw());
      const T* pa = static_cast<const T*>(ctx.input(1).raw());
      const T* pb = static_cast<const T*>(ctx.input(2).raw());
      T* po = static_cast<T*>(out.raw());
      const int64_t inner = bc.inner();
      ctx.parallelFor(bc.rows(), inner, [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const C* rc = pc + bc.rowOffset(r);
          const T* ra = pa + ba.rowOffset(r);
          const T* rb = pb + bb.rowOffset(r);
          for (int64_t j = 0; j < inner; ++j) {
            po[r * inner + j] = rc[j * bc.innerStride()] != C(0) ? ra[j * ba.innerStride()] : rb[j * bb.innerStride()];
          }
        }
      });
    });
  });
}

void castKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.output(0);
  detail::castElements(ctx, x, out);
}

void addNKernel(KernelContext& ctx) {
  dispatchDType(ctx.output(0).dtype(), [&](auto z) {
    using T = decltype(z);
    T* po = static_cast<T*>(ctx.output(0).raw());
    const int k = ctx.numInputs();
    ctx.parallelFor(ctx.output(0).numel(), k, [&](int64_t lo, int64_t hi) {
      const T* first = static_cast<const T*>(ctx.input(0).raw());
      for (int64_t i = lo; i < hi; ++i) po[i] = first[i];
      for (int j = 1; j < k; ++j) {
        const T* p = static_cast<const T*>(ctx.input(j).raw());
        for (int64_t i = lo; i < hi; ++i) po[i] += p[i];
      }
    });
  });
}

void zerosKernel(KernelContext& ctx) { ctx.output(0).fill(0); }
void onesKernel(KernelContext& ctx) { ctx.output(0).fill(1); }

void checkNumericsKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  dispatchFloat(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* p = x.data<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      if (!std::isfinite(p[i])) {
        ctx.fail("{}: element {} of a tensor of shape {} is {}", ctx.attrs().get<std::string>("message"),
                 i, x.shape().str(), static_cast<double>(p[i]));
      }
    }
  });
  ctx.output(0).copyFrom(x);
}

// out (like's shape) = x summed over the axes on which `like` is broadcast to x.
void reduceToLikeKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.output(0);
  if (x.numel() == out.numel()) return detail::copyElements(ctx, x, out);
  dispatchDType(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* px = static_cast<const T*>(x.raw());
    T* po = static_cast<T*>(out.raw());
    std::fill(po, po + out.numel(), T(0));
    const Broadcaster bo(x.shape(), out.shape());
    const int64_t inner = bo.inner(), so = bo.innerStride();
    for (int64_t r = 0; r < bo.rows(); ++r) {
      T* ro = po + bo.rowOffset(r);
      const T* rx = px + r * inner;
      for (int64_t j = 0; j < inner; ++j) ro[j * so] += rx[j];
    }
  });
}

void broadcastLikeKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.output(0);
  dispatchDType(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* px = static_cast<const T*>(x.raw());
    T* po = static_cast<T*>(out.raw());
    const Broadcaster bx(out.shape(), x.shape());
    const int64_t inner = bx.inner(), sx = bx.innerStride();
    ctx.parallelFor(bx.rows(), inner, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* rx = px + bx.rowOffset(r);
        for (int64_t j = 0; j < inner; ++j) po[r * inner + j] = rx[j * sx];
      }
    });
  });
}

// ---- gradients -----------------------------------------------------------------------------

std::vector<Grad> addGrad(GradContext& c) { return {reduceToLike(c.dy(), c.x(0)), reduceToLike(c.dy(), c.x(1))}; }
std::vector<Grad> subGrad(GradContext& c) { return {reduceToLike(c.dy(), c.x(0)), reduceToLike(-c.dy(), c.x(1))}; }
std::vector<Grad> mulGrad(GradContext& c) {
  return {reduceToLike(c.dy() * c.x(1), c.x(0)), reduceToLike(c.dy() * c.x(0), c.x(1))};
}
// d(a/b)/da = 1/b;  d(a/b)/db = -a/b^2 = -y/b
std::vector<Grad> divGrad(GradContext& c) {
  return {reduceToLike(c.dy() / c.x(1), c.x(0)), reduceToLike(-(c.dy() * c.y()) / c.x(1), c.x(1))};
}
// Ties send the gradient to the first input.
std::vector<Grad> maxGrad(GradContext& c) {
  Output takeA = greaterEqual(c.x(0), c.x(1));
  return {reduceToLike(c.dy() * takeA, c.x(0)), reduceToLike(c.dy() * (1.0 - takeA), c.x(1))};
}
std::vector<Grad> minGrad(GradContext& c) {
  Output takeA = lessEqual(c.x(0), c.x(1));
  return {reduceToLike(c.dy() * takeA, c.x(0)), reduceToLike(c.dy() * (1.0 - takeA), c.x(1))};
}
// d(a^b)/da = b a^(b-1);  d(a^b)/db = a^b log a (0 where a <= 0)
std::vector<Grad> powGrad(GradContext& c) {
  Output a = c.x(0), b = c.x(1);
  Output da = c.dy() * b * pow(a, b - 1.0);
  Output safeLog = where(greater(a, scalarLike(a, 0)), log(maximum(a, scalarLike(a, 1e-30))), zerosLike(a));
  return {reduceToLike(da, a), reduceToLike(c.dy() * c.y() * safeLog, b)};
}

Output op1(const std::string& op, Output x) { return addOp1(x.graph(), op, {x}); }
Output op2(const std::string& op, Output a, Output b) { return addOp1(a.graph(), op, {a, b}); }

/// `halfInputs`: the inputs that may be 16-bit activations (OpDef::halfActivations); the CPU
/// kernel `k` is then run in f32 on such values.
void registerBinary(OpRegistry& r, const std::string& name, Kernel k, Kernel cudaKernel, GradFn grad,
                    std::vector<int> halfInputs = {}) {
  OpDef d(name);
  d.inputs(2).infer(broadcastInfer).cpu(k).cuda(cudaKernel).inplace(0);
  if (grad) d.grad(std::move(grad));
  else d.noGradient();
  if (!halfInputs.empty()) d.halfActivations(std::move(halfInputs), {0});
  r.add(std::move(d));
}

void registerUnary(OpRegistry& r, const std::string& name, Kernel k, Kernel cudaKernel, GradFn grad,
                   std::vector<int> halfInputs = {}) {
  OpDef d(name);
  d.inputs(1).infer(floatUnaryInfer).cpu(k).cuda(cudaKernel).inplace(0);
  if (grad) d.grad(std::move(grad));
  else d.noGradient();
  if (!halfInputs.empty()) d.halfActivations(std::move(halfInputs), {0});
  r.add(std::move(d));
}

}  // namespace

// ---- builders ------------------------------------------------------------------------------

Output scalarLike(Output x, double value) { return x.graph().scalar(value, x.dtype()); }
Output add(Output a, Output b) { return op2("Add", a, b); }
Output sub(Output a, Output b) { return op2("Sub", a, b); }
Output mul(Output a, Output b) { return op2("Mul", a, b); }
Output div(Output a, Output b) { return op2("Div", a, b); }
Output maximum(Output a, Output b) { return op2("Maximum", a, b); }
Output minimum(Output a, Output b) { return op2("Minimum", a, b); }
Output pow(Output a, Output b) { return op2("Pow", a, b); }
Output operator+(Output a, Output b) { return add(a, b); }
Output operator-(Output a, Output b) { return sub(a, b); }
Output operator*(Output a, Output b) { return mul(a, b); }
Output operator/(Output a, Output b) { return div(a, b); }
Output operator-(Output a) { return neg(a); }
Output operator+(Output a, double b) { return add(a, scalarLike(a, b)); }
Output operator-(Output a, double b) { return sub(a, scalarLike(a, b)); }
Output operator*(Output a, double b) { return mul(a, scalarLike(a, b)); }
Output operator/(Output a, double b) { return div(a, scalarLike(a, b)); }
Output operator+(double a, Output b) { return add(scalarLike(b, a), b); }
Output operator-(double a, Output b) { return sub(scalarLike(b, a), b); }
Output operator*(double a, Output b) { return mul(scalarLike(b, a), b); }
Output operator/(double a, Output b) { return div(scalarLike(b, a), b); }

Output neg(Output x) { return op1("Neg", x); }
Output exp(Output x) { return op1("Exp", x); }
Output log(Output x) { return op1("Log", x); }
Output tanh(Output x) { return op1("Tanh", x); }
Output sigmoid(Output x) { return op1("Sigmoid", x); }
Output relu(Output x) { return op1("Relu", x); }
Output sqrt(Output x) { return op1("Sqrt", x); }
Output rsqrt(Output x) { return op1("Rsqrt", x); }
Output abs(Output x) { return op1("Abs", x); }
Output square(Output x) { return op1("Square", x); }
Output reciprocal(Output x) { return op1("Reciprocal", x); }
Output sign(Output x) { return op1("Sign", x); }
Output sin(Output x) { return op1("Sin", x); }
Output cos(Output x) { return op1("Cos", x); }

Output less(Output a, Output b) { return op2("Less", a, b); }
Output lessEqual(Output a, Output b) { return op2("LessEqual", a, b); }
Output greater(Output a, Output b) { return op2("Greater", a, b); }
Output greaterEqual(Output a, Output b) { return op2("GreaterEqual", a, b); }
Output equal(Output a, Output b) { return op2("Equal", a, b); }
Output notEqual(Output a, Output b) { return op2("NotEqual", a, b); }
Output where(Output cond, Output a, Output b) { return addOp1(a.graph(), "Where", {cond, a, b}); }

Output cast(Output x, DType to) {
  if (x.dtype() == to) return x;
  return addOp1(x.graph(), "Cast", {x}, {{"dtype", to}});
}
Output addN(const std::vector<Output>& xs) {
  WEFT_CHECK(!xs.empty(), "addN of no tensors");
  if (xs.size() == 1) return xs[0];
  return addOp1(xs[0].graph(), "AddN", xs);
}
Output identity(Output x) { return op1("Identity", x); }
Output stopGradient(Output x) { return op1("StopGradient", x); }
Output zerosLike(Output x) { return op1("ZerosLike", x); }
Output onesLike(Output x) { return op1("OnesLike", x); }
Output reduceToLike(Output x, Output like) {
  if (x.shape() == like.shape() && x.shape().isFullyDefined()) return x;
  return op2("ReduceToLike", x, like);
}
Output broadcastLike(Output x, Output like) {
  if (x.shape() == like.shape() && x.shape().isFullyDefined()) return x;
  return op2("BroadcastLike", x, like);
}
Output checkNumerics(Output x, const std::string& message) {
  return addOp1(x.graph(), "CheckNumerics", {x}, {{"message", message}});
}

// ---- registration --------------------------------------------------------------------------

void detail::registerElementwiseOps(OpRegistry& r) {
  // Mixed precision keeps Add (residual sums), Relu, its gradient and AddN (gradient sums) in 16
  // bits between convolutions (ops/MixedPrecision.h).
  registerBinary(r, "Add", detail::inFloat32<binaryKernel<functors::Add>>, WEFT_CUDA_KERNEL(binary<functors::Add>),
                 addGrad, {0, 1});
  registerBinary(r, "Sub", binaryKernel<functors::Sub>, WEFT_CUDA_KERNEL(binary<functors::Sub>), subGrad);
  registerBinary(r, "Mul", binaryKernel<functors::Mul>, WEFT_CUDA_KERNEL(binary<functors::Mul>), mulGrad);
  registerBinary(r, "Div", divKernel, WEFT_CUDA_KERNEL(div), divGrad);
  registerBinary(r, "Maximum", binaryKernel<functors::Max>, WEFT_CUDA_KERNEL(binary<functors::Max>), maxGrad);
  registerBinary(r, "Minimum", binaryKernel<functors::Min>, WEFT_CUDA_KERNEL(binary<functors::Min>), minGrad);
  registerBinary(r, "Pow", binaryKernel<functors::Pow>, WEFT_CUDA_KERNEL(binary<functors::Pow>), powGrad);
  registerBinary(r, "Less", binaryKernel<functors::Less>, WEFT_CUDA_KERNEL(binary<functors::Less>), nullptr);
  registerBinary(r, "LessEqual", binaryKernel<functors::LessEqual>, WEFT_CUDA_KERNEL(binary<functors::LessEqual>),
                 nullptr);
  registerBinary(r, "Greater", binaryKernel<functors::Greater>, WEFT_CUDA_KERNEL(binary<functors::Greater>), nullptr);
  registerBinary(r, "GreaterEqual", binaryKernel<functors::GreaterEqual>,
                 WEFT_CUDA_KERNEL(binary<functors::GreaterEqual>), nullptr);
  registerBinary(r, "Equal", binaryKernel<functors::Equal>, WEFT_CUDA_KERNEL(binary<functors::Equal>), nullptr);
  registerBinary(r, "NotEqual", binaryKernel<functors::NotEqual>, WEFT_CUDA_KERNEL(binary<functors::NotEqual>),
                 nullptr);

  registerUnary(r, "Neg", negKernel, WEFT_CUDA_KERNEL(neg),
                [](GradContext& c) -> std::vector<Grad> { return {-c.dy()}; });
  // d/dx e^x = y
  registerUnary(r, "Exp", expKernel, WEFT_CUDA_KERNEL(exp),
                [](GradContext& c) -> std::vector<Grad> { return {c.dy() * c.y()}; });
  // d/dx log x = 1/x
  registerUnary(r, "Log", logKernel, WEFT_CUDA_KERNEL(log),
                [](GradContext& c) -> std::vector<Grad> { return {c.dy() / c.x(0)}; });
  registerUnary(r, "Tanh", tanhKernel, WEFT_CUDA_KERNEL(tanh), [](GradContext& c) -> std::vector<Grad> {
    return {op2("TanhGrad", c.dy(), c.y())};
  });
  registerUnary(r, "Sigmoid", sigmoidKernel, WEFT_CUDA_KERNEL(sigmoid), [](GradContext& c) -> std::vector<Grad> {
    return {op2("SigmoidGrad", c.dy(), c.y())};
  });
  registerUnary(r, "Relu", detail::inFloat32<reluKernel>, WEFT_CUDA_KERNEL(relu),
                [](GradContext& c) -> std::vector<Grad> { return {op2("ReluGrad", c.dy(), c.y())}; }, {0});
  // d/dx sqrt x = 1 / (2 y)
  registerUnary(r, "Sqrt", sqrtKernel, WEFT_CUDA_KERNEL(sqrt),
                [](GradContext& c) -> std::vector<Grad> { return {c.dy() * 0.5 / c.y()}; });
  // d/dx x^-1/2 = -y^3 / 2
  registerUnary(r, "Rsqrt", rsqrtKernel, WEFT_CUDA_KERNEL(rsqrt), [](GradContext& c) -> std::vector<Grad> {
    return {c.dy() * (-0.5) * c.y() * c.y() * c.y()};
  });
  registerUnary(r, "Abs", absKernel, WEFT_CUDA_KERNEL(abs),
                [](GradContext& c) -> std::vector<Grad> { return {c.dy() * sign(c.x(0))}; });
  registerUnary(r, "Square", squareKernel, WEFT_CUDA_KERNEL(square),
                [](GradContext& c) -> std::vector<Grad> { return {c.dy() * 2.0 * c.x(0)}; });
  // d/dx 1/x = -y^2
  registerUnary(r, "Reciprocal", reciprocalKernel, WEFT_CUDA_KERNEL(reciprocal),
                [](GradContext& c) -> std::vector<Grad> { return {-(c.dy() * c.y() * c.y())}; });
  registerUnary(r, "Sign", signKernel, WEFT_CUDA_KERNEL(sign), nullptr);  // zero almost everywhere
  registerUnary(r, "Sin", sinKernel, WEFT_CUDA_KERNEL(sin),
                [](GradContext& c) -> std::vector<Grad> { return {c.dy() * cos(c.x(0))}; });
  registerUnary(r, "Cos", cosKernel, WEFT_CUDA_KERNEL(cos),
                [](GradContext& c) -> std::vector<Grad> { return {-(c.dy() * sin(c.x(0)))}; });

  struct Helper {
    const char* name;
    Kernel cpu, cuda;
  };
  for (const Helper& h : {Helper{"SigmoidGrad", sigmoidGradKernel, WEFT_CUDA_KERNEL(sigmoidGrad)},
                          Helper{"TanhGrad", tanhGradKernel, WEFT_CUDA_KERNEL(tanhGrad)}}) {
    r.add(OpDef(h.name).inputs(2).infer(gradHelperInfer).cpu(h.cpu).cuda(h.cuda).inplace(0).noGradient());
  }
  r.add(OpDef("ReluGrad")
            .inputs(2)
            .infer(gradHelperInfer)
            .cpu(detail::inFloat32<reluGradKernel>)
            .cuda(WEFT_CUDA_KERNEL(reluGrad))
            .inplace(0)
            .noGradient()
            .halfActivations({0, 1}, {0}));

  r.add(OpDef("Where")
            .inputs(3)
            .infer([](const InferContext& c) -> std::vector<TensorType> {
              detail::requireSameDType(c, 1, 2);
              Shape ab, out;
              c.check(detail::broadcastShapes(c.shape(1), c.shape(2), ab) &&
                          detail::broadcastShapes(c.shape(0), ab, out),
                      "shapes {}, {} and {} do not broadcast", c.shape(0).str(), c.shape(1).str(),
                      c.shape(2).str());
              return {{c.dtype(1), out}};
            })
            .cpu(whereKernel).cuda(WEFT_CUDA_KERNEL(where))
            .grad([](GradContext& c) -> std::vector<Grad> {
              Output zero = zerosLike(c.dy());
              return {Grad(), reduceToLike(where(c.x(0), c.dy(), zero), c.x(1)),
                      reduceToLike(where(c.x(0), zero, c.dy()), c.x(2))};
            }));
  r.add(OpDef("Cast")
            .inputs(1)
            .infer([](const InferContext& c) -> std::vector<TensorType> {
              return {{c.attrs().get<DType>("dtype"), c.shape(0)}};
            })
            .cpu(castKernel).cuda(WEFT_CUDA_KERNEL(cast))
            .grad([](GradContext& c) -> std::vector<Grad> {
              if (!isFloating(c.x(0).dtype()) || !isFloating(c.y().dtype())) return {Grad()};
              return {cast(c.dy(), c.x(0).dtype())};
            }));
  r.add(OpDef("AddN")
            .inputs(1, -1)
            .infer([](const InferContext& c) -> std::vector<TensorType> {
              for (int i = 1; i < c.numInputs(); ++i) {
                detail::requireSameDType(c, 0, i);
                c.check(c.shape(i).compatibleWith(c.shape(0)), "input {} has shape {}, input 0 {}", i,
                        c.shape(i).str(), c.shape(0).str());
              }
              return {c.inputs[0]};
            })
            .cpu(detail::inFloat32<addNKernel>).cuda(WEFT_CUDA_KERNEL(addN))
            .grad([](GradContext& c) -> std::vector<Grad> {
              return std::vector<Grad>(c.node->inputs.size(), Grad(c.dy()));
            })
            .halfActivations({OpDef::kAllInputs}, {0}));
  r.add(OpDef("Identity")
            .inputs(1)
            .infer(detail::sameAsInput)
            .cpu(detail::copyKernel)
            .cuda(WEFT_CUDA_KERNEL(copy))
            .view(0)
            .grad([](GradContext& c) -> std::vector<Grad> { return {c.dy()}; }));
  r.add(OpDef("StopGradient")
            .inputs(1)
            .infer(detail::sameAsInput)
            .cpu(detail::copyKernel)
            .cuda(WEFT_CUDA_KERNEL(copy))
            .view(0)
            .noGradient());
  r.add(OpDef("ZerosLike")
            .inputs(1)
            .infer(detail::sameAsInput)
            .cpu(zerosKernel)
            .cuda(WEFT_CUDA_KERNEL(zeros))
            .inplace(0)
            .noGradient());
  r.add(OpDef("OnesLike")
            .inputs(1)
            .infer(detail::sameAsInput)
            .cpu(onesKernel)
            .cuda(WEFT_CUDA_KERNEL(ones))
            .inplace(0)
            .noGradient());
  r.add(OpDef("CheckNumerics").inputs(1).infer(floatUnaryInfer).cpu(checkNumericsKernel)
            .grad([](GradContext& c) -> std::vector<Grad> { return {c.dy()}; }));
  r.add(OpDef("ReduceToLike")
            .inputs(2)
            .infer([](const InferContext& c) -> std::vector<TensorType> {
              detail::requireSameDType(c, 0, 1);
              Shape b;
              c.check(detail::broadcastShapes(c.shape(0), c.shape(1), b) && b.compatibleWith(c.shape(0)),
                      "shape {} is not a broadcast of {}", c.shape(0).str(), c.shape(1).str());
              return {c.inputs[1]};
            })
            .cpu(detail::inFloat32<reduceToLikeKernel>).cuda(WEFT_CUDA_KERNEL(reduceToLike))
            .inplace(0)
            .grad([](GradContext& c) -> std::vector<Grad> { return {broadcastLike(c.dy(), c.x(0)), Grad()}; })
            .halfActivations({0, 1}, {0}));
  r.add(OpDef("BroadcastLike")
            .inputs(2)
            .infer([](const InferContext& c) -> std::vector<TensorType> {
              detail::requireSameDType(c, 0, 1);
              Shape b;
              c.check(detail::broadcastShapes(c.shape(0), c.shape(1), b) && b.compatibleWith(c.shape(1)),
                      "shape {} does not broadcast to {}", c.shape(0).str(), c.shape(1).str());
              return {c.inputs[1]};
            })
            .cpu(broadcastLikeKernel).cuda(WEFT_CUDA_KERNEL(broadcastLike))
            .grad([](GradContext& c) -> std::vector<Grad> { return {reduceToLike(c.dy(), c.x(0)), Grad()}; }));
}

}  // namespace weft
