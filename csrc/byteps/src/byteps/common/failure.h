// byteps-thc: failures of a push_pull reach the framework as a Status, never a CHECK or an abort.
//
// Every tensor operation (one push_pull: all partitions of one tensor) is registered when
// EnqueueTensor starts it, and its callback is wrapped so that it runs exactly once: when its last
// partition finishes, or earlier, when the cluster fails. A partition that fails records its
// message on the operation (the first one wins) and the callback then gets that error instead of
// OK; the framework raises it (torch RuntimeError, TF InternalError, MXNetError).
//
// A cluster failure (a dead node, a stall timeout: FailCluster) completes every operation in flight
// with its reason, fails every later push_pull at enqueue, and makes BytePS's shutdown skip
// ps-lite's finalize barrier (whose peers may be gone). The first reason wins.
//
// FailCluster and ClusterFailed need nothing of BytePS and may be called from any thread, a
// ps-lite callback included.
#ifndef BYTEPS_COMMON_FAILURE_H
#define BYTEPS_COMMON_FAILURE_H

#include <functional>
#include <memory>
#include <string>

namespace byteps {
namespace common {

class Status;
struct TensorTableEntry;

// Idempotent; the first reason wins. Every push_pull in flight on this worker completes with an
// error carrying `why`, every later one fails at enqueue with it.
void FailCluster(const std::string& why);

// True after FailCluster; *why (if given) is the first reason.
bool ClusterFailed(std::string* why);

// EnqueueTensor, before anything touches the tensor's context: after a cluster failure, runs
// `callback` with the failure (naming the tensor) and returns true: the push_pull is not started.
bool RefuseAfterFailure(const std::string& tensor_name,
                        const std::function<void(const Status&)>& callback);

// EnqueueTensor, once the operation's entry has its callback and counter, before it is split into
// partitions: registers the operation and wraps entry->callback (run once, with the operation's
// first error if a partition failed). False, with the callback run, after a cluster failure.
bool TrackOperation(TensorTableEntry* entry);

// Records `why` as the failure of the partition's tensor operation (the first one wins; the
// first of each operation is logged). The partition goes on through its stages.
void RecordFailure(const std::shared_ptr<TensorTableEntry>& task, const std::string& why);

// Records `why` and finishes the partition now, without its remaining stages.
void FailPartition(std::shared_ptr<TensorTableEntry> task, const std::string& why);

// Finishes the partition now, without its remaining stages (no failure recorded).
void FinishPartitionNow(std::shared_ptr<TensorTableEntry> task);

// A stage that writes into the operation's output (the decode into a CPU tensor, the copy to
// the output): runs `write` and returns true, unless the operation has completed already (the
// cluster failed while this partition waited for a reply that came later). Then nothing is
// written, the partition is finished now and false returned: the script, which got the error,
// owns that tensor again. An operation completing meanwhile waits for a `write` under way, so
// that no write lands after its callback.
bool WriteOutput(const std::shared_ptr<TensorTableEntry>& task, const std::function<void()>& write);

// InitTensor's blocking pushes: `push(done)` issues one with `done` as its callback; waits until
// done runs (true) or the cluster fails (false: the push may never be answered, InitTensor gives
// up and EnqueueTensor fails the push_pull with the reason).
bool WaitUnlessFailed(const std::function<void(const std::function<void()>&)>& push);

// BytePS's shutdown: false after a cluster failure (ps-lite's finalize barrier would wait for peers
// that may be dead).
bool FinalizeWithBarrier();

}  // namespace common
}  // namespace byteps

// The same for scripts and watchdogs (ctypes: byteps_thc.torch.fail_cluster). The reason is copied.
extern "C" void byteps_thc_fail_cluster(const char* why);
// 1 after a cluster failure, with its reason copied into buf (NUL-terminated, at most len bytes).
extern "C" int byteps_thc_cluster_failed(char* buf, int len);

#endif  // BYTEPS_COMMON_FAILURE_H
