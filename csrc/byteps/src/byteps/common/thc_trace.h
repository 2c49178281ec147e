// byteps-thc: where a worker writes its communication trace (BYTEPS_TRACE_ON=1), and saying
// whether it did (patch 0062 calls both from BytePSGlobal::OutputTraces).
//
// Upstream wrote BYTEPS_TRACE_DIR/<local rank>/comm.json into a folder only its launcher made,
// and printed "output done" whether or not the file could be opened. Every worker of
// `bpslaunch --local N` is local rank 0, so they all wrote one path. The path is keyed by the
// global rank instead; bpslaunch creates BYTEPS_TRACE_DIR/<rank>/ for each of its workers, and a
// worker started otherwise creates its own folder (BYTEPS_TRACE_DIR itself must exist).
#pragma once

#include <sys/stat.h>

#include <iostream>
#include <string>

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

}  // namespace common
}  // namespace byteps
