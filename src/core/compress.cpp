#include "xsilo/core/compress.h"

#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "core/compress_kernels.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/cpus.h"
#include "xsilo/core/encode_stream.h"

namespace xsilo {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Version 2 adds lossy deltas on the values' scale ("vs"); a table without
// them is written as version 1, which every decoder reads.
constexpr int kTableVersion = 1;
constexpr int kValueScaleTableVersion = 2;

// How one tensor is laid out in chunks; the same on both sides.
struct Layout {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t elems = 0;
  uint64_t elem = 1;  // bytes per input element
  Quant quant = Quant::kNone;
  bool delta = false;
  bool value_scale = false;  // lossy delta on the values' scale (TensorRecipe)
  uint64_t block = 256;      // int8 values per scale
  uint64_t chunk_elems = 1;  // elements per chunk (the last may be fewer)

  uint64_t chunks() const { return elems == 0 ? 0 : (elems + chunk_elems - 1) / chunk_elems; }
  uint64_t ChunkElems(uint64_t i) const { return std::min(chunk_elems, elems - i * chunk_elems); }
  // Bytes of a chunk of n elements after quantization.
  uint64_t StageBytes(uint64_t n) const {
    switch (quant) {
      case Quant::kNone:
        return n * elem;
      case Quant::kBF16:
      case Quant::kFP16:
        return 2 * n;
      case Quant::kInt8:
        return 4 * ((n + block - 1) / block) + n;
    }
    return 0;
  }
  uint64_t ShuffleElem() const {
    return quant == Quant::kNone ? elem : quant == Quant::kInt8 ? 1 : 2;
  }
};

// Top-k of one tensor (TensorRecipe::topk): the kept magnitude and the
// error feedback in and out (null: none).
struct TopK {
  float threshold = 0;
  const float* err_in = nullptr;
  float* err_out = nullptr;
};

struct ChunkRec {
  uint64_t len = 0;
  bool z = false;
  uint64_t sum = 0;
};

int Workers(int threads, uint64_t tasks) {
  int hw = threads > 0 ? threads : DefaultPoolThreads();
  return static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(hw), tasks));
}

