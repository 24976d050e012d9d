// A message between the processes of a job as a transport's active messages carry it: a header
// (whose layout the protocol fixes, dist/ServerProtocol.h) and a payload.
#pragma once

#include <cstdint>
#include <vector>

namespace weft::dist {

struct Message {
  std::vector<uint8_t> header;
  std::vector<uint8_t> payload;
};

}  // namespace weft::dist
