// Synchronisation rules (see the header).
#include "dist/server/SyncPolicy.h"

#include "core/Error.h"
#include "dist/server/PartitionUpdates.h"

#include <fmt/format.h>

#include <string>
#include <vector>

namespace weft::dist {

namespace {

class Bsp final : public SyncPolicy {
 public:
  std::string name() const override { return "BSP"; }
  bool synchronous() const override { return true; }
  std::unique_ptr<StalenessGate> makeGate(int) const override { return nullptr; }
  std::unique_ptr<PartitionUpdates> makeUpdates(int senders) const override {
    return synchronousUpdates(*this, senders);
  }
  int64_t stalenessBound() const override { return 0; }
  void checkPush(uint64_t clock, uint64_t version) const override {
    WEFT_CHECK(clock == version, "PUSH for clock {} while the partition is at version {}: BSP takes one push per "
               "sender per version", clock, version);
  }
  bool pushesComplete(int pushed, int senders) const override { return pushed == senders; }
  void checkApply(uint64_t clock, uint64_t version) const override {
    WEFT_CHECK(clock == version, "APPLY for clock {} while the partition is at version {}", clock, version);
  }
  // A worker that has pushed for version v pulls for v + 1 before the update is applied; it
  // cannot push (or pull) further before that pull is answered.
  void checkPull(uint64_t clock, uint64_t version) const override {
    WEFT_CHECK(clock <= version + 1, "a pull for clock {} while the partition is at version {}: under BSP no worker "
               "is more than one version ahead", clock, version);
  }
  bool pullReady(uint64_t clock, uint64_t version) const override { return clock <= version; }
  bool machinePushReady(int pushed, int members) const override { return pushed == members; }
  // The workers' clocks differ by at most one: a pull for c reads version c, and a worker one
  // step behind may still read c - 1.
  uint64_t oldestReadable(uint64_t clock) const override { return clock > 0 ? clock - 1 : 0; }
  // No update happens before every worker, this one included, has pushed.
  bool valuesWaitForOwnPush() const override { return true; }
};

/// ASP, SSP and DSSP: pulls answered up to `lower` clocks ahead of the slowest sender (and up to
/// `upper` for DSSP's granted iterations); no bound at all for ASP.
class StaleSynchronous final : public SyncPolicy {
 public:
  StaleSynchronous(std::string name, bool bounded, int lower, int upper)
      : name_(std::move(name)), bounded_(bounded), lower_(lower), upper_(upper) {}
  std::string name() const override { return name_; }
  bool synchronous() const override { return false; }
  std::unique_ptr<StalenessGate> makeGate(int senders) const override {
    return bounded_ ? std::make_unique<StalenessGate>(senders, lower_, upper_) : nullptr;
  }
  std::unique_ptr<PartitionUpdates> makeUpdates(int senders) const override {
    return ownUpdates(*this, senders, makeGate(senders));
  }
  int64_t stalenessBound() const override { return bounded_ ? upper_ : -1; }
  // `version` is the sender's own updates applied.
  void checkPush(uint64_t clock, uint64_t version) const override {
    WEFT_CHECK(clock == version, "PUSH for clock {} while {} of the sender's updates are applied: under {} a sender "
               "pushes again once its last push is applied", clock, version, name_);
  }
  bool pushesComplete(int pushed, int senders) const override { return pushed == senders; }
  void checkApply(uint64_t clock, uint64_t version) const override {
    WEFT_CHECK(clock == version, "APPLY for clock {} while {} of the sender's updates are applied", clock, version);
  }
  void checkPull(uint64_t clock, uint64_t version) const override {
    WEFT_CHECK(clock <= version + 1, "a pull for clock {} while {} of the sender's updates are applied: a sender "
               "pulls after its own updates", clock, version);
  }
  // A sender reads its own updates; how far ahead of the others it may be is the gate's to say.
  bool pullReady(uint64_t clock, uint64_t version) const override { return clock <= version; }
  // Machines' workers are at different clocks: every worker reaches the servers on its own.
  bool machinePushReady(int, int) const override {
    WEFT_THROW("local aggregation sums a machine's pushes of one clock, which {} does not keep in step", name_);
  }
  uint64_t oldestReadable(uint64_t) const override {
    WEFT_THROW("local aggregation sums a machine's pushes of one clock, which {} does not keep in step", name_);
  }
  // Other senders' updates change the values at any time.
  bool valuesWaitForOwnPush() const override { return false; }

 private:
  std::string name_;
  bool bounded_;
  int lower_, upper_;
};

int parseBound(const std::string& text, const std::string& field, const std::string& whole) {
  const bool digits = !text.empty() && text.size() < 7 && text.find_first_not_of("0123456789") == std::string::npos;
  WEFT_CHECK(digits, "--sync {}: {} is '{}', not a count of clocks", whole, field, text);
  return std::stoi(text);
}

}  // namespace

std::shared_ptr<const SyncPolicy> bspPolicy() {
  static const std::shared_ptr<const SyncPolicy> bsp = std::make_shared<Bsp>();
  return bsp;
}

std::shared_ptr<const SyncPolicy> aspPolicy() { return std::make_shared<StaleSynchronous>("ASP", false, 0, 0); }

std::shared_ptr<const SyncPolicy> sspPolicy(int staleness) {
  WEFT_CHECK(staleness >= 0, "SSP with staleness {}: a sender cannot be behind the slowest", staleness);
  return std::make_shared<StaleSynchronous>(fmt::format("SSP(s={})", staleness), true, staleness, staleness);
}

std::shared_ptr<const SyncPolicy> dsspPolicy(int lower, int upper) {
  WEFT_CHECK(lower >= 0 && upper >= lower, "DSSP with s_L = {} and s_U = {}: the range needs 0 <= s_L <= s_U", lower,
             upper);
  return std::make_shared<StaleSynchronous>(fmt::format("DSSP(s_L={}, s_U={})", lower, upper), true, lower, upper);
}

std::shared_ptr<const SyncPolicy> parseSyncPolicy(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t colon; (colon = text.find(':', start)) != std::string::npos; start = colon + 1)
    parts.push_back(text.substr(start, colon - start));
  parts.push_back(text.substr(start));
  if (parts == std::vector<std::string>{"bsp"}) return bspPolicy();
  if (parts == std::vector<std::string>{"asp"}) return aspPolicy();
  if (parts.size() == 2 && parts[0] == "ssp") return sspPolicy(parseBound(parts[1], "the staleness S", text));
  if (parts.size() == 3 && parts[0] == "dssp") {
    return dsspPolicy(parseBound(parts[1], "the lower bound SL", text),
                      parseBound(parts[2], "the upper bound SU", text));
  }
  WEFT_THROW("--sync {}: expected bsp, asp, ssp:S or dssp:SL:SU (S, SL <= SU in clocks)", text);
}

}  // namespace weft::dist
