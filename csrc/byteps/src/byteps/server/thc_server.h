// byteps-thc: the server's protocol for homomorphic keys, THC's and LHC's (see thc_server.cc).
#ifndef BYTEPS_SERVER_THC_SERVER_H
#define BYTEPS_SERVER_THC_SERVER_H

#include <cstddef>
#include <cstdint>

#include "ps/ps.h"

namespace byteps {
namespace server {

// Called by BytePSHandler for every request, under its lock, with the decoded key and the
// length/dtype of the key's store (0/-1 before the first push). Returns true when the request
// belongs to a homomorphic codec and has been answered (or queued); false leaves it to BytePS.
//
// Those requests: a compressor registration whose kwargs say compressor_type=thc (or lhc); every
// push and pull of a key registered that way; the norm round (request type
// thcwire::kThcNormRequest) and LHC's fallback round. A registration whose kwargs name no
// compressor BytePS has (compressor/kwargs_check.h) is taken too and refused: BytePS's own
// registration would abort on it; every round of that key then fails with the refusal.
// A bad request never aborts the server: it is logged with the key and the sender, the round it
// belongs to fails, and the pulls of that round return the error to every worker.
bool ThcHandleRequest(int request_type, uint64_t key, const ps::KVMeta& req_meta,
                      const ps::KVPairs<char>& req_data, ps::KVServer<char>* server,
                      size_t stored_len, int stored_dtype);

}  // namespace server
}  // namespace byteps

#endif  // BYTEPS_SERVER_THC_SERVER_H
