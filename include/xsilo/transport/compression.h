// A transport decorator that compresses tensors on the way out and
// decodes them on the way in (xsilo/core/compress.h, docs/compression.md),
// chosen per message. The registry installs it around any backend whose
// options carry `compression=...`; a hybrid backend under it stores the
// compressed object, so it is uploaded once and every receiver pulls fewer
// bytes.
//
// Backend options (removed before the inner backend sees its options):
//   compression=none|auto|lossless|bf16|fp16|int8|topk|CAST+topk
//       the codecs the job allows: auto and lossless allow only lossless
//       zstd; bf16, fp16 and int8 allow that cast (with or without zstd
//       after it) as well as lossless. topk allows top-k sparsification of
//       updates' deltas (with error feedback, kept values exact), and
//       CAST+topk that with the cast on the kept values. none: no
//       decorator at all.
//   compression.when=auto|always   auto (default): per message, only where
//       the prediction says it pays; always: the strongest allowed codec on
//       every eligible message.
//   compression.level=1            zstd level (1..19)
//   compression.threads=0          encode/decode threads (0: hardware, <= 4)
//   compression.int8_block=256     values per int8 block (64..4096, 2^k)
//   compression.min_tensor_bytes=65536   smaller tensors travel as they are
//   compression.min_message_bytes=1048576  auto never compresses below this
//   compression.link_MBps=0        the link's throughput to assume before a
//       send to the peer was measured (0: send uncompressed and measure)
//   compression.long_link_MBps=600 without that, what an unmeasured link
//       whose round trip is 20 ms or more (one the auto backend never
//       probes) is assumed to give at most: auto then takes the codec with
//       the least slowdown at worst over every speed up to it
//       (ChooseCompressionUnderCeiling). 600 is above the fastest link the
//       paper measured between regions (573 MB/s, many streams). 0: such
//       a link is unknown, sent as it is until measured.
//   compression.topk_fraction=0.01 the fraction of an update's changes
//       top-k keeps (0 < f <= 1)
//
// Threading: a send is chosen and encoded on the calling thread (SendAsync
// returns after encoding; the inner send is asynchronous as before). The
// choice first has the inner transport learn its links' round trips
// (LearnLink): under auto+<connector> the first message of 1 MiB or more
// to new peers waits there for their echoes, at most 5 s, as the inner
// send would have on its worker. A message is
// decoded on the inner transport's delivering thread, before it reaches the
// inbox. A message that cannot be decoded (corrupt, or a delta whose
// reference this party does not hold) is dropped and logged at warn,
// never delivered half decoded.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "xsilo/core/compress.h"
#include "xsilo/core/option_table.h"
#include "xsilo/transport/transport.h"

namespace xsilo {

struct CompressionPolicy {
  // The lossy cast the job allows (kNone: lossless only).
  Quant allowed = Quant::kNone;
  bool always = false;
  CompressOptions codec;
  uint64_t min_message_bytes = 1 << 20;
  double link_Bps_prior = 0;
  // The ceiling of an unmeasured long link (compression.long_link_MBps).
  double long_link_Bps = 600e6;
  // Top-k's fraction kept (0: top-k not allowed). Updates only.
  double topk = 0;
  // A codec must beat sending as it is by this fraction of the time.
  double margin = 0.05;
  // Hand a compressed message to a transport that takes one still being
  // encoded (StreamSink::StreamsSends) as it is encoded
  // (compression.stream, 1 by default).
  bool stream = true;
};

// The compression and compression.* keys, any backend's (the decorator
// wraps the whole backend).
const OptionTable& CompressionOptionTable();

// Whether options.backend asks for compression; if so *policy is filled
// and *rest gets the other options. InvalidArgument for a bad value.
Result<bool> ParseCompressionOptions(const TransportOptions& options, CompressionPolicy* policy,
                                     TransportOptions* rest);

std::unique_ptr<Transport> MakeCompressingTransport(std::unique_ptr<Transport> inner,
                                                    CompressionPolicy policy);

// What a compressing transport did so far (the bench JSON reads it).
struct CompressionSummary {
  uint64_t messages_sent = 0;
  uint64_t messages_compressed = 0;
  // Compressed messages handed to the inner transport while they were
  // encoded (StreamSink::SendStreamAsync: the hybrid's grant uploads); the
  // transport still sends one whole when a tensor went another way than
  // the encoder planned (EncodeStream::Abandon).
  uint64_t messages_streamed = 0;
  uint64_t raw_bytes = 0;      // tensor bytes of the tensors it encoded
  uint64_t encoded_bytes = 0;  // what they became
  double encode_seconds = 0;
  double decode_seconds = 0;
  // Models with a delta reference key (kDeltaRefParam): received ones kept
  // as references, and those not kept, sent or received, because no delta
  // could pay on the link (a sender then sends the model without its key).
  uint64_t references_kept = 0;
  uint64_t references_skipped = 0;
  std::string last_choice;  // the last message's reason line
};
// The summary of `t` when it is a compressing transport; nullopt otherwise.
std::optional<CompressionSummary> CompressionSummaryOf(const Transport& t);

}  // namespace xsilo
