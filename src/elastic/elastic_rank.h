// A rank process of an elastic job (`lattice launch`): it joins every generation its agent
// assigns, on a Gloo world of that generation, and survives the loss of a peer (docs/elastic.md,
// "The timeline of a recovery").
//
//   RankSession session(0, config.elastic);
//   run_elastic_rank(session, [&](Communicator& world, const Assignment& a) { train... }, comm);
//
// A generation's body ends in one of three ways: it returns (the job is done: so does this),
// it throws an error of its own (a bad input, an injected throw, a full disk: rethrown, the
// process ends and its agent decides), or it loses a peer — a CommError or a timeout, since a
// dead peer closes its Gloo connections and a failed call closes this rank's, so every rank of
// the world learns of it at once. Then the process stays: it unwinds the generation (model,
// groups, connections), waits for the agent's next assignment (the same rank with a
// replacement beside it, or another rank of a smaller world), and runs the body again in the
// new generation, which restores the newest in-memory snapshot. A spare (no assignment yet)
// waits for its first.
#pragma once

#include <functional>

#include "comm/communicator.h"
#include "elastic/rank_session.h"

namespace lattice {

using ElasticRankBody = std::function<void(Communicator& world, const Assignment& assignment)>;

// `config.timeout` is also how long a rank that lost its peers waits for the agent's next
// assignment before it gives up with the error that ended its generation. LATTICE_STORE (the
// rendezvous FileStore, or agent 0's Redis store across nodes), LATTICE_BIND_ADDR and
// LATTICE_JOB_SECRET (every connection proves it: comm/gloo_transport.h) come from the
// environment the agent set.
void run_elastic_rank(RankSession& session, const ElasticRankBody& body, CommConfig config);

}  // namespace lattice
