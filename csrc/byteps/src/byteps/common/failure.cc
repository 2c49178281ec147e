// byteps-thc: failures as statuses, the registry of operations in flight (see failure.h).
// FailCluster/ClusterFailed are in every library (the server's too); the registry is worker-only.
#include "failure.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"
#include "logging.h"

namespace byteps {
namespace common {
namespace {

// The cluster's state. `mu` also guards the registry, so that an operation is either registered
// before FailCluster takes its snapshot or sees the failure when it tries to register.
std::mutex& Mutex() {
  static std::mutex* mu = new std::mutex;  // never destroyed: callable during static teardown
  return *mu;
}
std::atomic<bool> g_failed{false};
std::string g_why;  // written once, under Mutex(), before g_failed is set

std::string FailureMessage(const std::string& tensor_name, const std::string& why) {
  return "byteps-thc: push_pull of tensor '" + tensor_name +
         "' failed: the cluster has failed: " + why;
}

#ifndef BYTEPS_BUILDING_SERVER
// One tensor operation in flight.
struct Operation {
  std::string name;
  StatusCallback callback;  // the framework's
  std::atomic<bool> done{false};
  std::mutex mu;
  std::condition_variable writes_done;
  int writers = 0;    // WriteOutput calls under way (mu)
  std::string error;  // the first failure of one of its partitions
};

using Registry = std::unordered_map<const void*, std::shared_ptr<Operation>>;
Registry& Ops() {
  static Registry* ops = new Registry;
  return *ops;
}

// The operation's key: its partitions share one counter.
const void* IdOf(const TensorTableEntry& e) { return e.counter_ptr.get(); }

std::shared_ptr<Operation> Find(const void* id) {
  std::lock_guard<std::mutex> lock(Mutex());
  auto it = Ops().find(id);
  return it == Ops().end() ? nullptr : it->second;
}

// Returns true when `why` became the operation's error (its first).
bool SetError(Operation* op, const std::string& why) {
  std::lock_guard<std::mutex> lock(op->mu);
  if (!op->error.empty()) return false;
  op->error = why;
  return true;
}

// Runs the framework's callback, once: with the operation's error if it has one.
void Complete(const std::shared_ptr<Operation>& op, const void* id, const Status& status) {
  if (op->done.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(Mutex());
    auto it = Ops().find(id);
    if (it != Ops().end() && it->second == op) Ops().erase(it);
  }
  std::string error;
  {
    std::unique_lock<std::mutex> lock(op->mu);
    // a write that began before `done` was set ends before the script gets its tensor back
    op->writes_done.wait(lock, [&op] { return op->writers == 0; });
    error = op->error;
  }
  op->callback(error.empty() ? status : Status::Aborted(error));
}
#endif  // !BYTEPS_BUILDING_SERVER

}  // namespace

bool ClusterFailed(std::string* why) {
  if (!g_failed.load()) return false;
  if (why) {
    std::lock_guard<std::mutex> lock(Mutex());
    *why = g_why;
  }
  return true;
}

bool FinalizeWithBarrier() { return !g_failed.load(); }

#ifdef BYTEPS_BUILDING_SERVER
void FailCluster(const std::string& why) {
  std::lock_guard<std::mutex> lock(Mutex());
  if (g_failed.load()) return;
  g_why = why;
  g_failed.store(true);
  BPS_LOG(ERROR) << "byteps-thc: the cluster has failed: " << why;
}
#else
void FailCluster(const std::string& why) {
  std::vector<std::pair<const void*, std::shared_ptr<Operation>>> ops;
  {
    std::lock_guard<std::mutex> lock(Mutex());
    if (g_failed.load()) return;
    g_why = why;
    g_failed.store(true);
    ops.assign(Ops().begin(), Ops().end());
  }
  BPS_LOG(ERROR) << "byteps-thc: the cluster has failed: " << why << " (" << ops.size()
                 << " push_pull operations in flight fail with it)";
  for (auto& p : ops) {
    SetError(p.second.get(), FailureMessage(p.second->name, why));
    Complete(p.second, p.first, Status::OK());
  }
}

void FinishOrProceed(std::shared_ptr<TensorTableEntry> task);  // core_loops.cc

bool RefuseAfterFailure(const std::string& tensor_name,
                        const std::function<void(const Status&)>& callback) {
  std::string why;
  if (!ClusterFailed(&why)) return false;
  callback(Status::Aborted(FailureMessage(tensor_name, why)));
  return true;
}

bool TrackOperation(TensorTableEntry* entry) {
  auto op = std::make_shared<Operation>();
  op->name = entry->tensor_name;
  op->callback = entry->callback;
  const void* id = IdOf(*entry);
  std::string why;
  {
    std::lock_guard<std::mutex> lock(Mutex());
    if (g_failed.load()) {
      why = g_why;
    } else {
      Ops()[id] = op;
    }
  }
  if (!why.empty()) {
    entry->callback(Status::Aborted(FailureMessage(entry->tensor_name, why)));
    return false;
  }
  entry->callback = [op, id](const Status& status) { Complete(op, id, status); };
  return true;
}

void RecordFailure(const std::shared_ptr<TensorTableEntry>& task, const std::string& why) {
  auto op = Find(IdOf(*task));
  if (!op) return;  // already completed (the cluster failed first)
  if (SetError(op.get(), why)) BPS_LOG(ERROR) << why;
}

bool WaitUnlessFailed(const std::function<void(const std::function<void()>&)>& push) {
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto d = std::make_shared<Done>();  // the callback may outlive this wait
  push([d]() {
    std::lock_guard<std::mutex> lock(d->mu);
    d->done = true;
    d->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(d->mu);
  while (!d->done) {
    if (g_failed.load()) return false;
    d->cv.wait_for(lock, std::chrono::milliseconds(100));
  }
  return true;
}

void FinishPartitionNow(std::shared_ptr<TensorTableEntry> task) {
  // FinishOrProceed retires the current stage (its credit included) and, with nothing left in the
  // list, counts the partition as done; the last one runs the callback.
  if (task->queue_list.size() > 1) task->queue_list.resize(1);
  FinishOrProceed(std::move(task));
}

bool WriteOutput(const std::shared_ptr<TensorTableEntry>& task,
                 const std::function<void()>& write) {
  auto op = Find(IdOf(*task));
  bool open = false;
  if (op) {
    std::lock_guard<std::mutex> lock(op->mu);
    open = !op->done.load();
    if (open) ++op->writers;
  }
  if (!open) {
    BPS_LOG(DEBUG) << "byteps-thc: a late reply for '" << task->tensor_name << "' (key "
                   << task->key << ") after its push_pull completed: not written";
    FinishPartitionNow(task);
    return false;
  }
  write();
  {
    std::lock_guard<std::mutex> lock(op->mu);
    --op->writers;
  }
  op->writes_done.notify_all();
  return true;
}

void FailPartition(std::shared_ptr<TensorTableEntry> task, const std::string& why) {
  RecordFailure(task, why);
  FinishPartitionNow(std::move(task));
}
#endif  // BYTEPS_BUILDING_SERVER

}  // namespace common
}  // namespace byteps

extern "C" void byteps_thc_fail_cluster(const char* why) {
  byteps::common::FailCluster(why && *why ? why : "byteps_thc_fail_cluster() without a reason");
}

extern "C" int byteps_thc_cluster_failed(char* buf, int len) {
  std::string why;
  if (!byteps::common::ClusterFailed(&why)) return 0;
  if (buf && len > 0) {
    size_t n = std::min(why.size(), static_cast<size_t>(len - 1));
    std::memcpy(buf, why.data(), n);
    buf[n] = 0;
  }
  return 1;
}
