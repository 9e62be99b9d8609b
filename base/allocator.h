// Which allocator the process runs on, for the banner and for the test that checks it.
#pragma once

#include <string>

namespace ferry {

// "mimalloc 2.0.9" when ferry was linked with mimalloc, else "system malloc (sanitizer build)".
std::string allocator_name();
// True when memory from plain malloc() comes from mimalloc's heap.
bool malloc_is_mimalloc();

}  // namespace ferry
