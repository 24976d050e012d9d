// Synchronisation rules (see the header).
#include "dist/SyncPolicy.h"

#include "core/Error.h"

namespace weft::dist {

namespace {

class Bsp final : public SyncPolicy {
 public:
  const char* name() const override { return "BSP"; }
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

}  // namespace

std::shared_ptr<const SyncPolicy> bspPolicy() {
  static const std::shared_ptr<const SyncPolicy> bsp = std::make_shared<Bsp>();
  return bsp;
}

}  // namespace weft::dist
