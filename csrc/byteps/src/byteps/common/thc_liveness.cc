// byteps-thc: the worker's dead-node handler (see thc_liveness.h).
// byteps-thc-build: worker
#include "thc_liveness.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include "failure.h"
#include "ps/internal/liveness.h"

namespace byteps {
namespace common {

void InstallDeadNodeHandler() {
  ps::SetDeadNodeHandler([](const ps::Node&, const std::string& why) {
    FailCluster(why);
    const int grace = std::max(kMinGraceSeconds, ps::DeadNodeTimeout());
    std::cerr << "byteps-thc: the cluster has failed; this worker exits with status "
              << ps::kDeadNodeExitStatus << " in " << grace << " s unless the script ends first"
              << std::endl;
    // Detached: the process may end (the script's own exit) before it fires.
    std::thread([grace, why] {
      std::this_thread::sleep_for(std::chrono::seconds(grace));
      std::cerr << "byteps-thc: still running " << grace << " s after the cluster failed (" << why
                << "); exiting with status " << ps::kDeadNodeExitStatus << std::endl;
      std::fflush(stderr);
      _exit(ps::kDeadNodeExitStatus);
    }).detach();
  });
}

}  // namespace common
}  // namespace byteps
