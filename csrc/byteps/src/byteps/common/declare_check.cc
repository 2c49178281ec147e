// byteps-thc: one BytePS name, one tensor (see declare_check.h).
// byteps-thc-build: worker
#include "declare_check.h"
#include "compressor/kwargs_check.h"

#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>

namespace byteps {
namespace common {

namespace {

struct Declared {
  size_t size;
  int dtype;
};

std::mutex mutex_;
std::unordered_map<std::string, Declared>& Table() {
  static auto* table = new std::unordered_map<std::string, Declared>();
  return *table;
}

std::string Describe(size_t size, int dtype, const std::string& shape) {
  std::ostringstream os;
  os << DataTypeName(dtype);
  if (!shape.empty()) os << shape;
  os << " (" << size << " bytes)";
  return os.str();
}

}  // namespace

const char* DataTypeName(int dtype) {
  switch (dtype) {
    case BYTEPS_FLOAT32: return "float32";
    case BYTEPS_FLOAT64: return "float64";
    case BYTEPS_FLOAT16: return "float16";
    case BYTEPS_UINT8: return "uint8";
    case BYTEPS_INT32: return "int32";
    case BYTEPS_INT8: return "int8";
    case BYTEPS_INT64: return "int64";
    default: return "unknown dtype";
  }
}

void RecordDeclaredTensor(const std::string& name, size_t size, int dtype) {
  std::lock_guard<std::mutex> lock(mutex_);
  Table().emplace(name, Declared{size, dtype});
}

Status CheckDeclaredTensor(const std::string& name, const Tensor& tensor) {
  // ABORTED, a failed push_pull's status (torch RuntimeError, TF InternalError, MXNetError)
  const std::string refused = CompressorRefusal(name);
  if (!refused.empty()) return Status::Aborted(refused);
  Declared first;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = Table().find(name);
    if (it == Table().end()) return Status::OK();
    first = it->second;
  }
  size_t size = static_cast<size_t>(tensor.size());
  int dtype = static_cast<int>(tensor.dtype());
  if (size == first.size && dtype == first.dtype) return Status::OK();
  std::ostringstream os;
  os << "BytePS tensor name '" << name << "' is used by two different tensors: it was declared "
     << "with " << Describe(first.size, first.dtype, "") << " and is now pushed with "
     << Describe(size, dtype, tensor.shape().DebugString())
     << ". One name identifies one tensor on every worker and server; give each tensor "
     << "its own name.";
  return Status::InvalidArgument(os.str());
}

}  // namespace common
}  // namespace byteps
