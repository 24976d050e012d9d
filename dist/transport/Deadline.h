// Every wait in the distribution layer has a deadline: a point on the steady clock.
#pragma once

#include <chrono>

namespace weft::dist {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

}  // namespace weft::dist
