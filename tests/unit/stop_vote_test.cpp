// What members vote on at a step boundary, from what their agent heard: a stop that asks for a
// checkpoint where it stops (SIGTERM, troupe stop --checkpoint) asks in its own message, so the
// vote that stops is the vote that takes the checkpoint. Sent as two messages, a checkpoint and
// then a stop, they could reach an agent on either side of a vote (under a loaded machine they
// did): the checkpoint a step early, none where the job stopped, and the job not resumable.
#include <gtest/gtest.h>

#include "actors/job_protocol.h"
#include "workers/generation_board.h"
#include "workers/worker.h"

namespace troupe::workers {
namespace {

Requests requests_of(const GenerationBoard& board) {
  return {[&board] { return board.stop_requested(); },
          [&board] { return board.checkpoint_wanted(); },
          [&board] { return board.checkpoint_at_stop(); }};
}

TEST(StopVote, AStopWithACheckpointIsOneMessage) {
  EXPECT_TRUE(actors::make_stop_at_next_step(true).envelope().getBody().isStopWithCheckpoint());
  EXPECT_TRUE(actors::make_stop_at_next_step(false).envelope().getBody().isStopAtNextStep());
}

TEST(StopVote, AStopWithACheckpointTakesOneWhereItStopsWhateverWasTakenBefore) {
  GenerationBoard board;
  const Requests r = requests_of(board);
  board.checkpoint_at_step(5);
  EXPECT_FALSE(checkpoint_voted(r, 0, 3));  // (wanted at the boundary before step 5)
  EXPECT_TRUE(checkpoint_voted(r, 0, 4));   // taken there: requested through step 5
  EXPECT_FALSE(checkpoint_voted(r, 5, 5));
  board.stop_at_next_step(/*with_checkpoint=*/true);  // heard after the vote of step 4
  EXPECT_TRUE(r.stop());
  EXPECT_TRUE(checkpoint_voted(r, 5, 5));  // where it stops
}

TEST(StopVote, APlainStopOrALeaveTakesNoCheckpoint) {
  GenerationBoard board;
  const Requests r = requests_of(board);
  board.leave(1);
  EXPECT_FALSE(checkpoint_voted(r, 0, 7));
  board.stop_at_next_step();
  EXPECT_TRUE(r.stop());
  EXPECT_FALSE(checkpoint_voted(r, 0, 7));
}

}  // namespace
}  // namespace troupe::workers
