#include "core/Tensor.h"

namespace weft {

Buffer::Buffer(size_t bytes, Device device) : Buffer(bytes, device, allocatorFor(device)) {}

Buffer::Buffer(size_t bytes, Device device, Allocator& allocator)
    : allocator_(&allocator), data_(allocator.allocate(bytes)), bytes_(bytes), device_(device) {}

Buffer::~Buffer() { allocator_->deallocate(data_, bytes_); }

Tensor::Tensor(DType dtype, Shape shape, Device device) : dtype_(dtype), shape_(std::move(shape)) {
  WEFT_CHECK(shape_.isFullyDefined(), "cannot allocate a tensor of partially known shape {}",
             shape_.str());
  buffer_ = std::make_shared<Buffer>(shape_.bytes(dtypeSize(dtype_)), device);
}

Tensor::Tensor(std::shared_ptr<Buffer> buffer, size_t offset, DType dtype, Shape shape)
    : buffer_(std::move(buffer)), offset_(offset), dtype_(dtype), shape_(std::move(shape)) {
  const size_t bytes = shape_.bytes(dtypeSize(dtype_));
  WEFT_CHECK(offset_ <= buffer_->bytes() && bytes <= buffer_->bytes() - offset_,
             "tensor view of {} bytes at offset {} overruns a buffer of {} bytes", bytes, offset_,
             buffer_->bytes());
}

Tensor Tensor::pinned(DType dtype, Shape shape) {
  WEFT_CHECK(shape.isFullyDefined(), "cannot allocate a tensor of partially known shape {}", shape.str());
  const size_t bytes = shape.bytes(dtypeSize(dtype));
  return Tensor(std::make_shared<Buffer>(bytes, cpu(), pinnedHostAllocator()), 0, dtype, std::move(shape));
}

Tensor Tensor::zeros(DType dtype, Shape shape) { return full(dtype, std::move(shape), 0.0); }

Tensor Tensor::full(DType dtype, Shape shape, double value) {
  Tensor t(dtype, std::move(shape));
  t.fill(value);
  return t;
}

Device Tensor::device() const { return buffer_ ? buffer_->device() : cpu(); }

Tensor Tensor::to(const Device& device) const {
  if (device == this->device()) return *this;
  Tensor t(dtype_, shape_, device);
  copyBytes(t.raw(), device, raw(), this->device(), bytes());
  return t;
}

double Tensor::at(int64_t i) const {
  WEFT_CHECK(i >= 0 && i < numel(), "element {} is out of range for a tensor of shape {}", i,
             shape_.str());
  if (device().type != DeviceType::CPU) return to(cpu()).at(i);
  return dispatchStorage(dtype_, [&](auto t) {
    using T = decltype(t);
    return convertElement<double>(static_cast<const T*>(raw())[i]);
  });
}

double Tensor::item() const {
  WEFT_CHECK(numel() == 1, "item() needs a one-element tensor, got shape {}", shape_.str());
  return at(0);
}

std::vector<double> Tensor::toDoubles() const {
  if (device().type != DeviceType::CPU) return to(cpu()).toDoubles();
  std::vector<double> out(static_cast<size_t>(numel()));
  dispatchStorage(dtype_, [&](auto t) {
    using T = decltype(t);
    const T* p = static_cast<const T*>(raw());
    for (size_t i = 0; i < out.size(); ++i) out[i] = convertElement<double>(p[i]);
  });
  return out;
}

Tensor Tensor::clone() const {
  Tensor t(dtype_, shape_, device());
  copyBytes(t.raw(), device(), raw(), device(), bytes());
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  WEFT_CHECK(shape.numel() == numel(), "cannot reshape a tensor of shape {} to {}", shape_.str(),
             shape.str());
  return Tensor(buffer_, offset_, dtype_, std::move(shape));
}

void Tensor::copyFrom(const Tensor& src) {
  WEFT_CHECK(src.dtype_ == dtype_ && src.numel() == numel(),
             "copy of a {} tensor of shape {} into a {} tensor of shape {}", dtypeName(src.dtype_),
             src.shape_.str(), dtypeName(dtype_), shape_.str());
  if (raw() != src.raw()) copyBytes(raw(), device(), src.raw(), src.device(), bytes());
}

void Tensor::fill(double value) {
  if (device().type != DeviceType::CPU) {
    copyFrom(Tensor::full(dtype_, shape_, value));
    return;
  }
  dispatchStorage(dtype_, [&](auto t) {
    using T = decltype(t);
    T* p = static_cast<T*>(raw());
    const T v = convertElement<T>(value);
    for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = v;
  });
}

#ifdef WEFT_HAVE_CUDA
namespace detail {
// core/cuda/Runtime.cpp
std::vector<Tensor> cudaUpload(const std::vector<Tensor>& tensors, int index);
}  // namespace detail
#endif

std::vector<Tensor> uploadTo(const std::vector<Tensor>& tensors, const Device& device) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    WEFT_CHECK(t.defined(), "uploadTo {}: tensor {} is empty", device.str(), i);
    WEFT_CHECK(device.type == DeviceType::CPU || t.device().type == DeviceType::CPU || t.device() == device,
               "uploadTo {}: tensor {} ({}{}) is on {}; only host tensors are uploaded", device.str(), i,
               dtypeName(t.dtype()), t.shape().str(), t.device().str());
  }
  if (device.type == DeviceType::CPU) {
    std::vector<Tensor> out;
    for (const Tensor& t : tensors) out.push_back(t.to(cpu()));
    return out;
  }
#ifdef WEFT_HAVE_CUDA
  return detail::cudaUpload(tensors, device.index);
#else
  WEFT_THROW("device {} is not available: {}", device.str(), cudaUnavailableReason());
#endif
}

Tensor Tensor::cast(DType to) const {
  if (device().type != DeviceType::CPU) return this->to(cpu()).cast(to).to(device());
  Tensor out(to, shape_);
  dispatchStorage(dtype_, [&](auto s) {
    using S = decltype(s);
    dispatchStorage(to, [&](auto d) {
      using D = decltype(d);
      const S* src = static_cast<const S*>(raw());
      D* dst = static_cast<D*>(out.raw());
      for (int64_t i = 0, n = numel(); i < n; ++i) dst[i] = convertElement<D>(src[i]);
    });
  });
  return out;
}

}  // namespace weft
