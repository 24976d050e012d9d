#include "data/Dataset.h"

#include "core/Hash.h"
#include "core/Random.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

namespace weft::data {
namespace {

bool isPadded(const BatchOptions& o, const std::string& field) {
  return std::find(o.padded.begin(), o.padded.end(), field) != o.padded.end();
}

/// A batch field made of fixed-shape example tensors: (batch, ...shape).
Tensor stack(const std::vector<const Example*>& examples, const std::string& field) {
  const Tensor& first = examples[0]->at(field);
  std::vector<int64_t> dims{static_cast<int64_t>(examples.size())};
  dims.insert(dims.end(), first.shape().dims().begin(), first.shape().dims().end());
  Tensor out(first.dtype(), Shape(dims));
  char* dst = static_cast<char*>(out.raw());
  for (size_t i = 0; i < examples.size(); ++i) {
    const Tensor& t = examples[i]->at(field);
    WEFT_CHECK(t.dtype() == first.dtype() && t.shape() == first.shape(),
               "collate: field '{}' is {}{} in example {} but {}{} in example 0", field, dtypeName(t.dtype()),
               t.shape().str(), i, dtypeName(first.dtype()), first.shape().str());
    if (t.bytes()) std::memcpy(dst + i * t.bytes(), t.raw(), t.bytes());
  }
  return out;
}

/// A batch field made of 1-D sequences: (batch, longest) padded with `pad`, and its mask.
std::pair<Tensor, Tensor> padSequences(const std::vector<const Example*>& examples, const std::string& field,
                                       double pad) {
  const DType dtype = examples[0]->at(field).dtype();
  int64_t longest = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const Tensor& t = examples[i]->at(field);
    WEFT_CHECK(t.rank() == 1 && t.dtype() == dtype, "collate: padded field '{}' must hold 1-D {} sequences; example {} is {}{}",
               field, dtypeName(dtype), i, dtypeName(t.dtype()), t.shape().str());
    longest = std::max(longest, t.numel());
  }
  const auto n = static_cast<int64_t>(examples.size());
  Tensor out = Tensor::full(dtype, {n, longest}, pad);
  Tensor mask = Tensor::zeros(f32, {n, longest});
  const size_t elem = dtypeSize(dtype);
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& t = examples[static_cast<size_t>(i)]->at(field);
    if (t.numel()) std::memcpy(static_cast<char*>(out.raw()) + i * longest * static_cast<int64_t>(elem), t.raw(), t.bytes());
    std::fill_n(mask.data<float>() + i * longest, t.numel(), 1.0f);
  }
  return {out, mask};
}

int64_t lengthOf(const Example& e, const std::string& field) { return e.at(field).numel(); }

}  // namespace

Dataset Dataset::shard(int64_t index, int64_t count) const {
  WEFT_CHECK(count > 0 && index >= 0 && index < count, "shard {} of {} is not a valid shard", index, count);
  std::vector<Example> out;
  for (size_t i = static_cast<size_t>(index); i < size(); i += static_cast<size_t>(count)) out.push_back((*examples_)[i]);
  return Dataset(std::move(out));
}

Dataset Dataset::range(size_t begin, size_t end) const {
  WEFT_CHECK(begin <= end && end <= size(), "range [{}, {}) of a dataset of {} examples", begin, end, size());
  return Dataset(std::vector<Example>(examples_->begin() + static_cast<std::ptrdiff_t>(begin),
                                      examples_->begin() + static_cast<std::ptrdiff_t>(end)));
}

uint64_t Dataset::hash() const {
  uint64_t h = 0;
  for (const Example& example : *examples_) {
    for (const auto& [field, t] : example) {
      const int64_t layout[3] = {static_cast<int64_t>(field.size()), static_cast<int64_t>(t.dtype()), t.rank()};
      h = xxh64(layout, sizeof layout, h);
      h = xxh64(field.data(), field.size(), h);
      h = xxh64(t.shape().dims().data(), t.shape().dims().size() * sizeof(int64_t), h);
      h = xxh64(t.raw(), t.bytes(), h);
    }
  }
  return h;
}

Batch sliceBatch(const Batch& batch, int64_t index, int64_t count, const std::vector<std::string>& shared) {
  WEFT_CHECK(count > 0 && index >= 0 && index < count, "batch slice {} of {} is not a valid slice", index, count);
  Batch out;
  for (const auto& [field, value] : batch) {
    if (std::find(shared.begin(), shared.end(), field) != shared.end()) {
      out[field] = value;
      continue;
    }
    WEFT_CHECK(value.shape().rank() >= 1 && value.shape()[0] % count == 0,
               "batch field '{}' of shape {} cannot be cut into {} equal parts along its first axis", field,
               value.shape().str(), count);
    const int64_t rows = value.shape()[0] / count;
    Shape shape = value.shape();
    shape[0] = rows;
    Tensor part(value.dtype(), shape);
    const size_t bytes = part.bytes();
    std::memcpy(part.raw(), static_cast<const char*>(value.raw()) + static_cast<size_t>(index) * bytes, bytes);
    out[field] = part;
  }
  return out;
}

Batch collate(const std::vector<const Example*>& examples, const BatchOptions& options) {
  WEFT_CHECK(!examples.empty(), "collate of no examples");
  Batch batch;
  for (const auto& [field, value] : *examples[0]) {
    for (size_t i = 1; i < examples.size(); ++i) {
      WEFT_CHECK(examples[i]->count(field), "collate: example {} has no field '{}'", i, field);
    }
    if (isPadded(options, field)) {
      auto [values, mask] = padSequences(examples, field, options.padValue);
      batch[field] = values;
      if (std::find(options.counted.begin(), options.counted.end(), field) != options.counted.end()) {
        double real = 0;
        for (const float m : mask.toVector<float>()) real += m;
        batch[field + "_count"] = Tensor::scalar(f32, real);
      }
      batch[field + "_mask"] = mask;
    } else {
      batch[field] = stack(examples, field);
    }
  }
  return batch;
}

