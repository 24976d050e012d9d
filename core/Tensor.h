// Tensor: a typed, shaped view of a reference-counted buffer on a device.
#pragma once

#include "core/DType.h"
#include "core/Device.h"
#include "core/Error.h"
#include "core/Half.h"
#include "core/Shape.h"

#include <cstring>
#include <memory>
#include <vector>

namespace weft {

/// A block of device memory, freed when the last tensor that views it goes away.
class Buffer {
 public:
  /// From the device's own allocator.
  Buffer(size_t bytes, Device device);
  /// From `allocator`, which must serve `device` and outlive the buffer.
  Buffer(size_t bytes, Device device, Allocator& allocator);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }
  Allocator& allocator() const { return *allocator_; }

 private:
  Allocator* allocator_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
};

/// A dense, row-major tensor on a device. Copies share the buffer; `clone()` copies the data.
/// `data<T>()` points into the device's memory: only kernels of that device may dereference it.
///
///     Tensor t = Tensor::fromVector<float>({1, 2, 3, 4}, {2, 2});
///     float* p = t.data<float>();
class Tensor {
 public:
  Tensor() = default;
  /// Allocates an uninitialised tensor (the shape must be fully defined).
  Tensor(DType dtype, Shape shape, Device device = cpu());
  /// A view of `bytes` within an existing buffer, starting at `offset`.
  Tensor(std::shared_ptr<Buffer> buffer, size_t offset, DType dtype, Shape shape);

  /// An uninitialised host tensor in pinned memory (pinnedHostAllocator()).
  static Tensor pinned(DType dtype, Shape shape);
  static Tensor zeros(DType dtype, Shape shape);
  /// A tensor filled with `value` converted to `dtype`.
  static Tensor full(DType dtype, Shape shape, double value);
  static Tensor scalar(DType dtype, double value) { return full(dtype, {}, value); }
  template <class T>
  static Tensor fromVector(const std::vector<T>& values, Shape shape);

  bool defined() const { return buffer_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t numel() const { return shape_.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype_); }
  Device device() const;

  void* raw() const { return static_cast<char*>(buffer_->data()) + offset_; }
  template <class T>
  T* data() const {
    WEFT_CHECK(dtype_ == DTypeOf<T>::value, "tensor of dtype {} accessed as {}", dtypeName(dtype_),
               dtypeName(DTypeOf<T>::value));
    return static_cast<T*>(raw());
  }
  /// Element `i` (flat index) converted to double, for tests and diagnostics (a GPU tensor is
  /// copied to the host first).
  double at(int64_t i) const;
  /// The single element of a one-element tensor, as double.
  double item() const;
  /// All elements, on the host.
  template <class T>
  std::vector<T> toVector() const {
    if (device().type != DeviceType::CPU) return to(cpu()).toVector<T>();
    const T* p = data<T>();
    return std::vector<T>(p, p + numel());
  }
  /// All elements converted to double.
  std::vector<double> toDoubles() const;

  /// A deep copy on the same device.
  Tensor clone() const;
  /// This tensor on `device`: itself when it is there already, else a copy.
  Tensor to(const Device& device) const;
  /// The same data under another shape with the same element count.
  Tensor reshaped(Shape shape) const;
  /// Copies `src` (same dtype and element count, any device) into this tensor's memory.
  void copyFrom(const Tensor& src);
  /// Sets every element to `value` converted to this dtype.
  void fill(double value);
  /// A copy converted to another dtype.
  Tensor cast(DType to) const;

  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }
  size_t offset() const { return offset_; }

 private:
  std::shared_ptr<Buffer> buffer_;
  size_t offset_ = 0;
  DType dtype_ = DType::F32;
  Shape shape_;
};

template <class T>
Tensor Tensor::fromVector(const std::vector<T>& values, Shape shape) {
  WEFT_CHECK(shape.numel() == static_cast<int64_t>(values.size()),
             "Tensor::fromVector: {} values for shape {}", values.size(), shape.str());
  Tensor t(DTypeOf<T>::value, std::move(shape));
  if (!values.empty()) std::memcpy(t.raw(), values.data(), values.size() * sizeof(T));
  return t;
}

/// `tensors` on `device`, returned once they are there, without waiting for the device's compute
/// stream: host tensors go through pinned staging buffers onto a stream of the GPU's own for
/// uploads, so a loader thread calling this overlaps the copies with the step being computed.
/// The results may be fed to any Session on that device. Tensors already on `device` come back
/// as they are; to the CPU, each tensor's host copy. Uploading a tensor that is on another GPU
/// is an error.
std::vector<Tensor> uploadTo(const std::vector<Tensor>& tensors, const Device& device);

/// Calls `f(T{})` with T the C++ type of a computing dtype (F32, F64, I32, I64).
template <class F>
decltype(auto) dispatchDType(DType t, F&& f) {
  switch (t) {
    case DType::F32: return f(float{});
    case DType::F64: return f(double{});
    case DType::I32: return f(int32_t{});
    case DType::I64: return f(int64_t{});
    default: WEFT_THROW("dtype {} has no CPU kernels", dtypeName(t));
  }
}

/// Calls `f(T{})` with T the C++ type of any dtype, the 16-bit storage types included.
template <class F>
decltype(auto) dispatchStorage(DType t, F&& f) {
  switch (t) {
    case DType::BF16: return f(BFloat16{});
    case DType::F16: return f(Float16{});
    default: return dispatchDType(t, std::forward<F>(f));
  }
}

/// Calls `f(T{})` with T float or double; throws for other dtypes.
template <class F>
decltype(auto) dispatchFloat(DType t, F&& f) {
  switch (t) {
    case DType::F32: return f(float{});
    case DType::F64: return f(double{});
    default: WEFT_THROW("dtype {} is not a floating type with CPU kernels", dtypeName(t));
  }
}

/// Calls `f(T{})` with T int32_t or int64_t; throws for other dtypes.
template <class F>
decltype(auto) dispatchIndex(DType t, F&& f) {
  switch (t) {
    case DType::I32: return f(int32_t{});
    case DType::I64: return f(int64_t{});
    default: WEFT_THROW("dtype {} is not an index type (i32 or i64)", dtypeName(t));
  }
}

}  // namespace weft
