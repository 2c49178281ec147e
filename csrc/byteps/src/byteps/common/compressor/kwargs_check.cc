// byteps-thc: compressor kwargs that name no registered compressor (see kwargs_check.h).
#include "kwargs_check.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "../logging.h"
#include "compressor_registry.h"

namespace byteps {
namespace common {
namespace {

// The keys Create reads, in its order (the server builds no momentum).
#ifndef BYTEPS_BUILDING_SERVER
const char* const kTypeKeys[] = {"momentum_type", "ef_type", "compressor_type"};
#else
const char* const kTypeKeys[] = {"ef_type", "compressor_type"};
#endif

// The registered values of `key`: "thc" for "thc_compressor_type" under "compressor_type".
std::vector<std::string> Registered(const std::string& key) {
  std::vector<std::string> out;
  const std::string suffix = "_" + key;
  for (const auto& name : compressor::CompressorRegistry::Names()) {
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      out.push_back(name.substr(0, name.size() - suffix.size()));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Join(const std::vector<std::string>& words) {
  std::string s;
  for (const auto& w : words) s += (s.empty() ? "" : ", ") + w;
  return s.empty() ? "(none)" : s;
}

std::string Describe(const CompressorKwargs& kwargs) {
  std::map<std::string, std::string> sorted(kwargs.begin(), kwargs.end());
  std::string s;
  for (const auto& kv : sorted) s += (s.empty() ? "" : ", ") + kv.first + "=" + kv.second;
  return "{" + s + "}";
}

std::mutex mu_;
std::unordered_map<std::string, std::string>& Refusals() {
  static auto* table = new std::unordered_map<std::string, std::string>();
  return *table;
}

}  // namespace

std::string CheckCompressorKwargs(const CompressorKwargs& kwargs) {
  if (kwargs.empty()) return "";
  const std::string what =
      "compressor kwargs " + Describe(kwargs) + " name no registered compressor: ";
  const std::string todo =
      "Declare the tensor with compressor_type set to one of those (byteps_thc's "
      "Compression.thc() and Compression.lhc(), and bpslaunch --compressor, do), or with no "
      "kwargs for no compression.";
  auto type = kwargs.find("compressor_type");
  if (type == kwargs.end()) {
    return what + "compressor_type is missing (registered: " + Join(Registered("compressor_type")) +
           "). " + todo +
           " BytePS's MXNet byteps_declare_tensor drops the first word of every key, so there "
           "it is byteps_compressor_type.";
  }
  for (const char* key : kTypeKeys) {
    auto it = kwargs.find(key);
    if (it == kwargs.end()) continue;
    // Create never stacks the EF decorator on THC (patch 0041)
    if (std::string(key) == "ef_type" && type->second == "thc") continue;
    const auto known = Registered(key);
    if (std::find(known.begin(), known.end(), it->second) != known.end()) continue;
    return what + key + "=" + it->second + " is not one of " + Join(known) + ". " + todo;
  }
  return "";
}

bool AcceptCompressorKwargs(const std::string& name, const CompressorKwargs& kwargs) {
  std::string why = CheckCompressorKwargs(kwargs);
  std::lock_guard<std::mutex> lock(mu_);
  if (why.empty()) {
    Refusals().erase(name);  // a declare with good kwargs replaces a refused one
    return true;
  }
  why = "BytePS tensor '" + name + "': " + why;
  BPS_LOG(ERROR) << why;
  Refusals()[name] = why;
  return false;
}

std::string CompressorRefusal(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = Refusals().find(name);
  return it == Refusals().end() ? std::string() : it->second;
}

}  // namespace common
}  // namespace byteps

extern "C" int byteps_thc_compressor_refusal(const char* name, char* buf, int len) {
  const std::string why = byteps::common::CompressorRefusal(name ? name : "");
  if (why.empty()) return 0;
  if (buf && len > 0) {
    const size_t n = std::min(why.size(), static_cast<size_t>(len - 1));
    std::memcpy(buf, why.data(), n);
    buf[n] = '\0';
  }
  return 1;
}
