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

/// What a part of a batch takes from the whole batch, so that every part pads and normalises as
/// the whole does: each padded field's width and each counted field's count.
struct WholeBatch {
  std::map<std::string, int64_t> widths;
  std::map<std::string, double> counts;
  int64_t parts = 1;
};

/// A batch field made of 1-D sequences: (batch, width) padded with `pad`, and its mask; the
/// width is the longest sequence, or `width` when that is given.
std::pair<Tensor, Tensor> padSequences(const std::vector<const Example*>& examples, const std::string& field,
                                       double pad, int64_t width) {
  const DType dtype = examples[0]->at(field).dtype();
  int64_t longest = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const Tensor& t = examples[i]->at(field);
    WEFT_CHECK(t.rank() == 1 && t.dtype() == dtype,
               "collate: padded field '{}' must hold 1-D {} sequences; example {} is {}{}", field, dtypeName(dtype), i,
               dtypeName(t.dtype()), t.shape().str());
    longest = std::max(longest, t.numel());
  }
  WEFT_CHECK(width < 0 || width >= longest, "collate: padded field '{}' holds a sequence of {} in a batch {} wide",
             field, longest, width);
  if (width >= 0) longest = width;
  const auto n = static_cast<int64_t>(examples.size());
  Tensor out = Tensor::full(dtype, {n, longest}, pad);
  Tensor mask = Tensor::zeros(f32, {n, longest});
  const size_t elem = dtypeSize(dtype);
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& t = examples[static_cast<size_t>(i)]->at(field);
    if (t.numel())
      std::memcpy(static_cast<char*>(out.raw()) + i * longest * static_cast<int64_t>(elem), t.raw(), t.bytes());
    std::fill_n(mask.data<float>() + i * longest, t.numel(), 1.0f);
  }
  return {out, mask};
}

bool isCounted(const BatchOptions& o, const std::string& field) {
  return std::find(o.counted.begin(), o.counted.end(), field) != o.counted.end();
}

/// collate, for the part of a batch when `whole` is given.
Batch collateOf(const std::vector<const Example*>& examples, const BatchOptions& options, const WholeBatch* whole) {
  WEFT_CHECK(!examples.empty(), "collate of no examples");
  Batch batch;
  for (const auto& [field, value] : *examples[0]) {
    for (size_t i = 1; i < examples.size(); ++i) {
      WEFT_CHECK(examples[i]->count(field), "collate: example {} has no field '{}'", i, field);
    }
    if (!isPadded(options, field)) {
      batch[field] = stack(examples, field);
      continue;
    }
    auto [values, mask] = padSequences(examples, field, options.padValue, whole ? whole->widths.at(field) : -1);
    if (isCounted(options, field)) {
      double real = 0;
      if (whole) {
        real = whole->counts.at(field) / static_cast<double>(whole->parts);
      } else {
        for (const float m : mask.toVector<float>()) real += m;
      }
      batch[field + "_count"] = Tensor::scalar(f64, real);
    }
    batch[field] = values;
    batch[field + "_mask"] = mask;
  }
  return batch;
}

}  // namespace

Dataset Dataset::generated(Generator generator) {
  WEFT_CHECK(static_cast<bool>(generator.make), "a generated dataset of {} examples has no maker", generator.size);
  Dataset d;
  d.generator_ = std::make_shared<const Generator>(std::move(generator));
  return d;
}

const Example& Dataset::operator[](size_t i) const {
  WEFT_CHECK(!generator_, "example {} of a generated dataset is made by example({}), not held to be referred to", i, i);
  WEFT_CHECK(i < size(), "example {} of a dataset of {} examples", i, size());
  return (*examples_)[i];
}

Example Dataset::example(size_t i) const {
  WEFT_CHECK(i < size(), "example {} of a dataset of {} examples", i, size());
  return generator_ ? generator_->make(i) : (*examples_)[i];
}

int64_t Dataset::length(size_t i, const std::string& field) const {
  WEFT_CHECK(i < size(), "example {} of a dataset of {} examples", i, size());
  if (generator_ && generator_->length) return generator_->length(i, field);
  const auto numel = [&](const Example& example) {
    const auto it = example.find(field);
    WEFT_CHECK(it != example.end(), "example {} has no field '{}'", i, field);
    return it->second.numel();
  };
  return generator_ ? numel(generator_->make(i)) : numel((*this)[i]);
}

