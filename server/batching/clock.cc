#include "server/batching/clock.h"

namespace attnserve::server {

RealClock* RealClock::Get() {
  static RealClock* const clock = new RealClock();
  return clock;
}

}  // namespace attnserve::server
