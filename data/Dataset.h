// Datasets of examples and the batch streams a trainer reads: seeded shuffling, batching,
// padding of variable-length fields with masks, bucketing by length, sharding, and a background
// prefetch thread.
//
//     Dataset all = loadSomething(...);
//     Batcher train(all, {.batchSize = 64, .padded = {"tokens"}});
//     train.readPart(rank, workers);   // this worker's part of every batch, and only it is read
//     Batch b = train.next();   // b["tokens"] (64 / workers, T), b["tokens_mask"] likewise
#pragma once

#include "core/Tensor.h"
#include "core/ThreadPool.h"

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace weft::data {

/// A batch: tensors by name. A model's placeholders carry the same names.
using Batch = std::map<std::string, Tensor>;

/// One example: named tensors.
using Example = std::map<std::string, Tensor>;

/// An endless, deterministic stream of batches whose position can be saved and restored, so a
/// resumed run sees exactly the batches an uninterrupted run would.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch next() = 0;
  /// Batches handed out so far.
  virtual int64_t position() const = 0;
  /// Continues as if `position` batches had been handed out.
  virtual void seek(int64_t position) = 0;
  virtual int64_t batchesPerEpoch() const = 0;
  /// A hash of the examples the stream draws from (not of their order), which a checkpoint
  /// records so that a resume on other data is refused. Reads every example once.
  virtual uint64_t dataHash() const = 0;
  /// Makes the stream give part `index` of `count` of each batch it would give (as a
  /// data-parallel worker needs), reading only that part. False where the stream cannot: its
  /// reader then cuts whole batches.
  virtual bool readPart(int64_t /*index*/, int64_t /*count*/) { return false; }
};

/// How a generated dataset makes its examples: on demand, from their index alone.
struct Generator {
  size_t size = 0;
  std::function<Example(size_t)> make;
  /// The length of 1-D field `field` of example i without making the example: a batch's padding
  /// widths and the bucketing by length need the lengths of examples a worker does not read.
  /// Unset: the example is made to measure it.
  std::function<int64_t(size_t, const std::string&)> length;
  /// Stands for the examples in Dataset::hash(): a hash of the generator's parameters.
  uint64_t identity = 0;
};

/// An immutable list of examples, held or generated; copies share it.
class Dataset {
 public:
  Dataset() : examples_(std::make_shared<std::vector<Example>>()) {}
  explicit Dataset(std::vector<Example> examples)
      : examples_(std::make_shared<std::vector<Example>>(std::move(examples))) {}
  /// Examples made when read and never held, so that a worker reading a part of every batch
  /// makes only that part, and a dataset larger than memory costs none.
  static Dataset generated(Generator generator);

  size_t size() const { return generator_ ? generator_->size : examples_->size(); }
  /// Example i of a held dataset; throws for a generated one, whose examples exist only as
  /// example(i) makes them.
  const Example& operator[](size_t i) const;
  /// Example i, made now when generated (a held one's tensors are shared, not copied).
  Example example(size_t i) const;
  /// The number of elements of field `field` of example i.
  int64_t length(size_t i, const std::string& field) const;
  bool isGenerated() const { return generator_ != nullptr; }
  /// The same examples, all made now and held: for data read again and again (an evaluation
  /// set), where making it once beats making it at every read.
  Dataset held() const;

  /// Examples i with i % count == index: shards are disjoint, cover the dataset, and do not
  /// depend on anything but (index, count). A generated dataset's shard is generated too.
  Dataset shard(int64_t index, int64_t count) const;
  /// Examples [begin, end).
  Dataset range(size_t begin, size_t end) const;
  /// Held: XXH64 over every example in order, its fields' names, dtypes, shapes and bytes.
  /// Generated: the generator's identity (mixed with the shard or range taken of it), since
  /// hashing would make every example.
  uint64_t hash() const;

 private:
  /// The examples of this dataset are examples index(i) of the generator's.
  Dataset remapped(size_t size, std::function<size_t(size_t)> index, uint64_t identity) const;
  /// A generated shard's or range's identity: the generator's mixed with `layout`.
  uint64_t derivedIdentity(const uint64_t (&layout)[3]) const;

  std::shared_ptr<const std::vector<Example>> examples_;
  std::shared_ptr<const Generator> generator_;
};

