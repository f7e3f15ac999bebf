// A lowered address-space limit (RLIMIT_AS) for the lifetime of an object: the tests that make an
// allocation fail, or that need what this process may have (memory_limit_bytes) to be a size they
// choose. ASan and TSan reserve terabytes of address space, so such tests skip under them
// (sanitizers.hpp).
#pragma once

#include <sys/resource.h>

#include <fstream>
#include <string>

namespace attn::testing {

/// The process's address space in bytes (VmSize), from /proc/self/status.
inline rlim_t address_space_in_use() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmSize:", 0) == 0)
      return static_cast<rlim_t>(std::stoull(line.substr(7))) * 1024;
  return 0;
}

/// Lowers RLIMIT_AS to the space in use plus `headroom` bytes while it lives.
class AddressSpaceLimit {
 public:
  explicit AddressSpaceLimit(rlim_t headroom) {
    getrlimit(RLIMIT_AS, &old_);
    rlimit lowered = old_;
    lowered.rlim_cur = address_space_in_use() + headroom;
    ok_ = address_space_in_use() > 0 && setrlimit(RLIMIT_AS, &lowered) == 0;
  }
  ~AddressSpaceLimit() { setrlimit(RLIMIT_AS, &old_); }
  AddressSpaceLimit(const AddressSpaceLimit&) = delete;
  AddressSpaceLimit& operator=(const AddressSpaceLimit&) = delete;
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  bool ok_ = false;
};

}  // namespace attn::testing
