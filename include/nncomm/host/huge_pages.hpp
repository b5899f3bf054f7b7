// Page backing of large host buffers.
//
// A large reduction on 4 KiB pages spends much of its time on TLB misses:
// on this kind of machine a 16 MiB in-place all-reduce over MPICH's shared
// memory runs at ~5.8 GB/s on 4 KiB pages and ~9.7 GB/s on 2 MiB pages.
// numpy already asks for huge pages for its own large arrays; nnabla's
// allocator does not, so nncomm asks for the arrays it communicates.
#pragma once

#include <cstddef>

namespace nncomm {

// Asks the kernel to back the 2 MiB-aligned interior of [p, p + bytes) with
// transparent huge pages, collapsing pages already present. Advisory: the
// contents never change, failures are ignored, and a range already advised
// is not advised again.
void prefer_huge_pages(void *p, size_t bytes);

} // namespace nncomm