Batcher::Batcher(Dataset dataset, BatchOptions options) : dataset_(std::move(dataset)), options_(std::move(options)) {
  WEFT_CHECK(options_.batchSize > 0, "batch size must be positive, got {}", options_.batchSize);
  perEpoch_ = static_cast<int64_t>(dataset_.size()) / options_.batchSize;
  WEFT_CHECK(perEpoch_ > 0, "a dataset of {} examples holds no batch of {}", dataset_.size(), options_.batchSize);
  for (const std::string& field : options_.padded) {
    WEFT_CHECK(dataset_[0].count(field), "padded field '{}' is not a field of the examples", field);
  }
}

void Batcher::prepareEpoch(int64_t epoch) {
  std::vector<size_t> order(dataset_.size());
  std::iota(order.begin(), order.end(), 0);
  if (options_.shuffle) {
    const uint64_t key = streamKey(options_.seed, "epoch" + std::to_string(epoch));
    for (size_t k = order.size(); k > 1; --k) {
      std::swap(order[k - 1], order[static_cast<size_t>(uniformAt(key, k) * static_cast<double>(k))]);
    }
  }
  const auto batch = static_cast<size_t>(options_.batchSize);
  order.resize(static_cast<size_t>(perEpoch_) * batch);
  if (options_.bucketWindow > 1 && !options_.padded.empty()) {
    // Sort each window of batches by length so that batches hold similar lengths, then shuffle
    // the batches of the window so long and short ones alternate.
    const size_t window = batch * static_cast<size_t>(options_.bucketWindow);
    const std::string& field = options_.padded.front();
    for (size_t w = 0; w < order.size(); w += window) {
      auto begin = order.begin() + static_cast<std::ptrdiff_t>(w);
      auto end = order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), w + window));
      std::stable_sort(begin, end, [&](size_t a, size_t b) { return lengthOf(dataset_[a], field) < lengthOf(dataset_[b], field); });
    }
  }
  batches_.assign(static_cast<size_t>(perEpoch_), {});
  for (size_t b = 0; b < batches_.size(); ++b) {
    batches_[b].assign(order.begin() + static_cast<std::ptrdiff_t>(b * batch), order.begin() + static_cast<std::ptrdiff_t>((b + 1) * batch));
  }
  if (options_.bucketWindow > 1 && options_.shuffle) {
    const uint64_t key = streamKey(options_.seed, "buckets" + std::to_string(epoch));
    for (size_t k = batches_.size(); k > 1; --k) {
      std::swap(batches_[k - 1], batches_[static_cast<size_t>(uniformAt(key, k) * static_cast<double>(k))]);
    }
  }
  epoch_ = epoch;
}

Batch Batcher::next() {
  WEFT_CHECK(position_ < std::numeric_limits<int64_t>::max(), "Batcher: batch position {} is the last an int64_t holds",
             position_);
  const int64_t epoch = position_ / perEpoch_;
  if (epoch != epoch_) prepareEpoch(epoch);
  const std::vector<size_t>& ids = batches_[static_cast<size_t>(position_ % perEpoch_)];
  std::vector<const Example*> examples;
  examples.reserve(ids.size());
  for (size_t i : ids) examples.push_back(&dataset_[i]);
  ++position_;
  return collate(examples, options_);
}

void Batcher::seek(int64_t position) {
  WEFT_CHECK(position >= 0, "cannot seek to batch {}", position);
  position_ = position;
}

Batch uploadBatch(const Batch& batch, const Device& device) {
  if (device.type == DeviceType::CPU) return batch;
  std::vector<Tensor> fields;
  for (const auto& [name, t] : batch) fields.push_back(t);
  fields = uploadTo(fields, device);
  Batch out;
  size_t i = 0;
  for (const auto& [name, t] : batch) out[name] = std::move(fields[i++]);
  return out;
}

Prefetcher::Prefetcher(BatchSource& source, PrefetchOptions options) : source_(source), options_(std::move(options)) {
  WEFT_CHECK(options_.depth > 0, "prefetch depth must be positive");
  consumed_ = source_.position();
  start();
}

Prefetcher::Prefetcher(BatchSource& source, size_t depth) : Prefetcher(source, PrefetchOptions{depth, {}, cpu()}) {}

Prefetcher::~Prefetcher() { stop(); }

void Prefetcher::start() {
  stopping_ = false;
  worker_ = std::thread([this] { run(); });
}

void Prefetcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void Prefetcher::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || ready_.size() < options_.depth; });
      if (stopping_ || error_) return;
    }
    try {
      Prefetched b = prepare(source_.next());
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.push_back(std::move(b));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
    changed_.notify_all();
  }
}

Prefetched Prefetcher::prepare(Batch batch) const {
  Batch prepared = options_.transform ? options_.transform(batch) : batch;
  return {std::move(batch), uploadBatch(prepared, options_.device)};
}

Prefetched Prefetcher::nextPrefetched() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty() || error_; });
  if (ready_.empty()) std::rethrow_exception(error_);
  Prefetched b = std::move(ready_.front());
  ready_.pop_front();
  ++consumed_;
  lock.unlock();
  changed_.notify_all();
  return b;
}

int64_t Prefetcher::position() const { return consumed_; }

void Prefetcher::seek(int64_t position) {
  stop();
  ready_.clear();
  error_ = nullptr;
  source_.seek(position);
  consumed_ = position;
  start();
}

}  // namespace weft::data
