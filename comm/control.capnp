# The control protocol: every message between Troupe processes is one Envelope.
# Field numbers are never reused; add new message kinds at the end of the union.
@0xdfac8f2007fc1ba4;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::proto");

struct Envelope {
  jobId @0 :Text;          # the job this message belongs to; a mismatch is rejected
  token @1 :Data;          # the job's secret token; a mismatch is rejected
  generation @2 :UInt64;   # sender's membership generation; 0 = not generation-scoped
  srcNode @3 :UInt64;      # the sending process's node id (must match the transport's)
  srcActor @4 :UInt64;     # the sending actor within srcNode; 0 = anonymous
  dstActor @5 :UInt64;     # the destination actor within the receiving process
  requestId @6 :UInt64;    # nonzero on a request and on its reply; 0 on a one-way message
  isReply @7 :Bool;        # true when this message answers requestId

  body :union {
    heartbeat @8 :Heartbeat;   # liveness, sent every heartbeat_interval_ms
    echo @9 :Echo;             # a ping answered with the same content (demo, tests, benchmarks)
    error @10 :ErrorReply;     # a request could not be served
    fenced @11 :Fenced;        # the receiver refuses the sender: rejoin as a new member
    statsRequest @12 :Void;    # asks a process for its control-plane counters
    stats @13 :Stats;          # the answer to statsRequest
  }
}

struct Heartbeat {
  sequence @0 :UInt64;     # increases by one per heartbeat from one sender
  sentUnixUs @1 :UInt64;   # sender's wall clock, for logs only (never compared across hosts)
}

struct Echo {
  sequence @0 :UInt64;     # chosen by the requester, returned unchanged
  payload @1 :Data;        # returned unchanged
  note @2 :Text;           # free text, returned unchanged
}

struct ErrorReply {
  code @0 :Text;           # peer_lost | timed_out | aborted | invalid_input | io | internal | no_actor
  message @1 :Text;        # what went wrong, for a person
}

struct Fenced {
  reason @0 :Text;         # why the sender is refused
}

struct Stats {
  framesReceived @0 :UInt64;      # frames that reached the control plane
  framesAccepted @1 :UInt64;      # frames delivered to an actor or the bridge
  rejectedMalformed @2 :UInt64;   # not a Cap'n Proto envelope (random bytes, truncated, limits)
  rejectedOversized @3 :UInt64;   # larger than the frame size cap
  rejectedWrongJob @4 :UInt64;    # job id or token mismatch
  rejectedStale @5 :UInt64;       # generation older than the receiver's
  rejectedFenced @6 :UInt64;      # from a fenced node
  rejectedNoActor @7 :UInt64;     # destination actor unknown
  rejectedTransport @8 :UInt64;   # refused by the transport (bad header, unknown peer, fenced)
  framesSent @9 :UInt64;          # frames handed to UCX by this process
}
