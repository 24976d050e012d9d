// Datasets and batch streams: sharding, shuffling per epoch, padding and masks, bucketing,
// seeking, and the prefetch thread.
#include "tests/TestUtil.h"

#include "core/Random.h"
#include "data/Dataset.h"

#include <numeric>
#include <set>

using namespace weft;
using data::Batch;
using data::BatchOptions;
using data::Dataset;
using data::Example;

namespace {

/// Example i: {"id": i64 scalar i, "seq": i32 [1 + i % 5] filled with i}.
Dataset numbered(int64_t n) {
  std::vector<Example> out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = 1 + i % 5;
    out.push_back({{"id", Tensor::fromVector<int64_t>({i}, {})},
                   {"seq", Tensor::full(i32, {len}, static_cast<double>(i))}});
  }
  return Dataset(std::move(out));
}

std::vector<double> ids(const Batch& b) { return b.at("id").toDoubles(); }

/// numbered(n), generated: example i made when read, counting each make in `made[i]`; lengths
/// are told without making.
Dataset numberedGenerated(int64_t n, std::shared_ptr<std::vector<int>> made) {
  const Dataset held = numbered(n);
  data::Generator g;
  g.size = static_cast<size_t>(n);
  g.make = [held, made](size_t i) {
    ++(*made)[i];
    return held.example(i);
  };
  g.length = [](size_t i, const std::string&) { return static_cast<int64_t>(1 + i % 5); };
  g.identity = 42;
  made->assign(static_cast<size_t>(n), 0);
  return Dataset::generated(std::move(g));
}

void checkSameBatch(const Batch& got, const Batch& expected) {
  REQUIRE(got.size() == expected.size());
  for (const auto& [field, value] : expected) {
    INFO("field " << field);
    REQUIRE(got.count(field));
    CHECK(got.at(field).dtype() == value.dtype());
    CHECK(got.at(field).shape() == value.shape());
    CHECK(got.at(field).toDoubles() == value.toDoubles());
  }
}

/// Part `index` of `count` of a whole batch as the trainer cut it before parts were read: the
/// slice, with the counted field's count divided among the parts.
Batch slicedPart(const Batch& whole, int64_t index, int64_t count) {
  Batch part = data::sliceBatch(whole, index, count, {"seq_count"});
  part["seq_count"] = Tensor::scalar(f64, whole.at("seq_count").item() / static_cast<double>(count));
  return part;
}

}  // namespace

TEST_CASE("shards are disjoint, cover the dataset and are deterministic") {
  const Dataset d = numbered(10);
  std::multiset<double> seen;
  for (int64_t k = 0; k < 3; ++k) {
    const Dataset s = d.shard(k, 3);
    for (size_t i = 0; i < s.size(); ++i) seen.insert(s[i].at("id").item());
    CHECK(s.size() == (k == 0 ? 4u : 3u));
  }
  CHECK(seen.size() == 10);
  CHECK(std::set<double>(seen.begin(), seen.end()).size() == 10);
  CHECK(d.shard(1, 3)[0].at("id").item() == 1);
  CHECK_THROWS_AS(d.shard(3, 3), Error);
}

TEST_CASE("a generated dataset makes an example only when it is read, and equals the held one") {
  auto made = std::make_shared<std::vector<int>>();
  const Dataset generated = numberedGenerated(20, made);
  CHECK(generated.isGenerated());
  CHECK(generated.size() == 20);
  CHECK(generated.length(7, "seq") == 3);
  CHECK(std::count(made->begin(), made->end(), 0) == 20);
  checkSameBatch(generated.example(7), numbered(20)[7]);
  CHECK(contains(errorOf([&] { generated[7]; }), "example 7 of a generated dataset is made by example(7)"));
  CHECK((*made)[7] == 1);
  const Dataset held = generated.held();
  CHECK_FALSE(held.isGenerated());
  for (size_t i = 0; i < held.size(); ++i) checkSameBatch(held[i], numbered(20)[i]);
}

TEST_CASE("a generated dataset's shards and ranges are generated, and hash by identity") {
  auto made = std::make_shared<std::vector<int>>();
  const Dataset generated = numberedGenerated(20, made);
  const Dataset shard = generated.shard(2, 3), range = generated.range(5, 9);
  CHECK(shard.isGenerated());
  CHECK(std::count(made->begin(), made->end(), 0) == 20);
  REQUIRE(shard.size() == 6);
  for (size_t i = 0; i < shard.size(); ++i) CHECK(shard.example(i).at("id").item() == static_cast<double>(2 + 3 * i));
  CHECK(shard.length(1, "seq") == 1 + 5 % 5);
  REQUIRE(range.size() == 4);
  CHECK(range.example(0).at("id").item() == 5);
  CHECK(generated.hash() == 42);
  CHECK(shard.hash() != generated.hash());
  CHECK(shard.hash() != generated.shard(1, 3).hash());
  CHECK(range.hash() == generated.range(5, 9).hash());
}

TEST_CASE("each part of a batch is the whole batch's slice, with its widths and counts") {
  for (const bool generated : {false, true}) {
    for (const int64_t parts : {2, 4}) {
      INFO((generated ? "generated" : "held") << " dataset, " << parts << " parts");
      auto made = std::make_shared<std::vector<int>>();
      const Dataset d = generated ? numberedGenerated(64, made) : numbered(64);
      const BatchOptions options{8, true, 5, {"seq"}, -1, 3, {"seq"}};  // shuffled, padded, counted, bucketed
      data::Batcher whole(d, options);
      std::vector<data::Batcher> part;
      for (int64_t r = 0; r < parts; ++r) {
        part.emplace_back(d, options);
        CHECK(part.back().readPart(r, parts));
      }
      for (int64_t step = 0; step < 2 * whole.batchesPerEpoch(); ++step) {
        const Batch batch = whole.next();
        for (int64_t r = 0; r < parts; ++r)
          checkSameBatch(part[static_cast<size_t>(r)].next(), slicedPart(batch, r, parts));
      }
    }
  }
}

TEST_CASE("over an epoch the parts read every example once, each only its own") {
  auto made = std::make_shared<std::vector<int>>();
  const Dataset d = numberedGenerated(48, made);
  const BatchOptions options{12, true, 2, {"seq"}, 0, 2, {"seq"}};
  std::multiset<double> seen;
  for (int64_t r = 0; r < 3; ++r) {
    data::Batcher part(d, options);
    part.readPart(r, 3);
    std::fill(made->begin(), made->end(), 0);
    for (int64_t step = 0; step < part.batchesPerEpoch(); ++step) {
      for (const double id : ids(part.next())) seen.insert(id);
    }
    // This part made its own 16 examples, once each, and none of the other parts'.
    CHECK(std::count(made->begin(), made->end(), 1) == 16);
    CHECK(std::count(made->begin(), made->end(), 0) == 32);
  }
  CHECK(seen.size() == 48);
  CHECK(std::set<double>(seen.begin(), seen.end()).size() == 48);
}

TEST_CASE("keepGenerated makes each example once over epochs of whole batches, and keeps none for a part") {
  auto made = std::make_shared<std::vector<int>>();
  BatchOptions options{4, true, 3, {"seq"}, 0, 0, {}};
  options.keepGenerated = true;
  data::Batcher whole(numberedGenerated(16, made), options), reference(numbered(16), options);
  for (int step = 0; step < 12; ++step) checkSameBatch(whole.next(), reference.next());  // three epochs
  CHECK(std::count(made->begin(), made->end(), 1) == 16);
  data::Batcher part(numberedGenerated(16, made), options);
  part.readPart(1, 2);
  std::fill(made->begin(), made->end(), 0);
  for (int step = 0; step < 12; ++step) part.next();
  CHECK(std::accumulate(made->begin(), made->end(), 0) == 24);  // 2 examples a step, made each time
}

TEST_CASE("a part resumed at a position continues exactly") {
  const BatchOptions options{6, true, 11, {"seq"}, 0, 2, {"seq"}};
  data::Batcher running(numbered(36), options), resumed(numbered(36), options);
  running.readPart(1, 3);
  resumed.readPart(1, 3);
  for (int i = 0; i < 9; ++i) running.next();
  resumed.seek(9);
  for (int i = 0; i < 8; ++i) checkSameBatch(resumed.next(), running.next());
}

TEST_CASE("streams are consecutive ranges as even as whole examples allow, covering the dataset") {
  for (const size_t size : {size_t{0}, size_t{7}, size_t{100}, size_t{1} << 40}) {
    for (const int64_t streams : {1, 3, 8}) {
      size_t next = 0, smallest = size, largest = 0;
      for (int64_t j = 0; j < streams; ++j) {
        const auto [first, last] = data::streamRange(j, streams, size);
        CHECK(first == next);
        smallest = std::min(smallest, last - first);
        largest = std::max(largest, last - first);
        next = last;
      }
      CHECK(next == size);
      CHECK(largest - smallest <= 1);
    }
  }
  CHECK(contains(errorOf([] { data::streamRange(3, 3, 10); }), "stream 3 of 3 is not a stream"));
}

TEST_CASE("streamOf names the stream whose range holds an example") {
  for (const size_t size : {size_t{1}, size_t{7}, size_t{100}, size_t{1} << 40}) {
    for (const int64_t streams : {int64_t{1}, int64_t{3}, int64_t{8}}) {
      if (static_cast<size_t>(streams) > size) continue;
      for (int64_t j = 0; j < streams; ++j) {
        const auto [first, last] = data::streamRange(j, streams, size);
        for (const size_t i : {first, (first + last) / 2, last - 1}) {
          CAPTURE(i);
          CHECK(data::streamOf(i, streams, size) == j);
        }
      }
    }
  }
  CHECK(contains(errorOf([] { data::streamOf(10, 3, 10); }), "example 10 of 10 is in no stream"));
}

TEST_CASE("with streams, each batch takes an equal share of every stream, stream after stream") {
  BatchOptions options{8, true, 4, {"seq"}, 0, 2, {"seq"}};
  options.streams = 4;  // streams of 25: [0, 25), [25, 50), [50, 75), [75, 100)
  data::Batcher b(numbered(100), options);
  CHECK(b.batchesPerEpoch() == 12);  // 24 of each stream's 25 examples
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<std::set<double>> seen(4);
    for (int64_t step = 0; step < b.batchesPerEpoch(); ++step) {
      const std::vector<double> batch = ids(b.next());
      for (size_t row = 0; row < batch.size(); ++row) {
        const size_t stream = row / 2;
        CHECK(batch[row] >= 25.0 * static_cast<double>(stream));
        CHECK(batch[row] < 25.0 * static_cast<double>(stream + 1));
        seen[stream].insert(batch[row]);
      }
    }
    for (const auto& ofStream : seen) CHECK(ofStream.size() == 24);  // none twice in an epoch
  }
  options.streams = 3;
  CHECK(contains(errorOf([&] { data::Batcher(numbered(100), options); }),
                 "a batch of 8 examples cannot take an equal share of each of 3 streams"));
  options.streams = 4;
  CHECK(contains(errorOf([&] { data::Batcher(numbered(7), options); }),
                 "a dataset of 7 examples holds no batch of 8 (2 from each of 4 streams)"));
}

TEST_CASE("with streams, a part makes only its streams' examples and is the whole batch's slice") {
  BatchOptions options{16, true, 9, {"seq"}, 0, 3, {"seq"}};  // shuffled, padded, counted, bucketed
  options.streams = 4;
  auto made = std::make_shared<std::vector<int>>();
  data::Batcher whole(numbered(96), options);
  // 2 parts of 2 streams each, 4 of one each, and 8 parts two to a stream.
  for (const int64_t parts : {2, 4, 8}) {
    CAPTURE(parts);
    whole.seek(0);
    std::vector<data::Batcher> part;
    for (int64_t r = 0; r < parts; ++r) {
      part.emplace_back(numberedGenerated(96, made), options);
      part.back().readPart(r, parts);
    }
    for (int64_t step = 0; step < whole.batchesPerEpoch() + 2; ++step) {
      const Batch batch = whole.next();
      for (int64_t r = 0; r < parts; ++r) {
        std::fill(made->begin(), made->end(), 0);
        checkSameBatch(part[static_cast<size_t>(r)].next(), slicedPart(batch, r, parts));
        const int64_t firstStream = r * 4 / parts, lastStream = (r * 4 + 3) / parts;  // the streams its rows span
        for (size_t i = 0; i < made->size(); ++i)
          if ((*made)[i] > 0)
            CHECK((static_cast<int64_t>(i / 24) >= firstStream && static_cast<int64_t>(i / 24) <= lastStream));
      }
    }
  }
}

TEST_CASE("with streams, the order is a function of the seed, and seek replays it") {
  BatchOptions options{8, true, 5, {"seq"}, 0, 2, {"seq"}};
  options.streams = 2;
  data::Batcher a(numbered(64), options), b(numbered(64), options);
  std::vector<std::vector<double>> first;
  for (int i = 0; i < 10; ++i) first.push_back(ids(a.next()));
  for (int i = 0; i < 10; ++i) CHECK(ids(b.next()) == first[static_cast<size_t>(i)]);
  b.seek(6);
  CHECK(ids(b.next()) == first[6]);
}

TEST_CASE("one stream is the plain shuffle: a Fisher-Yates pass keyed by the seed and epoch, cut into batches") {
  const BatchOptions options{8, true, 5, {"seq"}, 0, 0, {}};
  data::Batcher b(numbered(60), options);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<double> order(60);
    std::iota(order.begin(), order.end(), 0.0);
    const uint64_t key = streamKey(5, "epoch" + std::to_string(epoch));
    for (size_t k = order.size(); k > 1; --k)
      std::swap(order[k - 1], order[static_cast<size_t>(uniformAt(key, k) * static_cast<double>(k))]);
    for (size_t batch = 0; batch < 7; ++batch) {  // 7 of 8 examples; the last 4 examples are dropped
      const std::vector<double> expected(order.begin() + static_cast<std::ptrdiff_t>(batch * 8),
                                         order.begin() + static_cast<std::ptrdiff_t>(batch * 8 + 8));
      CHECK(ids(b.next()) == expected);
    }
  }
}

TEST_CASE("a padded field the examples lack is named when the first batch is made") {
  data::Batcher b(numbered(16), {4, true, 1, {"tokens"}, 0, 0, {}});
  CHECK(contains(errorOf([&] { b.next(); }), "padded field 'tokens' is not a field of the examples"));
}

TEST_CASE("a batch that does not divide among the parts is refused") {
  data::Batcher b(numbered(20), {6, true, 1, {}, 0, 0, {}});
  CHECK(contains(errorOf([&] { b.readPart(0, 4); }), "a batch of 6 examples cannot be cut into 4 equal parts"));
  CHECK(contains(errorOf([&] { b.readPart(4, 4); }), "part 4 of 4"));
}

TEST_CASE("an epoch visits every example once, and the next epoch reshuffles") {
  data::Batcher b(numbered(12), {4, true, 7, {"seq"}, 0, 0, {}});
  CHECK(b.batchesPerEpoch() == 3);
  std::vector<double> epoch1, epoch2;
  for (int i = 0; i < 3; ++i) for (double x : ids(b.next())) epoch1.push_back(x);
  for (int i = 0; i < 3; ++i) for (double x : ids(b.next())) epoch2.push_back(x);
  CHECK(std::set<double>(epoch1.begin(), epoch1.end()).size() == 12);
  CHECK(std::set<double>(epoch2.begin(), epoch2.end()).size() == 12);
  CHECK(epoch1 != epoch2);
}

TEST_CASE("the batch order is a function of the seed, and seek replays it") {
  data::Batcher a(numbered(20), {4, true, 3, {"seq"}, 0, 0, {}}), b(numbered(20), {4, true, 3, {"seq"}, 0, 0, {}});
  std::vector<std::vector<double>> first;
  for (int i = 0; i < 12; ++i) first.push_back(ids(a.next()));
  b.seek(7);
  for (int i = 7; i < 12; ++i) CHECK(ids(b.next()) == first[static_cast<size_t>(i)]);
  data::Batcher c(numbered(20), {4, true, 4, {"seq"}, 0, 0, {}});
  CHECK(ids(c.next()) != first[0]);
}

TEST_CASE("variable-length fields are padded and masked") {
  data::Batcher b(numbered(3), {3, false, 1, {"seq"}, -1, 0, {}});
  const Batch batch = b.next();
  // lengths 1, 2, 3
  CHECK(batch.at("seq").shape() == Shape{3, 3});
  CHECK(batch.at("seq").toDoubles() == std::vector<double>{0, -1, -1, 1, 1, -1, 2, 2, 2});
  CHECK(batch.at("seq_mask").toDoubles() == std::vector<double>{1, 0, 0, 1, 1, 0, 1, 1, 1});
  CHECK(batch.at("id").shape() == Shape{3});
}

TEST_CASE("trimPadding drops the positions that are padding in every row, and nothing else") {
  const Dataset d = numbered(5);  // sequences of 1 to 5 values
  const Batch whole = data::collate(d, 0, 5, {5, false, 0, {"seq"}, -1, 0, {}});
  // The first three rows of the batch 5 wide: their longest is 3.
  Batch part = data::sliceBatch(data::collate(d, 0, 4, {4, false, 0, {"seq"}, -1, 0, {}}), 0, 2);
  part = data::trimPadding(std::move(part), "seq_mask", {"seq", "seq_mask"});
  CHECK(part.at("seq").shape() == Shape{2, 2});
  CHECK(part.at("seq").toDoubles() == std::vector<double>{0, -1, 1, 1});
  CHECK(part.at("seq_mask").toDoubles() == std::vector<double>{1, 0, 1, 1});
  CHECK(part.at("id").toDoubles() == std::vector<double>{0, 1});
  // A row as long as the batch leaves it as it is.
  checkSameBatch(data::trimPadding(whole, "seq_mask", {"seq", "seq_mask"}), whole);
  CHECK(contains(errorOf([&] { data::trimPadding(whole, "seq_mask", {"seq", "id"}); }), "field 'id' is [5]"));
  CHECK(contains(errorOf([&] { data::trimPadding(whole, "mask", {"seq"}); }), "no mask field 'mask'"));
}

TEST_CASE("bucketing groups similar lengths into a batch") {
  auto padding = [](int64_t window) {
    data::Batcher b(numbered(200), {10, true, 5, {"seq"}, 0, window, {}});
    double pad = 0;
    for (int i = 0; i < b.batchesPerEpoch(); ++i) {
      const Batch batch = b.next();
      const std::vector<double> m = batch.at("seq_mask").toDoubles();
      for (double v : m) pad += 1 - v;
    }
    return pad;
  };
  CHECK(padding(10) < padding(0) / 4);
}

TEST_CASE("a counted padded field gets its batch's real positions as a scalar") {
  const Dataset d = numbered(4);  // sequences of 1, 2, 3 and 4 values
  const Batch counted = data::collate(d, 0, 4, {4, false, 0, {"seq"}, 0, 0, {"seq"}});
  CHECK(counted.at("seq_count").shape() == Shape{});
  CHECK(counted.at("seq_count").item() == 10);
  CHECK(data::collate(d, 0, 4, {4, false, 0, {"seq"}, 0, 0, {}}).count("seq_count") == 0);
}

TEST_CASE("collate names the field that does not fit") {
  Example a{{"x", Tensor::zeros(f32, {2})}}, b{{"x", Tensor::zeros(f32, {3})}}, c{{"y", Tensor::zeros(f32, {2})}};
  CHECK(contains(errorOf([&] { data::collate({&a, &b}, {}); }), "'x'"));
  CHECK(contains(errorOf([&] { data::collate({&a, &c}, {}); }), "'x'"));
}

TEST_CASE("a dataset smaller than one batch is refused") {
  CHECK(contains(errorOf([&] { data::Batcher(numbered(3), {4, true, 1, {}, 0, 0, {}}); }), "no batch of 4"));
}

TEST_CASE("the prefetcher yields the source's batches in order, and seeks") {
  data::Batcher reference(numbered(30), {5, true, 9, {"seq"}, 0, 0, {}});
  std::vector<std::vector<double>> expected;
  for (int i = 0; i < 10; ++i) expected.push_back(ids(reference.next()));

  data::Batcher source(numbered(30), {5, true, 9, {"seq"}, 0, 0, {}});
  data::Prefetcher p(source, 3);
  for (int i = 0; i < 4; ++i) CHECK(ids(p.next()) == expected[static_cast<size_t>(i)]);
  CHECK(p.position() == 4);
  p.seek(8);
  CHECK(ids(p.next()) == expected[8]);
  CHECK(p.position() == 9);
}

TEST_CASE("the prefetcher transforms batches ahead and keeps the source's batch beside each") {
  data::Batcher reference(numbered(30), {5, true, 9, {"seq"}, 0, 0, {}});
  data::Batcher source(numbered(30), {5, true, 9, {"seq"}, 0, 0, {}});
  data::PrefetchOptions options;
  options.depth = 2;
  options.transform = [](const Batch& b) { return data::sliceBatch(b, 1, 5); };  // the second example
  data::Prefetcher p(source, options);
  for (int i = 0; i < 4; ++i) {
    const Batch expected = reference.next();
    const data::Prefetched got = p.nextPrefetched();
    CHECK(ids(got.source) == ids(expected));
    CHECK(ids(got.prepared) == std::vector<double>{ids(expected)[1]});
  }
  CHECK(p.position() == 4);
  p.seek(7);
  for (int i = 4; i < 7; ++i) reference.next();
  CHECK(ids(p.next()) == std::vector<double>{ids(reference.next())[1]});
}

TEST_CASE("an error in the transform surfaces from the prefetcher") {
  data::Batcher source(numbered(30), {5, true, 9, {"seq"}, 0, 0, {}});
  data::PrefetchOptions options;
  options.transform = [](const Batch& b) { return data::sliceBatch(b, 0, 3); };
  data::Prefetcher p(source, options);
  CHECK(contains(errorOf([&] { p.next(); }), "cannot be cut into 3 equal parts"));
}

TEST_CASE("an error in the source surfaces from the prefetcher") {
  struct Failing : data::BatchSource {
    Batch next() override { WEFT_THROW("source broke at batch {}", n++); }
    int64_t position() const override { return n; }
    void seek(int64_t p) override { n = p; }
    int64_t batchesPerEpoch() const override { return 1; }
    uint64_t dataHash() const override { return 0; }
    int64_t n = 0;
  } failing;
  data::Prefetcher p(failing);
  CHECK(contains(errorOf([&] { p.next(); }), "source broke"));
}