Dataset Dataset::held() const {
  if (!generator_) return *this;
  std::vector<Example> examples;
  examples.reserve(size());
  for (size_t i = 0; i < size(); ++i) examples.push_back(generator_->make(i));
  return Dataset(std::move(examples));
}

Dataset Dataset::remapped(size_t size, std::function<size_t(size_t)> index, uint64_t identity) const {
  if (!generator_) {
    std::vector<Example> out;
    out.reserve(size);
    for (size_t i = 0; i < size; ++i) out.push_back((*examples_)[index(i)]);
    return Dataset(std::move(out));
  }
  Generator g;
  g.size = size;
  g.make = [source = generator_, index](size_t i) { return source->make(index(i)); };
  if (generator_->length) {
    g.length = [source = generator_, index](size_t i, const std::string& field) {
      return source->length(index(i), field);
    };
  }
  g.identity = identity;
  return generated(std::move(g));
}

uint64_t Dataset::derivedIdentity(const uint64_t (&layout)[3]) const {
  return generator_ ? xxh64(layout, sizeof layout, generator_->identity) : 0;
}

Dataset Dataset::shard(int64_t index, int64_t count) const {
  WEFT_CHECK(count > 0 && index >= 0 && index < count, "shard {} of {} is not a valid shard", index, count);
  const auto first = static_cast<size_t>(index), step = static_cast<size_t>(count);
  const size_t n = first < size() ? (size() - first + step - 1) / step : 0;
  const uint64_t layout[3] = {0x5348415244, first, step};  // "SHARD"
  return remapped(n, [first, step](size_t i) { return first + i * step; }, derivedIdentity(layout));
}

Dataset Dataset::range(size_t begin, size_t end) const {
  WEFT_CHECK(begin <= end && end <= size(), "range [{}, {}) of a dataset of {} examples", begin, end, size());
  const uint64_t layout[3] = {0x52414e4745, begin, end};  // "RANGE"
  return remapped(end - begin, [begin](size_t i) { return begin + i; }, derivedIdentity(layout));
}

uint64_t Dataset::hash() const {
  if (generator_) return generator_->identity;
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
  return collateOf(examples, options, nullptr);
}

Batch trimPadding(Batch batch, const std::string& mask, const std::vector<std::string>& fields) {
  WEFT_CHECK(batch.count(mask), "trimPadding: the batch has no mask field '{}'", mask);
  const Tensor& real = batch.at(mask);
  WEFT_CHECK(real.rank() == 2 && real.dtype() == f32, "trimPadding: mask '{}' must be f32 (batch, width), got {}{}",
             mask, dtypeName(real.dtype()), real.shape().str());
  const int64_t rows = real.shape()[0], width = real.shape()[1];
  for (const std::string& field : fields) {
    auto it = batch.find(field);
    WEFT_CHECK(it != batch.end(), "trimPadding: the batch has no field '{}'", field);
    const Shape& shape = it->second.shape();
    WEFT_CHECK(shape.rank() >= 2 && shape[0] == rows && shape[1] == width,
               "trimPadding: field '{}' is {}, not ({}, {}, ...) as its mask '{}'", field, shape.str(), rows, width,
               mask);
  }
  int64_t longest = 0;
  const float* m = real.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = width; t > longest; --t)
      if (m[r * width + t - 1] != 0) {
        longest = t;
        break;
      }
  if (longest == width || rows == 0) return batch;
  for (const std::string& field : fields) {
    Tensor& value = batch.at(field);
    const Tensor full = value;
    Shape shape = full.shape();
    shape[1] = longest;
    Tensor cut(full.dtype(), shape);
    const size_t inner = full.bytes() / static_cast<size_t>(rows * width), kept = inner * static_cast<size_t>(longest);
    for (int64_t r = 0; r < rows; ++r)
      if (kept > 0)
        std::memcpy(static_cast<char*>(cut.raw()) + static_cast<size_t>(r) * kept,
                    static_cast<const char*>(full.raw()) + static_cast<size_t>(r * width) * inner, kept);
    value = cut;
  }
  return batch;
}

std::vector<const Example*> pointersTo(const std::vector<Example>& examples) {
  std::vector<const Example*> pointers;
  pointers.reserve(examples.size());
  for (const Example& e : examples) pointers.push_back(&e);
  return pointers;
}

Batch collate(const Dataset& dataset, size_t begin, size_t end, const BatchOptions& options) {
  WEFT_CHECK(begin <= end && end <= dataset.size(), "collate of examples [{}, {}) of a dataset of {}", begin, end,
             dataset.size());
  std::vector<Example> examples;
  for (size_t i = begin; i < end; ++i) examples.push_back(dataset.example(i));
  return collate(pointersTo(examples), options);
}

