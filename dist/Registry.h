// Runtime objects that graph ops find by number: an op's attributes hold an id, never a pointer,
// and an id finds its object only while the object is alive.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

namespace weft::dist {

template <class T>
class Registry {
 public:
  /// The one registry of T objects in this process.
  static Registry& instance() {
    static Registry registry;
    return registry;
  }
  /// Registers `object` under a new id, which it keeps until remove().
  int64_t add(T* object) {
    std::lock_guard lock(mutex_);
    objects_[next_] = object;
    return next_++;
  }
  void remove(int64_t id) {
    std::lock_guard lock(mutex_);
    objects_.erase(id);
  }
  /// The object of `id`, or null when there is none (any more).
  T* find(int64_t id) const {
    std::lock_guard lock(mutex_);
    const auto it = objects_.find(id);
    return it == objects_.end() ? nullptr : it->second;
  }

 private:
  mutable std::mutex mutex_;
  std::map<int64_t, T*> objects_;
  int64_t next_ = 1;
};

}  // namespace weft::dist
