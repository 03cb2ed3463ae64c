// The machine's memory: what sizes read from outside input (files, flags, tensors) are
// checked against before an allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace diffattn {

// Physical memory of this machine in bytes (0 if the system does not say).
int64_t memory_bytes();
// Throws InvalidArgument "<what> needs about X GiB, more than this machine's Y GiB of memory"
// when bytes exceeds memory_bytes(), or "... more than this process's limit (ulimit -v) of Y GiB
// of memory" when RLIMIT_AS, RLIMIT_DATA or the cgroup's memory.max is lower: called before an
// allocation whose size comes from a file or a flag, so it fails with words instead of
// std::bad_alloc, the OOM killer or a swap storm.
void check_fits_in_memory(double bytes, const std::string& what);

// Storage for KV caches: page-aligned plus a fixed offset, so that every 64-byte row starts on
// a cache line and the values sit half a page off the keys. A large malloc starts 16 bytes past
// a page boundary: each 64-byte vector load of a row would touch two lines, and the decode
// kernel's compute on a hot cache took 15-25 % more time. Keys and values at the same offset
// within their pages put the rows of one key tile and its value tile in the same L1 sets; half
// a page apart, a 1-thread decode of 128K keys ran 5-20 % faster (F32 and F16, Zen 4).
inline constexpr std::size_t kPageBytes = 4096;
inline constexpr std::size_t kKeyPageOffset = 0;
inline constexpr std::size_t kValuePageOffset = 2048;

template <typename T, std::size_t kOffset>
struct PageOffsetAllocator {
  static_assert(kOffset % 64 == 0 && kOffset < kPageBytes);
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = PageOffsetAllocator<U, kOffset>;
  };
  PageOffsetAllocator() = default;
  template <typename U>
  PageOffsetAllocator(const PageOffsetAllocator<U, kOffset>&) noexcept {}  // NOLINT: rebinding
  T* allocate(std::size_t n) {
    if (n > (static_cast<std::size_t>(-1) - kOffset) / sizeof(T)) throw std::bad_array_new_length();
    char* base =
        static_cast<char*>(::operator new(n * sizeof(T) + kOffset, std::align_val_t{kPageBytes}));
    return reinterpret_cast<T*>(base + kOffset);
  }
  void deallocate(T* p, std::size_t) noexcept {
    ::operator delete(reinterpret_cast<char*>(p) - kOffset, std::align_val_t{kPageBytes});
  }
  template <typename U>
  bool operator==(const PageOffsetAllocator<U, kOffset>&) const noexcept { return true; }
};

template <typename T, std::size_t kOffset = kKeyPageOffset>
using PageVector = std::vector<T, PageOffsetAllocator<T, kOffset>>;

// An array of n uninitialised T at kOffset past a page boundary (its pages untouched until
// written), freed by the same allocator.
template <typename T, std::size_t kOffset>
struct PageArrayFree {
  void operator()(T* p) const noexcept { PageOffsetAllocator<T, kOffset>().deallocate(p, 0); }
};
template <typename T, std::size_t kOffset = kKeyPageOffset>
using PageArray = std::unique_ptr<T[], PageArrayFree<T, kOffset>>;
template <typename T, std::size_t kOffset = kKeyPageOffset>
PageArray<T, kOffset> new_page_array(std::size_t n) {
  return PageArray<T, kOffset>(PageOffsetAllocator<T, kOffset>().allocate(n));
}

}  // namespace diffattn
