// byteps-thc: where a worker writes its communication trace (BYTEPS_TRACE_ON=1), and saying
// whether it did (patch 0062 calls both from BytePSGlobal::OutputTraces).
//
// Upstream wrote BYTEPS_TRACE_DIR/<local rank>/comm.json into a folder only its launcher made,
// and printed "output done" whether or not the file could be opened. Every worker of
// `bpslaunch --local N` is local rank 0, so they all wrote one path. The path is keyed by the
// global rank instead; bpslaunch creates BYTEPS_TRACE_DIR/<rank>/ for each of its workers, and a
// worker started otherwise creates its own folder (BYTEPS_TRACE_DIR itself must exist).
//
// A partition's stage event carries the bytes of that stage in its args (`"bytes": N`, patch
// 0064): COMPRESS and DECOMPRESS the payload they made or read, PUSH what was sent, PULL the
// reply, THC_NORM the norm round's push and reply. Other stages (the copies, the local reduce)
// say nothing.
#pragma once

#include <sys/stat.h>

#include <iostream>
#include <memory>
#include <string>

#include "common.h"

namespace byteps {
namespace common {

inline std::string TracePath(const std::string& dir, int rank) {
  const std::string folder = dir + "/" + std::to_string(rank);
  mkdir(folder.c_str(), 0755);  // it usually exists; any other failure shows at the write
  return folder + "/comm.json";
}

inline void ReportTrace(const std::string& path, bool written, int rank) {
  if (written) {
    std::cout << "BytePS rank " << rank << ": communication traces output done! (" << path << ")"
              << std::endl;
  } else {
    std::cerr << "BytePS rank " << rank << ": could not write the communication traces to " << path
              << " (BYTEPS_TRACE_DIR must name an existing, writable directory)" << std::endl;
  }
}

// Records `bytes` on the trace event of `task`'s stage `op`, when this step is traced. Only finds
// (never inserts): the loops of other stages may be reading the same maps.
inline void TraceBytes(const std::shared_ptr<TensorTableEntry>& task, int op, size_t bytes) {
  if (!task->context || !task->context->profile_flag) return;
  auto& per_key = task->context->part_comm_time;
  auto k = per_key.find(task->key);
  if (k == per_key.end()) return;
  auto s = k->second.find(op);
  if (s == k->second.end() || s->second.empty()) return;
  s->second.back()->bytes = static_cast<long long>(bytes);
}

// The event's args entry for its bytes: `, "bytes": N`, or nothing when the stage said none.
inline std::string TraceBytesArg(long long bytes) {
  return bytes < 0 ? std::string() : ", \"bytes\": " + std::to_string(bytes);
}

}  // namespace common
}  // namespace byteps