struct BatchOptions {
  int64_t batchSize = 32;
  bool shuffle = true;
  uint64_t seed = 1;
  /// Fields holding 1-D sequences of varying length: padded with padValue to the longest in the
  /// batch, giving (batch, T), plus "<field>_mask" (batch, T) f32 with 1 on real positions.
  std::vector<std::string> padded;
  double padValue = 0;
  /// When > 1 and `padded` is not empty: each window of this many batches is sorted by the first
  /// padded field's length before it is cut into batches, so batches hold similar lengths.
  int64_t bucketWindow = 0;
  /// Padded fields whose real positions are also counted into a scalar f64 field
  /// "<field>_count": a batch's real tokens, to normalise a loss by the tokens of the whole batch
  /// when workers each take a part of it.
  std::vector<std::string> counted;
  /// For generated data dearer to make than to hold (images): while whole batches are read, an
  /// example made once is kept for later epochs. A Batcher reading a part keeps nothing, since
  /// each epoch's parts hold other examples.
  bool keepGenerated = false;
  /// Applied to each example, as made (or kept), while its batch is made — on the prefetch thread
  /// in training — and before collate: random crops and flips of images, say. `key` is
  /// augmentKey(seed, epoch, i) for example i of the dataset in the batch's epoch and depends on
  /// nothing else, so an example is augmented afresh each epoch, a resumed run (Batcher::seek)
  /// sees the augmentations an uninterrupted one would, and a part read with Batcher::readPart
  /// holds exactly the examples of the whole batch's part. Draw from the key alone (Draws in
  /// core/Random.h). It must keep the lengths of padded fields, which bucketing and a part's
  /// widths measure without it. Unset: the examples as they are.
  ///
  ///     options.augment = imageFolderAugment({.size = 224});   // data/ImageFolder.h
  std::function<Example(Example, uint64_t key)> augment = {};
  /// When > 1: the dataset is this many streams of consecutive examples (streamRange), and each
  /// batch is batchSize / streams examples of every stream, stream after stream. Each stream is
  /// shuffled (and bucketed) within itself, so a part of the batch that readPart gives a worker
  /// holds examples of its streams only: a worker of N reading streams / N streams makes (and a
  /// lazily read dataset reads) only those. The order depends on the stream count, not on who
  /// reads it, so one process reading S streams sees the batches S workers see together. An
  /// epoch ends when its shortest stream does. 1: one stream, the order of a plain shuffle.
  int64_t streams = 1;
  /// Threads that make a batch's examples (read or generate, then augment), each example whole on
  /// one of them, for data dearer to make than to train on (an image folder's decoding). The
  /// batch is the same bytes at any count; the dataset's generator and `augment` must be safe to
  /// call from several threads at once (weft's are: each depends on its index or key alone).
  int threads = 1;
};

/// Examples [first, last) of stream `stream` of `streams` over `size` examples: consecutive,
/// as even as whole examples allow.
std::pair<size_t, size_t> streamRange(int64_t stream, int64_t streams, size_t size);
/// The stream of `streams` over `size` examples that holds example `index`.
int64_t streamOf(size_t index, int64_t streams, size_t size);

/// The key BatchOptions::augment receives for example `index` of the dataset in epoch `epoch`.
uint64_t augmentKey(uint64_t seed, int64_t epoch, size_t index);

/// Part `index` of `count` equal parts of a batch, cut along the leading (example) axis of every
/// field except the `shared` ones, which every part keeps whole (per-step values such as sampled
/// candidates). How data-parallel workers share one total batch; throws naming a field whose
/// rows do not divide evenly.
Batch sliceBatch(const Batch& batch, int64_t index, int64_t count, const std::vector<std::string>& shared = {});

/// The batch with `fields` cut along their second axis to the longest real row, as `mask` (one
/// of them: (batch, width), 1 at real positions, 0 at the padding after them) says: the
/// trailing positions that are padding in every row are dropped. A pipeline's micro-batch then
/// runs its own sequences' length, not the whole batch's. Throws naming a field that is not
/// (batch, width, ...) with the mask's batch and width.
Batch trimPadding(Batch batch, const std::string& mask, const std::vector<std::string>& fields);

/// Stacks examples into a batch: fixed-shape fields gain a leading batch axis; padded fields
/// are padded and masked. Throws naming the field when shapes or dtypes disagree.
Batch collate(const std::vector<const Example*>& examples, const BatchOptions& options);

