// The benchmarks' model message: one float32 tensor "w" with a given
// parameter count, and its XXH3-64 in param "xxh3" so that a receiver
// verifies what it holds.
#pragma once

#include <cstdint>

#include "xsilo/core/message.h"
#include "xsilo/core/status.h"

namespace xsilo::bench {

// A model of `params` float32 values; `seed` varies the content.
Result<Message> MakeModel(uint64_t params, uint64_t seed);

// Makes the content unique (so hybrid backends cannot reuse an object of an
// earlier send) by writing `stamp` into the first parameter, and records it
// in param "stamp". Only call once every earlier send of the model completed.
void StampModel(Message* m, int64_t stamp);

// True when `m` holds tensor "w" and its checksum matches.
bool ModelIntact(const Message& m);

}  // namespace xsilo::bench
