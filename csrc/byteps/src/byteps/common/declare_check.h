// byteps-thc: one BytePS name, one tensor. Our file, hooked into operations.cc by
// csrc/byteps/patches/0090-common-declare-check.patch.
//
// BytePS keys a tensor by its name: the first push under a name fixes the key's partitions and
// buffer sizes, here and on the server. A second tensor pushed under the same name with another
// size or dtype used to end in a CHECK failure or a ps-lite abort (e.g. upstream TensorFlow's eager
// DistributedGradientTape, which gave every gradient the same name). Every framework plugin
// reaches EnqueueTensor, so the check lives there and its error reaches the framework like any
// other push_pull result.
#ifndef BYTEPS_COMMON_DECLARE_CHECK_H
#define BYTEPS_COMMON_DECLARE_CHECK_H

#include <cstddef>
#include <string>

#include "common.h"

namespace byteps {
namespace common {

// Records what `name` was initialised with (InitTensor, once per name).
void RecordDeclaredTensor(const std::string& name, size_t size, int dtype);

// OK when `tensor` matches what `name` was initialised with (or nothing was recorded);
// otherwise INVALID_ARGUMENT naming the tensor, the first declaration and this tensor. ABORTED
// with the refusal when `name` was declared with compressor kwargs that name no registered
// compressor (compressor/kwargs_check.h).
Status CheckDeclaredTensor(const std::string& name, const Tensor& tensor);

// "float32" ... for messages.
const char* DataTypeName(int dtype);

}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_COMMON_DECLARE_CHECK_H
