// The update strategies of a parameter server's partitions (see the header).
#include "dist/server/PartitionUpdates.h"

#include "core/Error.h"
#include "dist/transport/Deadline.h"
#include "dist/server/Staleness.h"
#include "dist/server/SyncPolicy.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <optional>
#include <utility>

namespace weft::dist {

namespace {

using Payload = UpdateChain::Payload;

Payload normBytes(double squaredNorm) {
  Payload out(sizeof squaredNorm);
  std::memcpy(out.data(), &squaredNorm, sizeof squaredNorm);
  return out;
}

/// BSP: one push of every sender makes a version's gradient; sender 0's APPLY makes the version.
class SynchronousUpdates final : public PartitionUpdates {
 public:
  SynchronousUpdates(const SyncPolicy& policy, int senders) : policy_(policy), pushes_(static_cast<size_t>(senders)) {}

  std::vector<Released> push(UpdateChain& chain, const RequestHeader& h, int sender, const Payload& gradient) override {
    policy_.checkPush(h.clock, chain.version());
    std::optional<Payload>& slot = pushes_[static_cast<size_t>(sender)];
    WEFT_CHECK(!slot, "worker {} pushed twice for version {}", h.worker, chain.version());
    chain.checkGradient(gradient);
    slot = gradient;
    pushers_.push_back(h);
    const auto pushed = std::count_if(pushes_.begin(), pushes_.end(), [](const auto& x) { return x.has_value(); });
    if (!policy_.pushesComplete(static_cast<int>(pushed), static_cast<int>(pushes_.size()))) return {};

    std::vector<const Payload*> from;
    for (const std::optional<Payload>& x : pushes_) from.push_back(&*x);
    aggregate_ = chain.aggregate(from);
    std::vector<Released> out;
    for (const RequestHeader& pusher : pushers_) out.push_back({pusher, normBytes(aggregate_->squaredNorm)});
    pushers_.clear();
    if (pendingApply_) {
      const auto [applyHeader, extras] = std::move(*pendingApply_);
      finishVersion(chain, extras);
      out.push_back({applyHeader, {}});
    }
    return out;
  }

  std::vector<Released> apply(UpdateChain& chain, const RequestHeader& h, int sender, const Payload& extras) override {
    // Sender 0: worker 0, or the stage of a pipeline's first replica that holds the variable.
    WEFT_CHECK(sender == 0, "APPLY comes from worker 0 alone (in a pipeline, from its first replica), not worker {}",
               h.worker);
    policy_.checkApply(h.clock, chain.version());
    WEFT_CHECK(!pendingApply_, "a second APPLY for version {}", chain.version());
    chain.checkExtras(extras);
    if (!aggregate_) {  // some sender has not pushed yet
      pendingApply_.emplace(h, extras);
      return {};
    }
    finishVersion(chain, extras);
    return {{h, {}}};
  }

  uint64_t versionOf(const UpdateChain& chain, int) const override { return chain.version(); }

  bool untouched(const UpdateChain& chain) const override {
    return chain.version() == 0 &&
           std::none_of(pushes_.begin(), pushes_.end(), [](const auto& x) { return x.has_value(); });
  }

 private:
  void finishVersion(UpdateChain& chain, const Payload& extras) {
    chain.update(std::move(aggregate_->feeds), extras);
    aggregate_.reset();
    std::fill(pushes_.begin(), pushes_.end(), std::nullopt);
    pendingApply_.reset();
  }

  const SyncPolicy& policy_;
  std::vector<std::optional<Payload>> pushes_;  // this version's gradient of each sender
  std::vector<RequestHeader> pushers_;          // waiting for the squared norm
  std::optional<UpdateChain::Gradient> aggregate_;  // once every sender has pushed
  std::optional<std::pair<RequestHeader, Payload>> pendingApply_;
};

/// ASP, SSP, DSSP: a sender's push is its own update, applied by its own APPLY.
class OwnUpdates final : public PartitionUpdates {
 public:
  OwnUpdates(const SyncPolicy& policy, int senders, std::unique_ptr<StalenessGate> gate)
      : policy_(policy),
        applied_(static_cast<size_t>(senders), 0),
        own_(static_cast<size_t>(senders)),
        ownApply_(static_cast<size_t>(senders)),
        pushedAt_(static_cast<size_t>(senders), 0.0),
        gate_(std::move(gate)),
        staleness_(static_cast<size_t>(senders)) {}

