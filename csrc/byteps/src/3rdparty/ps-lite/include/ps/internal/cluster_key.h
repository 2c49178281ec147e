// byteps-thc: the cluster key for ps-lite's ZeroMQ van (patch 0022 hooks it in).
//
// With BYTEPS_THC_CLUSTER_KEY=FILE, every connection of this node uses ZeroMQ's CURVE security
// (an authenticated, encrypted channel; libzmq built with libsodium). The cluster shares one
// Curve25519 key pair whose secret half is in FILE (its public half follows from it):
// - the node's receiver (a ROUTER) is a CURVE server with that secret key; a ZAP handler on the
//   node's ZeroMQ context admits a client only when the long-term key it proved to hold in the
//   handshake is the cluster's;
// - every sender (a DEALER) is a CURVE client that expects the cluster's public key as the
//   server's and presents the cluster's pair as its own.
// So a peer without FILE can neither register, push, pull nor read a message: its handshake
// fails before any ps-lite message is delivered. Unset (or empty), connections are ZeroMQ's
// plaintext NULL mechanism, as upstream.
//
// A refused node learns nothing from ZeroMQ 4.1's handshake but a closed connection, and
// ps-lite's own sockets would retry until the startup timeout. So every worker and server, keyed
// or not, checks the scheduler's handshake once, beside ps-lite's start, with a socket of its own
// (cluster_key.cc, Probe): connections that the scheduler closes at once, three in a row, end the
// node with a message that names the key (another one, or none where the scheduler has one). The
// startup timeout's message still names a key as a cause, for what the check misses.
//
// A keyed node logs the connections it refuses in the handshake, as ZeroMQ drops them (our patch
// of ZeroMQ, csrc/byteps/patches/zeromq/, calls the hook that Start sets): its role and address,
// the peer's address and the cause (not a ZeroMQ peer, no cluster key, another key), one line
// per peer address and cause a minute at most, with how many it did not log; Stop logs how many
// it refused in all. A peer that sent no byte (a port check) is not logged.
//
// The key file holds one line of 64 hex digits (the 32-byte secret key) and '#' comments; it
// must be a regular file that only its owner can read or write (mode 0600 or stricter), as ssh
// asks of a private key. A file that is missing, readable by others or malformed ends the node
// at start with status kStartupExitStatus and a message naming the file and what to do.
#ifndef PS_INTERNAL_CLUSTER_KEY_H_
#define PS_INTERNAL_CLUSTER_KEY_H_

#include <string>

#include "ps/internal/message.h"

namespace ps {
namespace cluster_key {

// Reads BYTEPS_THC_CLUSTER_KEY (exits on a bad file, see above), with a key starts the ZAP
// handler on `context`, and on a worker or server the handshake check. Once per context, before
// any socket of it binds or connects.
void Start(void* context);
// `socket` (a ROUTER, before its bind) becomes a CURVE server when a key is in force.
void Receiver(void* socket);
// `socket` (a DEALER, before its connect and before any other thread uses it) becomes a CURVE
// client when a key is in force.
void Sender(void* socket);
// Logs the summary of the refused connections (if any), stops the handshake check and the ZAP
// handler and closes its socket: after the van closed its own sockets, before zmq_ctx_destroy
// (which waits for every socket of the context).
void Stop();

}  // namespace cluster_key
}  // namespace ps

#endif  // PS_INTERNAL_CLUSTER_KEY_H_
