// byteps-thc: the cluster key for ps-lite's ZeroMQ van (patch 0018 hooks it in).
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
// ZeroMQ 4.1 reports a failed handshake only as a connection that closes. The van therefore
// watches its sockets' events (zmq_socket_monitor):
// - a sender whose peer closed it within kHandshakeSeconds of connecting while this node
//   registers was refused (ZeroMQ does not even retry after a mechanism mismatch): this node
//   fails (liveness's Fail: the handler, or exit status 1) with a message that names the
//   cluster key, instead of waiting for the startup timeout. A peer that died does not look so:
//   its port refuses the TCP connection, which never connects. Once the cluster formed, every
//   node holds the scheduler's key (or none, with it), and a quick close is a peer's teardown;
// - on a keyed node, an accepted connection that closes within kHandshakeSeconds, and that the
//   ZAP handler did not admit, did not complete the handshake: the receiver logs the peer's
//   address, once per host a minute.
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

constexpr double kHandshakeSeconds = 1.0;

// Reads BYTEPS_THC_CLUSTER_KEY (exits on a bad file, see above) and starts the ZAP handler and
// the socket watcher on `context`. Once per context, before any socket of it binds or connects.
void Start(void* context);
// Whether a key is in force (after Start).
bool Enabled();
// `socket` (a ROUTER, before its bind) becomes a CURVE server when a key is in force.
void Receiver(void* socket);
// `socket` (a DEALER, before its connect to `peer`) becomes a CURVE client when a key is in
// force; its refusals are watched either way.
void Sender(void* socket, const Node& peer);
// Stops the handler and the watcher and closes their sockets: after the van closed its own
// sockets, before zmq_ctx_destroy (which waits for every socket of the context).
void Stop();

}  // namespace cluster_key
}  // namespace ps

#endif  // PS_INTERNAL_CLUSTER_KEY_H_