uint64_t augmentKey(uint64_t seed, int64_t epoch, size_t index) {
  return stepKey(stepKey(streamKey(seed, "augment"), static_cast<uint64_t>(epoch)), index);
}

std::pair<size_t, size_t> streamRange(int64_t stream, int64_t streams, size_t size) {
  WEFT_CHECK(streams >= 1 && stream >= 0 && stream < streams, "stream {} of {} is not a stream", stream, streams);
  const auto bound = [&](int64_t j) {
    return static_cast<size_t>(static_cast<unsigned __int128>(size) * static_cast<uint64_t>(j) /
                               static_cast<uint64_t>(streams));
  };
  return {bound(stream), bound(stream + 1)};
}

int64_t streamOf(size_t index, int64_t streams, size_t size) {
  WEFT_CHECK(index < size, "example {} of {} is in no stream", index, size);
  // streamRange cuts [0, size) evenly: the stream is found from its estimate.
  auto stream = static_cast<int64_t>(static_cast<unsigned __int128>(index) * static_cast<uint64_t>(streams) / size);
  while (streamRange(stream, streams, size).first > index) --stream;
  while (streamRange(stream, streams, size).second <= index) ++stream;
  return stream;
}

Batcher::Batcher(Dataset dataset, BatchOptions options) : dataset_(std::move(dataset)), options_(std::move(options)) {
  WEFT_CHECK(options_.batchSize > 0, "batch size must be positive, got {}", options_.batchSize);
  WEFT_CHECK(options_.threads >= 1 && options_.threads <= 1024, "a batch is made by 1 to 1024 threads, not {}",
             options_.threads);
  WEFT_CHECK(options_.streams >= 1 && options_.batchSize % options_.streams == 0,
             "a batch of {} examples cannot take an equal share of each of {} streams", options_.batchSize,
             options_.streams);
  if (options_.threads > 1) pool_ = std::make_shared<ThreadPool>(options_.threads);
  const int64_t perStream = options_.batchSize / options_.streams;
  perEpoch_ = std::numeric_limits<int64_t>::max();
  for (int64_t j = 0; j < options_.streams; ++j) {
    const auto [first, last] = streamRange(j, options_.streams, dataset_.size());
    perEpoch_ = std::min(perEpoch_, static_cast<int64_t>(last - first) / perStream);
  }
  WEFT_CHECK(perEpoch_ > 0, "a dataset of {} examples holds no batch of {}{}", dataset_.size(), options_.batchSize,
             options_.streams > 1 ? fmt::format(" ({} from each of {} streams)", perStream, options_.streams) : "");
}

std::vector<std::vector<size_t>> Batcher::streamBatches(int64_t stream, int64_t epoch) const {
  const auto [first, last] = streamRange(stream, options_.streams, dataset_.size());
  std::vector<size_t> order(last - first);
  std::iota(order.begin(), order.end(), first);
  if (options_.shuffle) {
    const uint64_t epochKey = streamKey(options_.seed, "epoch" + std::to_string(epoch));
    const uint64_t key = options_.streams == 1 ? epochKey : stepKey(epochKey, static_cast<uint64_t>(stream));
    for (size_t k = order.size(); k > 1; --k) {
      std::swap(order[k - 1], order[static_cast<size_t>(uniformAt(key, k) * static_cast<double>(k))]);
    }
  }
  const auto batch = static_cast<size_t>(options_.batchSize / options_.streams);
  order.resize(static_cast<size_t>(perEpoch_) * batch);
  if (options_.bucketWindow > 1 && !options_.padded.empty()) {
    // Sort each window of batches by length so that batches hold similar lengths; the batches are
    // shuffled afterwards so that long and short ones alternate.
    const size_t window = batch * static_cast<size_t>(options_.bucketWindow);
    const std::string& field = options_.padded.front();
    for (size_t w = 0; w < order.size(); w += window) {
      auto begin = order.begin() + static_cast<std::ptrdiff_t>(w);
      auto end = order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), w + window));
      std::vector<std::pair<int64_t, size_t>> byLength;
      for (auto it = begin; it != end; ++it) byLength.emplace_back(dataset_.length(*it, field), *it);
      std::stable_sort(byLength.begin(), byLength.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      for (auto it = begin; it != end; ++it) *it = byLength[static_cast<size_t>(it - begin)].second;
    }
  }
  std::vector<std::vector<size_t>> batches(static_cast<size_t>(perEpoch_));
  for (size_t b = 0; b < batches.size(); ++b) {
    batches[b].assign(order.begin() + static_cast<std::ptrdiff_t>(b * batch),
                      order.begin() + static_cast<std::ptrdiff_t>((b + 1) * batch));
  }
  return batches;
}

