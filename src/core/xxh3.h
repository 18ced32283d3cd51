// XXH3 as xsilo calls it: through libxxhash's x86 dispatch where the library
// has it, so the hashes use AVX2 or AVX-512 when the CPU does. Debian builds
// libxxhash for the x86-64 baseline (SSE2); its plain XXH3_64bits ran at
// 19.5 GB/s over a cached 1 MiB block on this machine and the dispatching
// one at 44.4-45.0 GB/s. The dispatch header turns every XXH3_* call below
// it into the *_dispatch one; the hashes are the same values.
#pragma once

#include <xxhash.h>

#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif
