// Local aggregation (see the header).
#include "dist/server/LocalAggregator.h"

#include "core/Error.h"
#include "core/Tensor.h"
#include "dist/server/RowSums.h"
#include "dist/server/WireRows.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace weft::dist {

SenderGroups SenderGroups::separate(int workers) {
  SenderGroups g;
  for (int w = 0; w < workers; ++w) {
    g.groupOfWorker.push_back(w);
    g.members.push_back({w});
    g.relay.push_back(-1);
  }
  return g;
}

SenderGroups SenderGroups::pipelineReplicas(int workers, int stages) {
  WEFT_CHECK(stages >= 1 && workers % stages == 0, "{} workers are not replicas of a pipeline of {} stages", workers,
             stages);
  SenderGroups g;
  g.everyMemberSends = true;
  for (int w = 0; w < workers; ++w) {
    g.groupOfWorker.push_back(w / stages);
    if (w % stages == 0) {
      g.members.emplace_back();
      g.relay.push_back(-1);
    }
    g.members.back().push_back(w);
  }
  return g;
}

namespace {

Message replyTo(const RequestHeader& h, std::vector<uint8_t> payload, uint32_t status = 0) {
  return {encode(ReplyHeader{h.id, status}), std::move(payload)};
}

Message errorTo(const RequestHeader& h, const std::string& what) {
  const std::string text = fmt::format("local aggregation: {} request {} of worker {} for partition {}: {}",
                                       requestKindName(h.kind), h.id, h.worker, h.partition, what);
  return replyTo(h, std::vector<uint8_t>(text.begin(), text.end()), 1);
}

template <class T>
void appendBytes(std::vector<uint8_t>& bytes, const T* values, size_t count) {
  const auto* p = reinterpret_cast<const uint8_t*>(values);
  bytes.insert(bytes.end(), p, p + count * sizeof(T));
}

}  // namespace

LocalAggregator::LocalAggregator(const ServerPlan& plan, std::vector<int> members, int serverCount,
                                 std::shared_ptr<const SyncPolicy> sync, DType wire)
    : plan_(plan), members_(std::move(members)), serverCount_(serverCount), sync_(std::move(sync)), wire_(wire),
      left_(members_.size(), false),
      pushesForwarded_(plan.partitions.size(), 0) {
  WEFT_CHECK(!members_.empty() && std::is_sorted(members_.begin(), members_.end()),
             "local aggregation needs the machine's workers in rank order");
}

int LocalAggregator::indexOf(int worker) const {
  const auto it = std::lower_bound(members_.begin(), members_.end(), worker);
  return it != members_.end() && *it == worker ? static_cast<int>(it - members_.begin()) : -1;
}

bool LocalAggregator::isMember(int worker) const { return indexOf(worker) >= 0; }

bool LocalAggregator::hasLeft(int worker) const { return left_.at(static_cast<size_t>(indexOf(worker))); }

int64_t LocalAggregator::steps() const {
  return pushesForwarded_.empty() ? 0 : *std::max_element(pushesForwarded_.begin(), pushesForwarded_.end());
}

std::pair<int, RequestKind> LocalAggregator::destinationOf(uint64_t forwardedId) const {
  const auto it = inFlight_.find(forwardedId);
  WEFT_CHECK(it != inFlight_.end(), "a server's reply to request {}, which is not in flight", forwardedId);
  return {it->second.server, it->second.kind};
}

void LocalAggregator::check(const RequestHeader& h, const std::vector<uint8_t>& payload) const {
  WEFT_CHECK(!left_[static_cast<size_t>(indexOf(static_cast<int>(h.worker)))], "the worker has left the job");
  WEFT_CHECK(h.partition < plan_.partitions.size(), "the plan has {} partitions", plan_.partitions.size());
  const Partition& part = plan_.partitions[h.partition];
  const ServedVariable& v = plan_.variables[static_cast<size_t>(part.variable)];
  const int64_t rows = part.rows;
  switch (h.kind) {
    case RequestKind::PullRows: pullRowIds(payload, rows); break;
    case RequestKind::PullAll:
    case RequestKind::Fetch:
      WEFT_CHECK(payload.empty(), "{} carries {} bytes, expected none", requestKindName(h.kind), payload.size());
      break;
    case RequestKind::Push:
      if (v.sparse) {
        sparsePushRowIds(payload, rows, RowWire::of(v, wire_).bytes());
      } else {
        const size_t expected = static_cast<size_t>(rows) * RowWire::of(v, wire_).bytes();
        WEFT_CHECK(payload.size() == expected, "a dense PUSH carries {} bytes, the partition takes {}",
                   payload.size(), expected);
      }
      break;
    case RequestKind::Apply:
    case RequestKind::Load:
      WEFT_CHECK(h.worker == 0, "{} comes from worker 0 alone", requestKindName(h.kind));
      break;
    case RequestKind::Goodbye: break;
  }
}

LocalAggregator::Released LocalAggregator::fromMember(const Message& message) {
  const RequestHeader h = decodeRequest(message.header);
  const int k = indexOf(static_cast<int>(h.worker));
  WEFT_CHECK(k >= 0, "{} request from worker {}, which is not one of this machine's workers", requestKindName(h.kind),
             h.worker);
  Released out;
  if (h.kind == RequestKind::Goodbye) {
    left_[static_cast<size_t>(k)] = true;
    out.replies.emplace_back(h.worker, replyTo(h, {}));
    if (!goodbyesSent_ && std::all_of(left_.begin(), left_.end(), [](bool l) { return l; })) {
      Released goodbyes = sayGoodbye();
      out.forwards = std::move(goodbyes.forwards);
    }
    return out;
  }
  try {
    check(h, message.payload);
  } catch (const std::exception& e) {
    out.replies.emplace_back(h.worker, errorTo(h, e.what()));
    return out;
  }
  // Requests one worker makes on its own (a FETCH for a checkpoint) travel on their own.
  if (h.kind == RequestKind::Apply || h.kind == RequestKind::Load || h.kind == RequestKind::Fetch)
    return forward({Request{h, message.payload}}, message.payload);

  if (h.kind == RequestKind::PullRows || h.kind == RequestKind::PullAll) return pull(Request{h, message.payload});

  // A push: held until the members the policy waits for have pushed the partition for this clock.
  const auto key = std::make_pair(h.partition, h.clock);
  std::vector<std::optional<Request>>& pushes = pushes_[key];
  pushes.resize(members_.size());
  if (pushes[static_cast<size_t>(k)]) {
    out.replies.emplace_back(h.worker, errorTo(h, fmt::format("a second PUSH for clock {}", h.clock)));
    return out;
  }
  pushes[static_cast<size_t>(k)] = Request{h, message.payload};
  const auto pushed = std::count_if(pushes.begin(), pushes.end(), [](const auto& p) { return p.has_value(); });
  if (!sync_->machinePushReady(static_cast<int>(pushed), static_cast<int>(members_.size()))) return out;

  std::vector<Request> requests;
  for (std::optional<Request>& p : pushes)
    if (p) requests.push_back(std::move(*p));
  pushes_.erase(key);
  std::vector<uint8_t> payload = sumPushes(requests);
  return forward(std::move(requests), std::move(payload));
}

LocalAggregator::Released LocalAggregator::pull(const Request& request) {
  const RequestHeader& h = request.header;
  const Key key{h.kind, h.partition, h.clock};
  // Versions older than any worker may still read are read no more.
  for (auto it = pulled_.begin(); it != pulled_.end();) {
    const auto& [kind, partition, clock] = it->first;
    const bool stale = kind == h.kind && partition == h.partition && clock < sync_->oldestReadable(h.clock);
    it = stale && !it->second.fetching && it->second.waiting.empty() ? pulled_.erase(it) : std::next(it);
  }
  pulled_[key].waiting.push_back(request);
  return pulled_[key].fetching ? Released{} : servePulls(key);
}

LocalAggregator::Released LocalAggregator::servePulls(const Key& key) {
  Pulled& p = pulled_[key];
  const Partition& part = plan_.partitions[std::get<1>(key)];
  const size_t rowBytes = RowWire::of(plan_.variables[static_cast<size_t>(part.variable)], wire_).bytes();
  Released out;
  std::vector<Request> unanswered;
  std::vector<int64_t> missing;
  for (Request& r : p.waiting) {
    if (std::get<0>(key) == RequestKind::PullAll) {
      if (p.whole) {
        out.replies.emplace_back(r.header.worker, replyTo(r.header, *p.whole));
      } else {
        unanswered.push_back(std::move(r));
      }
      continue;
    }
    const std::vector<int64_t> ids = pullRowIds(r.payload, part.rows);
    const size_t before = missing.size();
    for (int64_t id : ids)
      if (!p.slotOf.count(id)) missing.push_back(id);
    if (missing.size() > before) {
      unanswered.push_back(std::move(r));
      continue;
    }
    std::vector<uint8_t> rows;
    rows.reserve(ids.size() * rowBytes);
    for (int64_t id : ids) {
      const auto at = static_cast<std::ptrdiff_t>(p.slotOf.at(id) * rowBytes);
      rows.insert(rows.end(), p.rows.begin() + at, p.rows.begin() + at + static_cast<std::ptrdiff_t>(rowBytes));
    }
    out.replies.emplace_back(r.header.worker, replyTo(r.header, std::move(rows)));
  }
  p.waiting = std::move(unanswered);
  if (p.waiting.empty()) return out;

  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  std::vector<uint8_t> payload;
  appendBytes(payload, missing.data(), missing.size());
  const RequestHeader& first = p.waiting.front().header;
  const RequestHeader h{first.kind, first.partition, static_cast<uint32_t>(members_.front()), nextId_++, first.clock};
  inFlight_[h.id] = InFlight{part.server, h.kind, {}, key, std::move(missing)};
  p.fetching = true;
  out.forwards.emplace_back(part.server, Message{encode(h), std::move(payload)});
  return out;
}

LocalAggregator::Released LocalAggregator::pulled(InFlight done, const ReplyHeader& reply,
                                                  std::vector<uint8_t> payload) {
  Pulled& p = pulled_[done.pull];
  p.fetching = false;
  const Partition& part = plan_.partitions[std::get<1>(done.pull)];
  const size_t rowBytes = RowWire::of(plan_.variables[static_cast<size_t>(part.variable)], wire_).bytes();
  const size_t expected = (done.kind == RequestKind::PullAll ? static_cast<size_t>(part.rows) : done.rows.size()) *
                          rowBytes;
  std::string error = reply.status != 0 ? std::string(payload.begin(), payload.end()) : "";
  if (error.empty() && payload.size() != expected)
    error = fmt::format("server {} answered a {} with {} bytes, expected {}", done.server, requestKindName(done.kind),
                        payload.size(), expected);
  if (!error.empty()) {  // every pull waiting for it fails
    Released out;
    for (const Request& r : p.waiting)
      out.replies.emplace_back(r.header.worker, replyTo(r.header, std::vector<uint8_t>(error.begin(), error.end()), 1));
    p.waiting.clear();
    return out;
  }
  if (done.kind == RequestKind::PullAll) {
    p.whole = std::move(payload);
  } else {
    for (size_t i = 0; i < done.rows.size(); ++i) {
      p.slotOf[done.rows[i]] = p.rows.size() / rowBytes;
      p.rows.insert(p.rows.end(), payload.begin() + static_cast<std::ptrdiff_t>(i * rowBytes),
                    payload.begin() + static_cast<std::ptrdiff_t>((i + 1) * rowBytes));
    }
  }
  return servePulls(done.pull);
}

LocalAggregator::Released LocalAggregator::forward(std::vector<Request> requests, std::vector<uint8_t> payload) {
  const RequestHeader& first = requests.front().header;
  const RequestHeader h{first.kind, first.partition, static_cast<uint32_t>(members_.front()), nextId_++, first.clock};
  const int server = plan_.partitions[h.partition].server;
  if (h.kind == RequestKind::Push) ++pushesForwarded_[h.partition];
  inFlight_[h.id] = InFlight{server, h.kind, std::move(requests), {}, {}};
  Released out;
  out.forwards.emplace_back(server, Message{encode(h), std::move(payload)});
  return out;
}

std::vector<uint8_t> LocalAggregator::sumPushes(const std::vector<Request>& pushes) {
  const uint32_t partition = pushes.front().header.partition;
  const Partition& part = plan_.partitions[partition];
  const ServedVariable& v = plan_.variables[static_cast<size_t>(part.variable)];
  const DType dtype = v.variable->outputs[0].dtype;
  const size_t rowBytes = v.rowBytes();
  const RowWire wire = RowWire::of(v, wire_);
  std::vector<uint8_t> out;
  if (!v.sparse) {
    dispatchFloat(dtype, [&](auto z) {
      using T = decltype(z);
      std::vector<T> sum(part.bytes / sizeof(T), T(0)), widened(wire.narrowed ? sum.size() : 0);
      for (const Request& r : pushes) {
        const T* in = reinterpret_cast<const T*>(r.payload.data());
        if (wire.narrowed) {
          wire.widen(r.payload, reinterpret_cast<uint8_t*>(widened.data()));
          in = widened.data();
        }
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += in[i];
      }
      wire.appendTravelling({reinterpret_cast<const uint8_t*>(sum.data()), part.bytes}, out);
    });
    return out;
  }
  // Every member's rows, in member order, as stored; rows of one id are added up in that order.
  std::vector<int64_t> ids;
  std::vector<std::vector<uint8_t>> stored;
  for (const Request& r : pushes) {
    const std::vector<int64_t> own = sparsePushRowIds(r.payload, part.rows, wire.bytes());
    ids.insert(ids.end(), own.begin(), own.end());
    stored.emplace_back(own.size() * rowBytes);
    wire.widen({r.payload.data() + 8 + own.size() * 8, own.size() * wire.bytes()}, stored.back().data());
  }
  std::vector<const uint8_t*> rowsAt;
  for (const std::vector<uint8_t>& rowsOfMember : stored)
    for (size_t at = 0; at < rowsOfMember.size(); at += rowBytes) rowsAt.push_back(rowsOfMember.data() + at);
  const RowSums sums = sumRowsById(dtype, rowBytes, ids, rowsAt);
  const uint64_t count = sums.ids.size();
  appendBytes(out, &count, 1);
  appendBytes(out, sums.ids.data(), sums.ids.size());
  wire.appendTravelling(sums.rows, out);
  SparseRows& rows = sparseRows_[v.variable->name];
  if (static_cast<int>(partition) == v.partitions.front()) ++rows.steps;
  rows.lookups += static_cast<int64_t>(ids.size());
  rows.touched += static_cast<int64_t>(sums.ids.size());
  rows.rows = v.rows();
  return out;
}

LocalAggregator::Released LocalAggregator::sayGoodbye() {
  goodbyesSent_ = true;
  Released out;
  for (int s = 0; s < serverCount_; ++s) {
    const RequestHeader h{RequestKind::Goodbye, 0, static_cast<uint32_t>(members_.front()), nextId_++, 0};
    inFlight_[h.id] = InFlight{s, RequestKind::Goodbye, {}, {}, {}};
    out.forwards.emplace_back(s, Message{encode(h), {}});
  }
  return out;
}

LocalAggregator::Released LocalAggregator::fromServer(const Message& message) {
  const ReplyHeader r = decodeReply(message.header);
  auto it = inFlight_.find(r.id);
  WEFT_CHECK(it != inFlight_.end(), "a server's reply to request {}, which is not in flight", r.id);
  InFlight done = std::move(it->second);
  inFlight_.erase(it);
  if (done.kind == RequestKind::PullRows || done.kind == RequestKind::PullAll)
    return pulled(std::move(done), r, message.payload);
  Released out;  // a goodbye's acknowledgement answers no member
  for (const Request& q : done.requests)
    out.replies.emplace_back(q.header.worker, replyTo(q.header, message.payload, r.status));
  return out;
}

}  // namespace weft::dist
