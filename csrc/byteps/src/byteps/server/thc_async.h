// byteps-thc: what an asynchronous server (BYTEPS_ENABLE_ASYNC=1) answers a pull with (patch
// 0061 calls it from SendPullResponse).
//
// In async mode the server adds every push of a key into its store as it arrives and its merge
// buffer stays empty, so a pull must be served from the store: the sum of every worker's pushes
// of that key so far, starting from BytePS's blocking first push of the key (a zeroed buffer).
// The reply is the store itself, without a copy, as upstream's sync path serves its merge
// buffer: a push that arrives while a reply is on its way may be partly in it, which
// asynchronous training accepts by design. Only uncompressed keys are served so: the workers
// refuse asynchronous training with a compressor (byteps_thc.torch.async_refusal).
#pragma once

#include "server.h"

namespace byteps {
namespace server {

inline void AsyncPullSource(const BytePSArray* stored, BytePSArray* merged) {
  merged->tensor = stored->tensor;
  merged->len = stored->len;
  merged->dtype = stored->dtype;
}

}  // namespace server
}  // namespace byteps
