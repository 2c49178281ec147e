// byteps-thc: compressor kwargs that name no registered compressor are refused with a message,
// never a CHECK or a FATAL (patch 0030 hooks this into the worker's declare and the registry).
//
// CompressorRegistry::Create builds a compressor from the first of momentum_type (worker only),
// ef_type and compressor_type that the kwargs hold, looking up "<value>_<key>"; the decorators
// then build what they wrap from the rest. An unknown value ended the process in Find's FATAL,
// and kwargs without any of these keys gave a null compressor: a CHECK on the server
// (server.cc), a null call on the worker. The worker refuses such kwargs when a tensor is
// declared, so the tensor stays uncompressed and every push_pull of it fails with the reason;
// the server refuses a registration that carries them (thc_server.cc), so that a worker without
// this check cannot end it either.
#ifndef BYTEPS_COMMON_COMPRESSOR_KWARGS_CHECK_H
#define BYTEPS_COMMON_COMPRESSOR_KWARGS_CHECK_H

#include <string>
#include <unordered_map>

namespace byteps {
namespace common {

using CompressorKwargs = std::unordered_map<std::string, std::string>;

// "" when every *_type key of `kwargs` that Create reads on this side names a registered
// compressor and compressor_type is there (empty kwargs, which mean no compression, included);
// otherwise why not: the kwargs, the names that are registered, and what to do.
std::string CheckCompressorKwargs(const CompressorKwargs& kwargs);

// The worker's declare of `name` with `kwargs` (common::RegisterCompressor): true when they may
// be registered; false when CheckCompressorKwargs refuses them, with the refusal logged and
// recorded for `name`.
bool AcceptCompressorKwargs(const std::string& name, const CompressorKwargs& kwargs);

// The refusal recorded for `name`, or "".
std::string CompressorRefusal(const std::string& name);

}  // namespace common
}  // namespace byteps

// The same for the framework adapters (ctypes): 1 when the declare of `name` was refused, with the
// message copied into buf (NUL-terminated, at most len bytes); else 0.
extern "C" int byteps_thc_compressor_refusal(const char* name, char* buf, int len);

#endif  // BYTEPS_COMMON_COMPRESSOR_KWARGS_CHECK_H
