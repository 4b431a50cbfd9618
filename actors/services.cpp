#include "actors/services.h"

#include "actors/messages.h"

namespace troupe::actors {

caf::actor spawn_echo(caf::actor_system& system) {
  return system.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](ControlMessage& m) -> ControlMessage {
      auto body = m.envelope().getBody();
      if (!body.isEcho())
        return make_error_reply(comm::Errc::invalid_input, "the echo actor only answers echo");
      auto e = body.getEcho();
      return make_echo(e.getSequence(), e.getPayload().begin(), e.getPayload().size(),
                       e.getNote().cStr());
    }};
  });
}

caf::actor spawn_sink(caf::actor_system& system) {
  return system.spawn([](caf::event_based_actor*) -> caf::behavior {
    auto count = std::make_shared<uint64_t>(0);
    return {[count](ControlMessage& m) -> ControlMessage {
      if (m.envelope().getRequestId() == 0) {  // one way: count it
        ++*count;
        return {};
      }
      return make_echo(*count, nullptr, 0, "count");
    }};
  });
}

}  // namespace troupe::actors
