#include "xsilo/fl/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "xsilo/core/codec.h"

namespace xsilo::fl {

namespace {

namespace fs = std::filesystem;
constexpr const char* kFormat = "xsilo.fl.checkpoint";
constexpr const char* kIndex = "checkpoint.json";

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Status Errno(const std::string& what) { return Internal(what + ": " + std::strerror(errno)); }

// Writes `bytes` to dir/name through a temporary file, fsync, rename.
Status WriteAtomically(const fs::path& dir, const std::string& name, const GatherList& bytes) {
  const fs::path tmp = dir / ("." + name + ".tmp");
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create " + tmp.string());
  for (const Buffer& seg : bytes.segments) {
    const uint8_t* p = seg.data();
    uint64_t left = seg.size();
    while (left > 0) {
      ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        Status s = Errno("write " + tmp.string());
        ::close(fd);
        ::unlink(tmp.c_str());
        return s;
      }
      p += n;
      left -= static_cast<uint64_t>(n);
    }
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    Status s = Errno("flush " + tmp.string());
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), (dir / name).c_str()) != 0) {
    Status s = Errno("rename " + tmp.string());
    ::unlink(tmp.c_str());
    return s;
  }
  return Status::OK();
}

}  // namespace

Status WriteCheckpoint(const std::string& dir, uint64_t next_round, const TensorMap& model) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Internal("cannot create checkpoint directory " + dir + ": " + ec.message());
  EncodedPayload payload =
      EncodeSafetensors(model, {{"xsilo.fl.next_round", std::to_string(next_round)}});
  const std::string model_name = "model-" + std::to_string(next_round) + ".safetensors";
  XSILO_RETURN_IF_ERROR(WriteAtomically(dir, model_name, payload.bytes));
  nlohmann::json index = {{"format", kFormat},           {"version", 1},
                          {"next_round", next_round},    {"model", model_name},
                          {"bytes", payload.bytes.size}, {"xxh3", Hex(payload.checksum)}};
  GatherList text;
  text.Append(Buffer::CopyFrom(index.dump(2) + "\n"));
  XSILO_RETURN_IF_ERROR(WriteAtomically(dir, kIndex, text));
  // The index now names the new model: older ones can go.
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name != model_name && name.rfind("model-", 0) == 0 &&
        entry.path().extension() == ".safetensors") {
      fs::remove(entry.path(), ec);
    }
  }
  return Status::OK();
}

Result<std::optional<Checkpoint>> ReadCheckpoint(const std::string& dir) {
  const fs::path index_path = fs::path(dir) / kIndex;
  std::error_code ec;
  if (!fs::exists(index_path, ec)) return std::optional<Checkpoint>();
  std::ifstream in(index_path);
  nlohmann::json index = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object() || index.value("format", "") != kFormat ||
      index.value("version", 0) != 1 || !index["next_round"].is_number_unsigned() ||
      !index["model"].is_string() || !index["bytes"].is_number_unsigned() ||
      !index["xxh3"].is_string()) {
    return Corrupt(index_path.string() + " is not an xsilo checkpoint index (version 1)");
  }
  const std::string model_name = index["model"].get<std::string>();
  if (model_name.find('/') != std::string::npos || model_name.rfind("model-", 0) != 0) {
    return Corrupt(index_path.string() + " names a model outside the directory: " + model_name);
  }
  const fs::path model_path = fs::path(dir) / model_name;
  XSILO_ASSIGN_OR_RETURN(Buffer file, Buffer::MapFile(model_path.string()));
  if (file.size() != index["bytes"].get<uint64_t>() ||
      Hex(Checksum(file.span())) != index["xxh3"].get<std::string>()) {
    return Corrupt(model_path.string() + " does not match the size and checksum in " +
                   index_path.string());
  }
  XSILO_ASSIGN_OR_RETURN(TensorMap mapped, DecodeSafetensors(file));
  Checkpoint cp;
  cp.next_round = index["next_round"].get<uint64_t>();
  for (const auto& [name, t] : mapped) {
    // Copies: the server recycles model buffers as accumulators.
    XSILO_ASSIGN_OR_RETURN(
        cp.model[name],
        Tensor::Make(t.dtype, t.shape, Buffer::CopyFrom(t.data.data(), t.nbytes())));
  }
  return std::optional<Checkpoint>(std::move(cp));
}

}  // namespace xsilo::fl
