#include "base/allocator.h"

#include <cstdlib>

#ifdef FERRY_WITH_MIMALLOC
#include <mimalloc.h>
#endif

namespace ferry {

std::string allocator_name() {
#ifdef FERRY_WITH_MIMALLOC
  const int v = mi_version();
  return "mimalloc " + std::to_string(v / 100) + "." + std::to_string((v / 10) % 10) + "." + std::to_string(v % 10);
#else
  return "system malloc (sanitizer build)";
#endif
}

bool malloc_is_mimalloc() {
#ifdef FERRY_WITH_MIMALLOC
  // volatile: keeps the compiler from eliding the malloc/free pair this question is about.
  void* volatile p = std::malloc(64);
  const bool ours = p != nullptr && mi_is_in_heap_region(p);
  std::free(p);
  return ours;
#else
  return false;
#endif
}

void keep_freed_memory() {
#ifdef FERRY_WITH_MIMALLOC
#if MI_MALLOC_VERSION >= 210 || (MI_MALLOC_VERSION >= 180 && MI_MALLOC_VERSION < 200)
  mi_option_set(mi_option_purge_delay, -1);  // 2.1 and 1.8 renamed decommitting purging; -1: never
#else
  mi_option_disable(mi_option_allow_decommit);
#endif
#endif
}

}  // namespace ferry
