// byteps-thc: a worker that leaves early ends the cluster at once (patch 0023 hooks it in).
//
// A worker that finalizes (bps.shutdown(), which BytePS also runs when the script ends, an
// exception included) waits in ps-lite's final barrier for the others, heartbeating all along,
// so the dead-node detection never fires; a worker still training waits for its pushes forever.
// So a finalizing worker first tells every server (a DEPARTED control message), and each server
// counts every worker's pushes of each key. In synchronous training every worker pushes every
// key equally often (BytePS's init and registration pushes included), so once a worker left
// after c pushes of key k, another worker's push of k beyond c is a round the first will never
// join: the server asks the scheduler (a DEAD_NODE message) to end the cluster, naming both, and
// every node's waits fail as for a dead node. A worker that leaves after the last step, as the
// others do, is never reported. Off under BYTEPS_ENABLE_ASYNC=1, whose workers push unequally.
#ifndef PS_INTERNAL_DEPARTURE_H_
#define PS_INTERNAL_DEPARTURE_H_

#include <cstdint>

#include "ps/internal/message.h"

namespace ps {
namespace departure {

// A worker, in Finalize before its barrier: DEPARTED to every server.
void Departing();
// A server: a worker's DEPARTED arrived.
void OnDeparted(const Message& msg);
// A server: a push request of `key` from node `sender` arrived (KVServer::Process).
void OnPush(uint64_t key, int sender);

}  // namespace departure
}  // namespace ps

#endif  // PS_INTERNAL_DEPARTURE_H_