  std::vector<Released> push(UpdateChain& chain, const RequestHeader& h, int sender, const Payload& gradient) override {
    const auto s = static_cast<size_t>(sender);
    policy_.checkPush(h.clock, applied_[s]);
    WEFT_CHECK(!own_[s], "worker {} pushed twice for its update {}", h.worker, applied_[s]);
    chain.checkGradient(gradient);
    own_[s] = chain.aggregate({&gradient});
    pushedAt_[s] = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
    std::vector<Released> out{{h, normBytes(own_[s]->squaredNorm)}};
    if (ownApply_[s]) {
      const auto [applyHeader, extras] = std::move(*ownApply_[s]);
      ownApply_[s].reset();
      std::vector<Released> applied = apply(chain, applyHeader, sender, extras);
      std::move(applied.begin(), applied.end(), std::back_inserter(out));
    }
    return out;
  }

  std::vector<Released> apply(UpdateChain& chain, const RequestHeader& h, int sender, const Payload& extras) override {
    const auto s = static_cast<size_t>(sender);
    policy_.checkApply(h.clock, applied_[s]);
    chain.checkExtras(extras);
    if (!own_[s]) {  // its push has not arrived yet
      WEFT_CHECK(!ownApply_[s], "a second APPLY of worker {} for its update {}", h.worker, applied_[s]);
      ownApply_[s].emplace(h, extras);
      return {};
    }
    chain.update(std::move(own_[s]->feeds), extras);
    own_[s].reset();
    ++applied_[s];
    if (gate_) gate_->applied(sender, pushedAt_[s]);
    return {{h, {}}};
  }

  uint64_t versionOf(const UpdateChain&, int sender) const override { return applied_[static_cast<size_t>(sender)]; }

  bool untouched(const UpdateChain& chain) const override {
    return chain.version() == 0 && std::none_of(own_.begin(), own_.end(), [](const auto& x) { return x.has_value(); });
  }

  bool mayProceed(int sender) const override { return !gate_ || gate_->mayProceed(sender); }

  void answered(int sender, double heldSeconds, const std::vector<bool>& left) override {
    const auto s = static_cast<size_t>(sender);
    uint64_t slowest = applied_[s];
    for (size_t g = 0; g < applied_.size(); ++g)
      if (!left[g]) slowest = std::min(slowest, applied_[g]);
    const auto gap = static_cast<int64_t>(applied_[s] - slowest);
    SenderStaleness& st = staleness_[s];
    ++st.pulls;
    st.gapSum += static_cast<uint64_t>(gap);
    st.maxGap = std::max(st.maxGap, gap);
    st.waitedSeconds += heldSeconds;
  }

  void leave(int sender) override {
    if (gate_) gate_->leave(sender);
  }

  std::vector<SenderStaleness> staleness() const override { return staleness_; }

 private:
  const SyncPolicy& policy_;
  std::vector<uint64_t> applied_;                       // each sender's updates applied
  std::vector<std::optional<UpdateChain::Gradient>> own_;  // its push, awaiting its own APPLY
  std::vector<std::optional<std::pair<RequestHeader, Payload>>> ownApply_;  // an APPLY that came first
  std::vector<double> pushedAt_;                        // when its push arrived
  std::unique_ptr<StalenessGate> gate_;                 // null under ASP
  std::vector<SenderStaleness> staleness_;
};

}  // namespace

std::unique_ptr<PartitionUpdates> synchronousUpdates(const SyncPolicy& policy, int senders) {
  return std::make_unique<SynchronousUpdates>(policy, senders);
}

std::unique_ptr<PartitionUpdates> ownUpdates(const SyncPolicy& policy, int senders,
                                             std::unique_ptr<StalenessGate> gate) {
  return std::make_unique<OwnUpdates>(policy, senders, std::move(gate));
}

}  // namespace weft::dist