/// Pointers to each example, for collate.
std::vector<const Example*> pointersTo(const std::vector<Example>& examples);

/// collate of examples [begin, end) of `dataset`.
Batch collate(const Dataset& dataset, size_t begin, size_t end, const BatchOptions& options);

/// Batches of a dataset, epoch after epoch; the order of epoch e is a function of (seed, e).
/// The last partial batch of an epoch is dropped, so every batch has batchSize examples.
class Batcher : public BatchSource {
 public:
  Batcher(Dataset dataset, BatchOptions options);

  /// From now on each batch is part `index` of `count` of the batch it would be, exactly as
  /// sliceBatch cuts it, and only that part's examples are read (or made): padded fields keep
  /// the whole batch's widths, and each counted field's count is the whole batch's divided by
  /// `count`, so that the parts' mean loss is the whole batch's. Every part has the same number
  /// of batches per epoch. Throws when batchSize is not a multiple of `count`.
  bool readPart(int64_t index, int64_t count) override;
  Batch next() override;
  int64_t position() const override { return position_; }
  void seek(int64_t position) override;
  int64_t batchesPerEpoch() const override { return perEpoch_; }
  uint64_t dataHash() const override { return dataset_.hash(); }

 private:
  void prepareEpoch(int64_t epoch);
  /// The example indices of each batch's share of stream `stream` in epoch `epoch`, before the
  /// batches are shuffled.
  std::vector<std::vector<size_t>> streamBatches(int64_t stream, int64_t epoch) const;
  /// Example i, made or kept as options_.keepGenerated says.
  Example exampleAt(size_t i);

  Dataset dataset_;
  BatchOptions options_;
  int64_t perEpoch_;
  int64_t part_ = 0;
  int64_t parts_ = 1;
  int64_t position_ = 0;
  int64_t epoch_ = -1;
  std::vector<std::vector<size_t>> batches_;  // example indices of each batch of the epoch
  std::vector<Example> kept_;                  // see BatchOptions::keepGenerated; empty: not made yet
  std::shared_ptr<ThreadPool> pool_;           // BatchOptions::threads > 1
};

/// Every field of `batch` on `device` (see uploadTo: through pinned buffers, on the GPU's upload
/// stream); on the CPU, the batch itself.
Batch uploadBatch(const Batch& batch, const Device& device);

struct PrefetchOptions {
  /// Batches prepared ahead of the one being trained on.
  size_t depth = 2;
  /// Applied to each batch on the prefetch thread, before the copy to `device` (a data-parallel
  /// worker's part of a total batch, say); unset: the batch as it is.
  std::function<Batch(const Batch&)> transform;
  /// Where next() hands batches out. A GPU's are uploaded on the prefetch thread, so the copies
  /// overlap the step being computed and the step finds its inputs already there.
  Device device = cpu();
};

/// A batch as the source made it (on the host) and as the prefetcher hands it out.
struct Prefetched {
  Batch source;
  Batch prepared;
};

/// Runs a source ahead on a background thread, overlapping loading (and the transform and the
/// upload of PrefetchOptions) with training. Errors from the source or the transform surface on
/// the next call to next(). position() counts the batches handed out, not those prepared ahead.
/// The source must outlive the prefetcher and must not be used directly while it runs.
class Prefetcher : public BatchSource {
 public:
  explicit Prefetcher(BatchSource& source, PrefetchOptions options = {});
  Prefetcher(BatchSource& source, size_t depth);
  ~Prefetcher() override;

  /// The next prepared batch.
  Batch next() override { return nextPrefetched().prepared; }
  /// The next batch, prepared and as the source made it.
  Prefetched nextPrefetched();
  int64_t position() const override;
  void seek(int64_t position) override;
  int64_t batchesPerEpoch() const override { return source_.batchesPerEpoch(); }
  uint64_t dataHash() const override { return source_.dataHash(); }

 private:
  void stop();
  void start();
  void run();
  Prefetched prepare(Batch batch) const;

  BatchSource& source_;
  PrefetchOptions options_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Prefetched> ready_;
  std::exception_ptr error_;
  bool stopping_ = false;
  int64_t consumed_ = 0;
  std::thread worker_;
};

}  // namespace weft::data