// Runs fn(i, worker) for i in [0, n) on up to `threads` threads; returns the
// first failure.
template <typename Fn>
Status ParallelFor(uint64_t n, int threads, Fn fn) {
  const int workers = Workers(threads, n);
  std::atomic<uint64_t> next{0};
  std::mutex mu;
  Status first;
  auto run = [&](int w) {
    for (;;) {
      const uint64_t i = next.fetch_add(1);
      if (i >= n) return;
      Status s = fn(i, w);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = std::move(s);
        next.store(n);
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(run, w);
  if (workers > 0) run(0);
  for (auto& t : pool) t.join();
  return first;
}

// Per-worker zstd contexts and scratch of one chunk's stage bytes.
struct Worker {
  ZSTD_CCtx* cctx = nullptr;
  ZSTD_DCtx* dctx = nullptr;
  std::vector<uint8_t> a, b;
  std::vector<float> target, decoded;  // top-k
  ~Worker() {
    ZSTD_freeCCtx(cctx);
    ZSTD_freeDCtx(dctx);
  }
};

bool EligibleLossy(const Tensor& t) { return t.dtype == DType::kF32; }

bool SameLayout(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.nbytes() == b.nbytes();
}

// Runs fn(first, len) over n values in pieces of 2^20 on up to `threads`
// threads: the whole-tensor passes outside the chunked encode (a Big
// update's 265 MB, its reference beside it) would otherwise take one core.
constexpr uint64_t kPiece = 1 << 20;  // values
template <typename Fn>
void ForPieces(uint64_t n, int threads, Fn fn) {
  (void)ParallelFor((n + kPiece - 1) / kPiece, threads, [&](uint64_t i, int) {
    fn(i, i * kPiece, std::min(kPiece, n - i * kPiece));
    return Status::OK();
  });
}

// Whether n values x (minus ref plus err, when ref is given; err may be
// null) are all finite, and their largest magnitude in *amax.
bool FiniteScan(const float* x, const float* ref, const float* err, uint64_t n, int threads,
                float* amax) {
  const uint64_t pieces = (n + kPiece - 1) / kPiece;
  std::vector<float> m(pieces, 0);
  std::vector<uint8_t> ok(pieces, 0);
  ForPieces(n, threads, [&](uint64_t i, uint64_t first, uint64_t len) {
    ok[i] = ref ? compress::FiniteDeltaAbsMax(x + first, ref + first, err ? err + first : nullptr,
                                              len, &m[i])
                : compress::FiniteAbsMax(x + first, len, &m[i]);
  });
  *amax = 0;
  for (uint64_t i = 0; i < pieces; ++i) {
    if (!ok[i]) return false;
    *amax = std::max(*amax, m[i]);
  }
  return true;
}

// The quantization a tensor can take: lossy needs finite values (and the
// half range for fp16, else bf16: of the difference for a delta, of the
// values too for one on the values' scale, which casts them).
Quant QuantFor(const Tensor& t, const Tensor* ref, Quant want, int threads,
               const float* err = nullptr, bool value_scale = false) {
  if (want == Quant::kNone || !EligibleLossy(t)) return Quant::kNone;
  const float* x = reinterpret_cast<const float*>(t.data.data());
  float amax = 0;
  if (!FiniteScan(x, ref ? reinterpret_cast<const float*>(ref->data.data()) : nullptr, err,
                  t.nbytes() / 4, threads, &amax))
    return Quant::kNone;
  if (want == Quant::kFP16 && amax > compress::kHalfMax) return Quant::kBF16;
  if (want == Quant::kFP16 && ref && value_scale &&
      (!FiniteScan(x, nullptr, nullptr, t.nbytes() / 4, threads, &amax) ||
       amax > compress::kHalfMax))
    return Quant::kBF16;
  return want;
}

// Whether every value of an F32 tensor is finite. Top-k needs its inputs
// so: a dropped NaN would stay in the residual for good.
bool AllFinite(const Tensor& t, int threads) {
  float amax = 0;
  return t.dtype == DType::kF32 && FiniteScan(reinterpret_cast<const float*>(t.data.data()),
                                              nullptr, nullptr, t.nbytes() / 4, threads, &amax);
}

Layout MakeLayout(const Tensor& t, Quant quant, bool delta, bool value_scale,
                  const CompressOptions& o) {
  Layout l;
  l.dtype = t.dtype;
  l.shape = t.shape;
  l.elem = DTypeSize(t.dtype);
  l.elems = t.nbytes() / l.elem;
  l.quant = quant;
  l.delta = delta;
  l.value_scale = value_scale && delta && quant != Quant::kNone;
  l.block = std::clamp<uint64_t>(o.int8_block, 64, 4096);
  uint64_t ce = std::max<uint64_t>(1, std::max<uint64_t>(o.chunk_bytes, 64 << 10) / l.elem);
  if (quant == Quant::kInt8) ce = std::max(l.block, ce / l.block * l.block);
  l.chunk_elems = ce;
  return l;
}

// Stage 1 + 2 of chunk i into w.a (or a pointer into the input when there
// is nothing to do); returns the stage bytes and their checksum's subject.
// A lossy stage also says in *finite whether its differences were all
// finite (if not, its bytes are unusable: the tensor must go lossless).
const uint8_t* EncodeStageOf(const Layout& l, const uint8_t* in, const uint8_t* ref, uint64_t n,
                             Worker& w, uint64_t* sum, bool* finite = nullptr) {
  const uint64_t sb = l.StageBytes(n);
  const float* fin = reinterpret_cast<const float*>(in);
  const float* fref = reinterpret_cast<const float*>(ref);
  if (l.quant == Quant::kNone) {
    *sum = Checksum(std::span<const uint8_t>(in, n * l.elem));
    if (!l.delta) return in;
    w.a.resize(sb);
    compress::XorBytes(in, ref, w.a.data(), sb);
    return w.a.data();
  }
  w.a.resize(sb);
  if (l.quant == Quant::kInt8) {
    const uint64_t blocks = (n + l.block - 1) / l.block;
    const bool all_finite = compress::EncodeInt8(
        fin, l.delta ? fref : nullptr, reinterpret_cast<float*>(w.a.data()),
        reinterpret_cast<int8_t*>(w.a.data() + 4 * blocks), n, l.block, l.value_scale);
    if (finite) *finite = all_finite;
  } else if (l.value_scale) {
    const bool all_finite = compress::EncodeHalfOnValues(
        fin, fref, reinterpret_cast<uint16_t*>(w.a.data()), n, l.quant == Quant::kBF16);
    if (finite) *finite = all_finite;
  } else {
    const bool all_finite =
        compress::EncodeHalf(fin, l.delta ? fref : nullptr, reinterpret_cast<uint16_t*>(w.a.data()),
                             n, l.quant == Quant::kBF16);
    if (finite) *finite = all_finite;
  }
  *sum = Checksum(std::span<const uint8_t>(w.a.data(), sb));
  return w.a.data();
}

// The lossy stage's inverse: n values of quantized stage bytes (plus the
// reference, for a delta) into out.
void DequantizeStage(const Layout& l, const uint8_t* stage, const float* ref, float* out,
                     uint64_t n) {
  if (l.quant == Quant::kInt8) {
    const uint64_t blocks = (n + l.block - 1) / l.block;
    compress::DecodeInt8(reinterpret_cast<const float*>(stage),
                         reinterpret_cast<const int8_t*>(stage + 4 * blocks), ref, out, n, l.block,
                         l.value_scale);
  } else if (l.value_scale) {
    compress::DecodeHalfOnValues(reinterpret_cast<const uint16_t*>(stage), ref, out, n,
                                 l.quant == Quant::kBF16);
  } else {
    compress::DecodeHalf(reinterpret_cast<const uint16_t*>(stage), ref, out, n,
                         l.quant == Quant::kBF16);
  }
}

// With top-k, the stage encodes the sparsified target (the chunk's first
// value is element `first` of the tensor) and the residual is written.
const uint8_t* EncodeStage(const Layout& l, const uint8_t* in, const uint8_t* ref, uint64_t n,
                           Worker& w, uint64_t* sum, const TopK* topk = nullptr, uint64_t first = 0,
                           bool* finite = nullptr) {
  if (!topk) return EncodeStageOf(l, in, ref, n, w, sum, finite);
  const float* x = reinterpret_cast<const float*>(in);
  const float* fref = reinterpret_cast<const float*>(ref);
  const float* err = topk->err_in ? topk->err_in + first : nullptr;
  w.target.resize(n);
  compress::SparsifyTarget(x, fref, err, topk->threshold, w.target.data(), n);
  const uint8_t* stage =
      EncodeStageOf(l, reinterpret_cast<const uint8_t*>(w.target.data()), ref, n, w, sum);
  if (topk->err_out) {
    // What the receiver will decode: the target itself when lossless.
    const float* decoded = w.target.data();
    if (l.quant != Quant::kNone) {
      w.decoded.resize(n);
      DequantizeStage(l, stage, fref, w.decoded.data(), n);
      decoded = w.decoded.data();
    }
    compress::ResidualOf(x, err, decoded, topk->err_out + first, n);
  }
  return stage;
}

// Encodes one tensor; false in *encoded when it did not get smaller. A
// lossy layout checks the values as it goes (top-k's inputs were checked
// before): `nonfinite` (required unless they were scanned first) is set,
// and nothing is encoded, when a difference was not finite.
//
// With a stream, the chunks are packed in order, as each finishes, into a
// Buffer of the tensor's own size (more than that is not smaller: the
// packing stops), and every packed chunk is appended to the stream at once.
Status EncodeTensor(const Tensor& t, const Tensor* ref, const Layout& l, bool zstd,
                    const CompressOptions& o, Tensor* encoded, std::vector<ChunkRec>* recs,
                    bool* smaller, const TopK* topk = nullptr, bool* nonfinite = nullptr,
                    EncodeStream* stream = nullptr) {
  const uint64_t chunks = l.chunks();
  const uint64_t slot = ZSTD_compressBound(l.StageBytes(l.chunk_elems));
  XSILO_ASSIGN_OR_RETURN(Buffer out, Buffer::Allocate(std::max<uint64_t>(1, chunks * slot)));
  recs->assign(chunks, {});
  uint8_t* dst = out.mutable_data();
  // Stream mode: chunks [0, packed_chunks) are in `packed`.
  Buffer packed;
  if (stream) {
    XSILO_ASSIGN_OR_RETURN(packed, Buffer::Allocate(std::max<uint64_t>(1, t.nbytes())));
  }
  std::mutex pack_mu;
  std::vector<uint8_t> finished(stream ? chunks : 0, 0);
  uint64_t packed_chunks = 0, packed_bytes = 0;
  bool overflow = false;
  auto pack = [&](uint64_t i) {  // chunk i is done: pack what now follows in order
    std::lock_guard<std::mutex> lock(pack_mu);
    finished[i] = 1;
    while (!overflow && packed_chunks < chunks && finished[packed_chunks]) {
      const ChunkRec& r = (*recs)[packed_chunks];
      if (packed_bytes + r.len >= t.nbytes()) {
        overflow = true;  // not smaller
        return;
      }
      std::memcpy(packed.mutable_data() + packed_bytes, dst + packed_chunks * slot, r.len);
      stream->Append(packed.SliceUnchecked(packed_bytes, r.len),
                     l.ChunkElems(packed_chunks) * l.elem);
      packed_bytes += r.len;
      ++packed_chunks;
    }
  };
  const int workers = Workers(o.threads, chunks);
  std::vector<Worker> ws(static_cast<size_t>(std::max(1, workers)));
  const uint8_t* base = t.data.data();
  const uint8_t* rbase = ref ? ref->data.data() : nullptr;
  std::atomic<bool> bad_values{false};
  auto encode_chunk = [&](uint64_t i, int wi) -> Status {
    Worker& w = ws[static_cast<size_t>(wi)];
    const uint64_t n = l.ChunkElems(i);
    const uint64_t off = i * l.chunk_elems * l.elem;
    ChunkRec& rec = (*recs)[i];
    bool finite = true;
    const uint8_t* stage = EncodeStage(l, base + off, rbase ? rbase + off : nullptr, n, w, &rec.sum,
                                       topk, i * l.chunk_elems, &finite);
    if (!finite) {
      bad_values = true;
      return Cancelled("a difference is not finite");  // stops the other chunks
    }
    const uint64_t sb = l.StageBytes(n);
    uint8_t* slot_dst = dst + i * slot;
    if (zstd) {
      const uint8_t* src = stage;
      if (l.ShuffleElem() > 1) {
        w.b.resize(sb);
        compress::Shuffle(stage, w.b.data(), sb / l.ShuffleElem(), l.ShuffleElem());
        src = w.b.data();
      }
      if (!w.cctx) w.cctx = ZSTD_createCCtx();
      if (!w.cctx) return ResourceExhausted("zstd: no compression context");
      const size_t z = ZSTD_compressCCtx(w.cctx, slot_dst, slot, src, sb, o.zstd_level);
      if (ZSTD_isError(z)) return Internal(std::string("zstd: ") + ZSTD_getErrorName(z));
      if (z < sb) {
        rec.len = z;
        rec.z = true;
        return Status::OK();
      }
    }
    std::memcpy(slot_dst, stage, sb);
    rec.len = sb;
    rec.z = false;
    return Status::OK();
  };
  Status encoded_all = ParallelFor(chunks, workers, [&](uint64_t i, int wi) -> Status {
    XSILO_RETURN_IF_ERROR(encode_chunk(i, wi));
    if (stream) pack(i);
    return Status::OK();
  });
  if (bad_values) {
    if (!nonfinite) return Internal("non-finite values reached a lossy encode");
    *nonfinite = true;
    *smaller = false;
    return Status::OK();
  }
  XSILO_RETURN_IF_ERROR(encoded_all);
  if (stream) {
    *smaller = !overflow && packed_chunks == chunks;
    if (!*smaller) return Status::OK();
    XSILO_ASSIGN_OR_RETURN(*encoded, Tensor::Make(DType::kU8, {static_cast<int64_t>(packed_bytes)},
                                                  packed.SliceUnchecked(0, packed_bytes)));
    return Status::OK();
  }
  uint64_t total = 0;
  for (uint64_t i = 0; i < chunks; ++i) {
    if (total != i * slot) std::memmove(dst + total, dst + i * slot, (*recs)[i].len);
    total += (*recs)[i].len;
  }
  *smaller = total < t.nbytes();
  if (!*smaller) return Status::OK();
  XSILO_ASSIGN_OR_RETURN(Buffer data, out.Slice(0, total));
  XSILO_ASSIGN_OR_RETURN(*encoded, Tensor::Make(DType::kU8, {static_cast<int64_t>(total)}, data));
  return Status::OK();
}

// Whether CompressMessage sets out to encode `t` (it may yet find it not
// worth it).
bool WillEncode(const Tensor& t, const TensorRecipe& r, const CompressOptions& o) {
  if (t.nbytes() < o.min_tensor_bytes || t.nbytes() == 0) return false;
  return r.zstd || ((r.quant != Quant::kNone || r.topk > 0) && EligibleLossy(t));
}

// The message's tensors in the payload order (PayloadOrder) they will have
// once those WillEncode picks are U8.
std::vector<std::pair<const std::string, Tensor>*> StreamOrder(Message* m, const TensorRecipe& r,
                                                               const CompressOptions& o) {
  std::vector<std::pair<const std::string, Tensor>*> order;
  for (auto& entry : m->tensors) order.push_back(&entry);
  auto size = [&](const std::pair<const std::string, Tensor>* e) {
    return WillEncode(e->second, r, o) ? DTypeSize(DType::kU8) : DTypeSize(e->second.dtype);
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](const auto* a, const auto* b) { return size(a) > size(b); });
  return order;
}

Json LayoutJson(const Layout& l, bool zstd, const std::vector<ChunkRec>& recs, double topk) {
  Json c = Json::array();
  for (const auto& r : recs) c.push_back(Json::array({r.len, r.z ? 1 : 0, r.sum}));
  Json j = {{"dtype", DTypeName(l.dtype)},
            {"shape", l.shape},
            {"q", QuantName(l.quant)},
            {"z", zstd},
            {"d", l.delta},
            {"ce", l.chunk_elems},
            {"chunks", std::move(c)}};
  if (l.quant == Quant::kInt8) j["block"] = l.block;
  if (l.value_scale) j["vs"] = true;
  if (topk > 0) j["topk"] = topk;  // for the reader: decoding does not need it
  return j;
}

Result<Quant> ParseQuant(std::string_view s) {
  for (Quant q : {Quant::kNone, Quant::kBF16, Quant::kFP16, Quant::kInt8})
    if (QuantName(q) == s) return q;
  return Corrupt("codec table: unknown quantization '" + std::string(s) + "'");
}

// Parses and checks one tensor's entry against the encoded bytes it names.
Status ParseLayout(const Json& j, int64_t version, uint64_t data_bytes, const CompressOptions& o,
                   Layout* l, std::vector<ChunkRec>* recs) {
  if (!j.is_object() || !j.contains("dtype") || !j["dtype"].is_string() || !j.contains("shape") ||
      !j["shape"].is_array() || !j.contains("q") || !j["q"].is_string() || !j.contains("d") ||
      !j["d"].is_boolean() || !j.contains("ce") || !j["ce"].is_number_unsigned() ||
      !j.contains("chunks") || !j["chunks"].is_array())
    return Corrupt("codec table: malformed tensor entry");
  auto dtype = ParseDType(j["dtype"].get<std::string>());
  if (!dtype.ok()) return Corrupt("codec table: " + dtype.status().message());
  l->dtype = *dtype;
  l->elem = DTypeSize(*dtype);
  for (const auto& d : j["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) return Corrupt("codec table: bad shape");
    l->shape.push_back(d.get<int64_t>());
  }
  auto count = ElementCount(l->shape);
  if (!count || *count > o.max_decoded_bytes / l->elem)
    return Corrupt("codec table: tensor larger than the decode limit");
  l->elems = *count;
  XSILO_ASSIGN_OR_RETURN(l->quant, ParseQuant(j["q"].get<std::string>()));
  if (l->quant != Quant::kNone && l->dtype != DType::kF32)
    return Corrupt("codec table: lossy quantization of a non-F32 tensor");
  l->delta = j["d"].get<bool>();
  if (l->quant == Quant::kInt8) {
    if (!j.contains("block") || !j["block"].is_number_unsigned())
      return Corrupt("codec table: int8 without a block size");
    l->block = j["block"].get<uint64_t>();
    if (l->block < 64 || l->block > 4096 || (l->block & (l->block - 1)))
      return Corrupt("codec table: bad int8 block size");
  }
  if (j.contains("vs")) {
    if (version < kValueScaleTableVersion || !j["vs"].is_boolean() || l->quant == Quant::kNone ||
        !l->delta)
      return Corrupt("codec table: a values' scale without a lossy delta of a version 2 table");
    l->value_scale = j["vs"].get<bool>();
  }
  l->chunk_elems = j["ce"].get<uint64_t>();
  if (l->chunk_elems == 0 || l->chunk_elems > (64ull << 20) / l->elem ||
      (l->quant == Quant::kInt8 && l->chunk_elems % l->block))
    return Corrupt("codec table: bad chunk size");
  const auto& c = j["chunks"];
  if (c.size() != l->chunks()) return Corrupt("codec table: wrong chunk count");
  const uint64_t slot = ZSTD_compressBound(l->StageBytes(l->chunk_elems));
  uint64_t total = 0;
  recs->resize(c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    const auto& e = c[i];
    if (!e.is_array() || e.size() != 3 || !e[0].is_number_unsigned() ||
        !e[1].is_number_unsigned() || !e[2].is_number_unsigned())
      return Corrupt("codec table: malformed chunk");
    ChunkRec& r = (*recs)[i];
    r.len = e[0].get<uint64_t>();
    r.z = e[1].get<uint64_t>() != 0;
    r.sum = e[2].get<uint64_t>();
    const uint64_t sb = l->StageBytes(l->ChunkElems(i));
    if (r.len > slot || (!r.z && r.len != sb)) return Corrupt("codec table: bad chunk length");
    total += r.len;
  }
  if (total != data_bytes) return Corrupt("codec table: chunk lengths do not add up");
  return Status::OK();
}

Status DecodeChunk(const Layout& l, const uint8_t* src, const ChunkRec& r, uint64_t n,
                   const uint8_t* ref, uint8_t* out, Worker& w) {
  const uint64_t sb = l.StageBytes(n);
  const bool direct = l.quant == Quant::kNone && !l.delta;  // stage bytes are the output
  const uint8_t* stage = src;
  if (r.z) {
    if (!w.dctx) w.dctx = ZSTD_createDCtx();
    if (!w.dctx) return ResourceExhausted("zstd: no decompression context");
    w.b.resize(sb);
    const size_t got = ZSTD_decompressDCtx(w.dctx, w.b.data(), sb, src, r.len);
    if (ZSTD_isError(got) || got != sb) return Corrupt("compressed chunk does not decode");
    uint8_t* dst = direct ? out : (w.a.resize(sb), w.a.data());
    compress::Unshuffle(w.b.data(), dst, sb / l.ShuffleElem(), l.ShuffleElem());
    stage = dst;
  } else if (direct) {
    std::memcpy(out, src, sb);
    stage = out;
  }
  const float* fref = l.delta ? reinterpret_cast<const float*>(ref) : nullptr;
  if (l.quant == Quant::kNone) {
    if (l.delta) compress::XorBytes(stage, ref, out, sb);
    if (Checksum(std::span<const uint8_t>(out, sb)) != r.sum)
      return Corrupt("compressed chunk checksum mismatch");
    return Status::OK();
  }
  if (Checksum(std::span<const uint8_t>(stage, sb)) != r.sum)
    return Corrupt("compressed chunk checksum mismatch");
  DequantizeStage(l, stage, fref, reinterpret_cast<float*>(out), n);
  return Status::OK();
}

Status DecodeTensor(const Tensor& enc, const Layout& l, const std::vector<ChunkRec>& recs,
                    const Tensor* ref, const CompressOptions& o, Tensor* out) {
  XSILO_ASSIGN_OR_RETURN(Buffer dst, Buffer::Allocate(l.elems * l.elem));
  std::vector<uint64_t> offsets(recs.size());
  for (size_t i = 0, off = 0; i < recs.size(); off += recs[i].len, ++i) offsets[i] = off;
  const int workers = Workers(o.threads, recs.size());
  std::vector<Worker> ws(static_cast<size_t>(std::max(1, workers)));
  XSILO_RETURN_IF_ERROR(ParallelFor(recs.size(), workers, [&](uint64_t i, int wi) {
    const uint64_t off = i * l.chunk_elems * l.elem;
    return DecodeChunk(l, enc.data.data() + offsets[i], recs[i], l.ChunkElems(i),
                       ref ? ref->data.data() + off : nullptr, dst.mutable_data() + off,
                       ws[static_cast<size_t>(wi)]);
  }));
  XSILO_ASSIGN_OR_RETURN(*out, Tensor::Make(l.dtype, l.shape, std::move(dst)));
  return Status::OK();
}

}  // namespace

std::string_view QuantName(Quant q) {
  switch (q) {
    case Quant::kNone:
      return "none";
    case Quant::kBF16:
      return "bf16";
    case Quant::kFP16:
      return "fp16";
    case Quant::kInt8:
      return "int8";
  }
  return "none";
}

void AddDifference(const float* update, const float* ours, const float* cast, float* out,
                   uint64_t n, int threads) {
  ForPieces(n, threads, [&](uint64_t, uint64_t first, uint64_t len) {
    compress::AddDifference(update + first, ours + first, cast + first, out + first, len);
  });
}

uint64_t ReferenceDigest(const TensorMap& reference) {
  std::string s;
  for (const auto& [name, t] : reference) {
    s += name;
    s.push_back('\0');
    s += DTypeName(t.dtype);
    const uint64_t sum = PayloadChecksum(t.data.span());
    s.append(reinterpret_cast<const char*>(&sum), 8);
  }
  return Checksum(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

double QuantErrorBound(Quant q, float x, float block_absmax) {
  const double a = std::fabs(static_cast<double>(x));
  switch (q) {
    case Quant::kNone:
      return 0;
    case Quant::kBF16:
      return std::max(a * 0x1p-8, 0x1p-134);
    case Quant::kFP16:
      return a >= 0x1p-14 ? a * 0x1p-11 : 0x1p-25;
    // Half a step of absmax / 127, the float rounding of the scale and of
    // q * scale, and the least normal float for blocks of subnormal
    // magnitude (whose scale loses precision or underflows).
    case Quant::kInt8:
      return static_cast<double>(block_absmax) / 254.0 * (1 + 0x1p-12) + 0x1p-126;
  }
  return 0;
}

uint64_t CompressibleBytes(const TensorMap& tensors, const TensorRecipe& recipe,
                           const CompressOptions& options) {
  uint64_t n = 0;
  for (const auto& [name, t] : tensors) {
    if (t.nbytes() < options.min_tensor_bytes) continue;
    if (recipe.quant == Quant::kNone && !recipe.zstd) continue;
    if (!recipe.zstd && !EligibleLossy(t)) continue;
    n += t.nbytes();
  }
  return n;
}

Status CompressMessage(Message* m, const TensorRecipe& recipe, const CompressOptions& options,
                       const TensorMap* reference, int64_t reference_key, CompressStats* stats,
                       TensorMap* residual, EncodeStream* stream) {
  if (m->params.count(kCodecParam)) return InvalidArgument("message is compressed already");
  const auto start = Clock::now();
  Json tensors = Json::object();
  bool any_delta = false, any_value_scale = false;
  CompressStats st;
  // Encodes one tensor in place; whether it was.
  auto encode_one = [&](const std::string& name, Tensor& t) -> Result<bool> {
    if (t.nbytes() < options.min_tensor_bytes || t.nbytes() == 0) return false;
    const Tensor* ref = nullptr;
    if (recipe.delta && reference) {
      auto it = reference->find(name);
      if (it != reference->end() && SameLayout(it->second, t)) ref = &it->second;
    }
    // Top-k: a delta of finite F32 values against a finite reference, with
    // the residual of the last update (if any) added.
    std::optional<TopK> topk;
    Buffer err_out;
    // (ref has t's layout: checked where it was found.)
    if (recipe.topk > 0 && ref && AllFinite(t, options.threads) &&
        AllFinite(*ref, options.threads)) {
      topk.emplace();
      if (residual) {
        auto e = residual->find(name);
        if (e != residual->end() && SameLayout(e->second, t) &&
            AllFinite(e->second, options.threads))
          topk->err_in = reinterpret_cast<const float*>(e->second.data.data());
        XSILO_ASSIGN_OR_RETURN(err_out, Buffer::Allocate(t.nbytes()));
        topk->err_out = reinterpret_cast<float*>(err_out.mutable_data());
      }
      topk->threshold = compress::TopKThreshold(reinterpret_cast<const float*>(t.data.data()),
                                                reinterpret_cast<const float*>(ref->data.data()),
                                                topk->err_in, t.nbytes() / 4, recipe.topk);
    }
    // int8 and bf16 (without top-k) check that the values are finite as
    // they encode them, and the tensor goes lossless after if they are
    // not; fp16 needs a scan first for its range.
    const bool checked_in_encode =
        (recipe.quant == Quant::kInt8 || recipe.quant == Quant::kBF16) && !topk && EligibleLossy(t);
    Quant q = checked_in_encode
                  ? recipe.quant
                  : QuantFor(t, ref, recipe.quant, options.threads, topk ? topk->err_in : nullptr,
                             recipe.value_scale && !topk);
    if (q == Quant::kNone && !recipe.zstd && !topk) return false;  // nothing to do for it
    Layout l = MakeLayout(t, q, ref != nullptr, recipe.value_scale && !topk, options);
    Tensor enc;
    std::vector<ChunkRec> recs;
    bool smaller = false, nonfinite = false;
    XSILO_RETURN_IF_ERROR(EncodeTensor(t, ref, l, recipe.zstd, options, &enc, &recs, &smaller,
                                       topk ? &*topk : nullptr, &nonfinite, stream)
                              .WithContext("compressing tensor '" + name + "'"));
    if (nonfinite) {  // as QuantFor would have said: lossless
      if (!recipe.zstd) return false;
      if (stream) stream->Abandon();  // the lossy chunks appended are void
      l = MakeLayout(t, Quant::kNone, ref != nullptr, false, options);
      XSILO_RETURN_IF_ERROR(EncodeTensor(t, ref, l, recipe.zstd, options, &enc, &recs, &smaller)
                                .WithContext("compressing tensor '" + name + "'"));
    }
    if (!smaller) return false;  // sent whole: its residual stays as it was
    if (topk && residual) {
      XSILO_ASSIGN_OR_RETURN((*residual)[name], Tensor::Make(t.dtype, t.shape, std::move(err_out)));
    }
    st.raw_bytes += t.nbytes();
    st.encoded_bytes += enc.nbytes();
    ++st.tensors;
    any_delta |= l.delta;
    any_value_scale |= l.value_scale;
    tensors[name] = LayoutJson(l, recipe.zstd, recs, topk ? recipe.topk : 0);
    t = std::move(enc);
    return true;
  };
  if (!stream) {
    for (auto& [name, t] : m->tensors) XSILO_RETURN_IF_ERROR(encode_one(name, t).status());
  } else {
    stream->SetInputBytes(m->payload_bytes());
    // In the payload order of the message as planned, each tensor's bytes
    // appended as they are final; a tensor that does not go as planned
    // abandons the stream (the order, or its bytes, differ).
    for (auto* entry : StreamOrder(m, recipe, options)) {
      Tensor& t = entry->second;
      if (!WillEncode(t, recipe, options)) {
        stream->Append(t.data, t.nbytes());
        continue;
      }
      XSILO_ASSIGN_OR_RETURN(bool encoded, encode_one(entry->first, t));
      if (!encoded) stream->Abandon();
    }
  }
  st.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (stats) *stats = st;
  if (tensors.empty()) return Status::OK();
  Json table = {{"v", any_value_scale ? kValueScaleTableVersion : kTableVersion},
                {"t", std::move(tensors)}};
  if (any_delta) {
    table["ref"] = reference_key;
    table["ref_sum"] = ReferenceDigest(*reference);
  }
  m->params[kCodecParam] = table.dump();
  return Status::OK();
}

Status DecompressMessage(Message* m, const ReferenceLookup& references,
                         const CompressOptions& options, std::vector<std::string>* decoded_names,
                         const ReferenceLookup& onto, std::vector<std::string>* moved) {
  if (decoded_names) decoded_names->clear();
  if (moved) moved->clear();
  auto it = m->params.find(kCodecParam);
  if (it == m->params.end()) return Status::OK();
  const auto* text = std::get_if<std::string>(&it->second);
  if (!text) return Corrupt("codec table is not a string");
  Json table = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!table.is_object() || !table.contains("v") || !table["v"].is_number_integer() ||
      !table.contains("t") || !table["t"].is_object())
    return Corrupt("codec table: not a table");
  const int64_t version = table["v"].get<int64_t>();
  if (version != kTableVersion && version != kValueScaleTableVersion)
    return Corrupt("codec table: unsupported version " + table["v"].dump());
  const TensorMap* ref = nullptr;
  auto need_ref = [&]() -> Status {
    if (ref) return Status::OK();
    if (!table.contains("ref") || !table["ref"].is_number_integer() || !table.contains("ref_sum") ||
        !table["ref_sum"].is_number_unsigned())
      return Corrupt("codec table: delta without a reference");
    const int64_t key = table["ref"].get<int64_t>();
    ref = references ? references(key) : nullptr;
    if (!ref)
      return FailedPrecondition("delta against reference " + std::to_string(key) +
                                ", which this party does not hold");
    if (ReferenceDigest(*ref) != table["ref_sum"].get<uint64_t>())
      return Corrupt("delta against reference " + std::to_string(key) +
                     ", which differs from the sender's");
    return Status::OK();
  };
  const TensorMap* onto_map = nullptr;
  bool onto_looked_up = false;
  std::vector<std::string> moved_names;
  // Decode into a new map so that a failure leaves the message as it was.
  TensorMap decoded;
  for (const auto& [name, entry] : table["t"].items()) {
    auto t = m->tensors.find(name);
    if (t == m->tensors.end() || t->second.dtype != DType::kU8 || t->second.shape.size() != 1)
      return Corrupt("codec table names tensor '" + name + "', which is not an encoded tensor");
    Layout l;
    std::vector<ChunkRec> recs;
    XSILO_RETURN_IF_ERROR(ParseLayout(entry, version, t->second.nbytes(), options, &l, &recs)
                              .WithContext("tensor '" + name + "'"));
    const Tensor* rt = nullptr;
    if (l.delta) {
      XSILO_RETURN_IF_ERROR(need_ref());
      auto r = ref->find(name);
      if (r == ref->end() || r->second.dtype != l.dtype || r->second.shape != l.shape)
        return Corrupt("delta tensor '" + name + "' has no matching reference tensor");
      rt = &r->second;
      if (onto && l.quant != Quant::kNone && !l.value_scale) {
        if (!onto_looked_up) {
          onto_map = onto(table["ref"].get<int64_t>());
          onto_looked_up = true;
        }
        if (onto_map) {
          auto o = onto_map->find(name);
          if (o != onto_map->end() && o->second.dtype == l.dtype && o->second.shape == l.shape &&
              o->second.nbytes() == r->second.nbytes()) {
            rt = &o->second;
            moved_names.push_back(name);
          }
        }
      }
    }
    Tensor out;
    XSILO_RETURN_IF_ERROR(DecodeTensor(t->second, l, recs, rt, options, &out)
                              .WithContext("decoding tensor '" + name + "'"));
    decoded.emplace(name, std::move(out));
  }
  for (auto& [name, t] : decoded) {
    m->tensors[name] = std::move(t);
    if (decoded_names) decoded_names->push_back(name);
  }
  if (moved) *moved = std::move(moved_names);
  m->params.erase(kCodecParam);
  return Status::OK();
}

namespace {

// The calling thread's CPU time, seconds; < 0 where it cannot be read.
double ThreadCpuSeconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return -1;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

CodecEstimate EstimateCodec(const TensorMap& tensors, const TensorRecipe& recipe,
                            const CompressOptions& options, const TensorMap* reference,
                            uint64_t sample_bytes) {
  CodecEstimate e;
  e.recipe = recipe;
  const uint64_t total = CompressibleBytes(tensors, recipe, options);
  if (total == 0) return e;
  // Pieces of one chunk each (zstd's ratio depends on the chunk size: the
  // planes of a shuffled chunk get blocks of their own only in large
  // chunks), at even positions of the eligible bytes, in whole 4 KiB units
  // so that an int8 block never straddles two.
  const uint64_t piece = std::max<uint64_t>(options.chunk_bytes, 64 << 10) / 4096 * 4096;
  const int kPieces = static_cast<int>(std::clamp<uint64_t>(sample_bytes / piece, 1, 8));
  Message sample, ref_sample;
  uint64_t pos = 0;
  int k = 0;
  for (const auto& [name, t] : tensors) {
    if (t.nbytes() < options.min_tensor_bytes) continue;
    if (!recipe.zstd && !EligibleLossy(t)) continue;
    for (; k < kPieces; ++k) {
      const uint64_t at = total / kPieces * static_cast<uint64_t>(k);
      if (at >= pos + t.nbytes()) break;
      const uint64_t elem = DTypeSize(t.dtype);
      uint64_t off = (at - pos) / elem * elem;
      uint64_t len = std::min(piece, t.nbytes() - off) / elem * elem;
      if (len == 0) continue;
      const std::string key = "s" + std::to_string(k);
      auto slice = [&](const Tensor& src) {
        Tensor s;
        s.dtype = src.dtype;
        s.shape = {static_cast<int64_t>(len / elem)};
        s.data = src.data.SliceUnchecked(off, len);
        return s;
      };
      sample.tensors.emplace(key, slice(t));
      if (reference) {
        auto r = reference->find(name);
        if (r != reference->end() && SameLayout(r->second, t))
          ref_sample.tensors.emplace(key, slice(r->second));
      }
    }
    pos += t.nbytes();
  }
  CompressOptions one = options;
  one.threads = 1;
  one.min_tensor_bytes = 1;
  const uint64_t raw = sample.payload_bytes();
  if (raw == 0) return e;
  Message m = sample;
  CompressStats st;
  const double c0 = ThreadCpuSeconds();
  const auto t0 = Clock::now();
  if (!CompressMessage(&m, recipe, one, &ref_sample.tensors, 0, &st).ok()) return e;
  const auto t1 = Clock::now();
  const double c1 = ThreadCpuSeconds();
  const TensorMap* rs = &ref_sample.tensors;
  if (!DecompressMessage(
           &m, [rs](int64_t) { return rs; }, one)
           .ok())
    return e;
  const auto t2 = Clock::now();
  const double c2 = ThreadCpuSeconds();
  const double enc_s = std::max(1e-6, std::chrono::duration<double>(t1 - t0).count());
  const double dec_s = std::max(1e-6, std::chrono::duration<double>(t2 - t1).count());
  if (c0 >= 0 && c1 >= c0 && c2 >= c1) {
    e.encode_cpu_Bps = double(raw) / std::max(1e-6, c1 - c0);
    e.decode_cpu_Bps = double(raw) / std::max(1e-6, c2 - c1);
  }
  // Tensors that did not get smaller stay raw: they count at ratio 1.
  e.ratio = double(st.encoded_bytes + (raw - st.raw_bytes)) / double(raw);
  e.encode_Bps = double(raw) / enc_s;
  e.decode_Bps = double(raw) / dec_s;
  e.sampled_bytes = raw;
  // Every piece against the reference: a mixed sample is neither speed.
  e.delta_sampled = recipe.delta && ref_sample.tensors.size() == sample.tensors.size();
  return e;
}

}  // namespace xsilo
