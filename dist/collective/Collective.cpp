// The backends' registry (see the header).
#include "dist/collective/Collective.h"

#include "core/Error.h"
#include "dist/Registry.h"

namespace weft::dist {

CollectiveBackend::CollectiveBackend() : id_(Registry<CollectiveBackend>::instance().add(this)) {}

CollectiveBackend::~CollectiveBackend() { Registry<CollectiveBackend>::instance().remove(id_); }

CollectiveBackend& CollectiveBackend::byId(int64_t id) {
  CollectiveBackend* backend = Registry<CollectiveBackend>::instance().find(id);
  WEFT_CHECK(backend != nullptr, "no collective backend {} in this process (the graph's collective ops belong to a "
             "runner that no longer exists)", id);
  return *backend;
}

}  // namespace weft::dist
