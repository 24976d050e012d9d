#include "dist/amp/Payloads.h"

#include "core/Error.h"

#include <algorithm>
#include <cstring>

namespace weft::amp {

Tensor hostCopy(const Tensor& t) { return t.device().type == DeviceType::CPU ? t.clone() : t.to(cpu()); }

void addInto(Tensor& sum, const Tensor& value) {
  if (!value.defined()) return;
  if (!sum.defined()) {
    sum = hostCopy(value);
    return;
  }
  if (sum.device().type != DeviceType::CPU) sum = sum.to(cpu());
  const Tensor x = value.to(cpu());
  WEFT_CHECK(sum.dtype() == x.dtype() && sum.shape() == x.shape(), "amp: adding gradients {}{} and {}{}",
             dtypeName(sum.dtype()), sum.shape().str(), dtypeName(x.dtype()), x.shape().str());
  int64_t n = sum.numel();
  if (sum.dtype() == f64) {
    double* s = sum.data<double>();
    const double* v = x.data<double>();
    for (int64_t i = 0; i < n; ++i) s[i] += v[i];
  } else {
    WEFT_CHECK(sum.dtype() == f32, "amp: gradients of dtype {} cannot be summed", dtypeName(sum.dtype()));
    float* s = sum.data<float>();
    const float* v = x.data<float>();
    for (int64_t i = 0; i < n; ++i) s[i] += v[i];
  }
}

Tensor scaled(const Tensor& x, double factor) {
  Tensor out = hostCopy(x);
  const int64_t n = out.numel();  // Shape::numel() checks for overflow: once, not per element
  if (out.dtype() == f64) {
    double* p = out.data<double>();
    for (int64_t i = 0; i < n; ++i) p[i] *= factor;
  } else {
    float* p = out.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(p[i] * factor);
  }
  return out;
}

int64_t lastWidth(const Tensor& t) { return t.rank() == 0 ? 1 : t.shape()[t.rank() - 1]; }

Tensor concatLast(const std::vector<Tensor>& parts) {
  Shape shape = parts[0].shape();
  int64_t width = 0;
  for (const Tensor& p : parts) {
    WEFT_CHECK(p.dtype() == parts[0].dtype() && p.rank() == shape.rank() && p.rank() >= 1 &&
                   p.numel() / lastWidth(p) == parts[0].numel() / lastWidth(parts[0]),
               "amp: concatenating payloads {} and {}", parts[0].shape().str(), p.shape().str());
    width += lastWidth(p);
  }
  shape[shape.rank() - 1] = width;
  Tensor out(parts[0].dtype(), shape);
  size_t element = dtypeSize(out.dtype());
  int64_t rows = out.numel() / std::max<int64_t>(width, 1);
  char* dst = static_cast<char*>(out.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (const Tensor& p : parts) {
      size_t bytes = static_cast<size_t>(lastWidth(p)) * element;
      std::memcpy(dst, static_cast<const char*>(p.raw()) + static_cast<size_t>(r) * bytes, bytes);
      dst += bytes;
    }
  return out;
}

std::vector<Tensor> splitLast(const Tensor& x, const std::vector<int64_t>& widths) {
  int64_t total = 0;
  for (int64_t w : widths) total += w;
  WEFT_CHECK(x.rank() >= 1 && lastWidth(x) == total, "amp: splitting a payload {} into widths summing to {}",
             x.shape().str(), total);
  size_t element = dtypeSize(x.dtype());
  int64_t rows = x.numel() / std::max<int64_t>(total, 1);
  std::vector<Tensor> parts;
  std::vector<char*> dst;
  for (int64_t w : widths) {
    Shape s = x.shape();
    s[s.rank() - 1] = w;
    parts.emplace_back(x.dtype(), s);
    dst.push_back(static_cast<char*>(parts.back().raw()));
  }
  const char* src = static_cast<const char*>(x.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (size_t i = 0; i < widths.size(); ++i) {
      size_t bytes = static_cast<size_t>(widths[i]) * element;
      std::memcpy(dst[i], src, bytes);
      dst[i] += bytes;
      src += bytes;
    }
  return parts;
}

Tensor stackRows(const std::vector<Tensor>& rows) {
  std::vector<int64_t> dims = rows[0].shape().dims();
  dims.insert(dims.begin(), static_cast<int64_t>(rows.size()));
  Tensor out(rows[0].dtype(), Shape(dims));
  char* dst = static_cast<char*>(out.raw());
  for (const Tensor& r : rows) {
    WEFT_CHECK(r.dtype() == rows[0].dtype() && r.shape() == rows[0].shape(), "amp: grouping payloads {} and {}",
               rows[0].shape().str(), r.shape().str());
    std::memcpy(dst, r.raw(), r.bytes());
    dst += r.bytes();
  }
  return out;
}

Tensor row(const Tensor& x, int64_t i) {
  std::vector<int64_t> dims(x.shape().dims().begin() + 1, x.shape().dims().end());
  Tensor out(x.dtype(), Shape(dims));
  std::memcpy(out.raw(), static_cast<const char*>(x.raw()) + static_cast<size_t>(i) * out.bytes(), out.bytes());
  return out;
}

/// Gradients of payloads no gradient reaches (an id) travel as empty tensors: zero.
std::vector<Tensor> rowsOrEmpty(const Tensor& grad, int64_t n) {
  std::vector<Tensor> rows(static_cast<size_t>(n));
  if (grad.defined())
    for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = row(grad, i);
  return rows;
}

Tensor stackOrEmpty(std::vector<Tensor>& rows) {
  const Tensor* any = nullptr;
  for (const Tensor& r : rows)
    if (r.defined()) any = &r;
  if (any == nullptr) return {};
  for (Tensor& r : rows)
    if (!r.defined()) r = Tensor::zeros(any->dtype(), any->shape());
  return stackRows(rows);
}

}  // namespace weft::amp