void Batcher::prepareEpoch(int64_t epoch) {
  // Every stream's batches are shuffled alike, so the k-th shortest of each window meet in a batch.
  std::vector<size_t> shuffled(static_cast<size_t>(perEpoch_));
  std::iota(shuffled.begin(), shuffled.end(), 0);
  if (options_.bucketWindow > 1 && options_.shuffle) {
    const uint64_t key = streamKey(options_.seed, "buckets" + std::to_string(epoch));
    for (size_t k = shuffled.size(); k > 1; --k) {
      std::swap(shuffled[k - 1], shuffled[static_cast<size_t>(uniformAt(key, k) * static_cast<double>(k))]);
    }
  }
  batches_.assign(static_cast<size_t>(perEpoch_), {});
  for (int64_t j = 0; j < options_.streams; ++j) {
    const std::vector<std::vector<size_t>> ofStream = streamBatches(j, epoch);
    for (size_t b = 0; b < batches_.size(); ++b) {
      const std::vector<size_t>& part = ofStream[shuffled[b]];
      batches_[b].insert(batches_[b].end(), part.begin(), part.end());
    }
  }
  epoch_ = epoch;
}

Example Batcher::exampleAt(size_t i) {
  if (!options_.keepGenerated || !dataset_.isGenerated() || parts_ > 1) return dataset_.example(i);
  // Sized before a batch's examples are made (on several threads, each its own entry).
  if (kept_[i].empty()) kept_[i] = dataset_.example(i);
  return kept_[i];
}

bool Batcher::readPart(int64_t index, int64_t count) {
  WEFT_CHECK(count > 0 && index >= 0 && index < count, "Batcher: part {} of {} is not a valid part", index, count);
  WEFT_CHECK(options_.batchSize % count == 0, "Batcher: a batch of {} examples cannot be cut into {} equal parts",
             options_.batchSize, count);
  part_ = index;
  parts_ = count;
  kept_.clear();
  return true;
}

Batch Batcher::next() {
  WEFT_CHECK(position_ < std::numeric_limits<int64_t>::max(), "Batcher: batch position {} is the last an int64_t holds",
             position_);
  const int64_t epoch = position_ / perEpoch_;
  if (epoch != epoch_) prepareEpoch(epoch);
  const std::vector<size_t>& ids = batches_[static_cast<size_t>(position_ % perEpoch_)];
  const size_t per = ids.size() / static_cast<size_t>(parts_), first = static_cast<size_t>(part_) * per;
  if (kept_.empty() && options_.keepGenerated && dataset_.isGenerated() && parts_ == 1) kept_.resize(dataset_.size());
  std::vector<Example> examples(per);
  const auto make = [&](int64_t begin, int64_t end) {
    for (auto j = static_cast<size_t>(begin); j < static_cast<size_t>(end); ++j) {
      const size_t i = ids[first + j];
      Example example = exampleAt(i);
      if (options_.augment) example = options_.augment(std::move(example), augmentKey(options_.seed, epoch, i));
      examples[j] = std::move(example);
    }
  };
  // An example (a decoded, cropped image) costs a millisecond or more: one each is worth a hand-off.
  if (pool_) pool_->parallelFor(static_cast<int64_t>(per), 1 << 20, make);
  else make(0, static_cast<int64_t>(per));
  for (const std::string& field : options_.padded) {
    WEFT_CHECK(examples.empty() || examples.front().count(field), "padded field '{}' is not a field of the examples",
               field);
  }
  const std::vector<const Example*> pointers = pointersTo(examples);
  ++position_;
  if (parts_ == 1) return collate(pointers, options_);
  // The widths and counts of the whole batch, from the lengths of the examples of other parts.
  WholeBatch whole;
  whole.parts = parts_;
  for (const std::string& field : options_.padded) {
    int64_t width = 0;
    double count = 0;
    for (size_t i : ids) {
      const int64_t length = dataset_.length(i, field);
      width = std::max(width, length);
      count += static_cast<double>(length);
    }
    whole.widths[field] = width;
    whole.counts[field] = count;
  }
  return collateOf(pointers, options_, &whole);
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
