// `xsilo inspect FILE`: the tensors of an xsilo frame or a .safetensors file.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "xsilo/core/codec.h"

namespace xsilo::cli {

namespace {

std::string HumanBytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int Inspect(const std::string& path, bool verify) {
  auto file = Buffer::MapFile(path);
  if (!file.ok()) {
    std::cerr << "xsilo inspect: " << file.status().ToString() << "\n";
    return 1;
  }
  DecodeLimits limits;
  limits.verify_checksum = verify;
  TensorMap tensors;
  std::map<std::string, std::string> metadata;
  if (LooksLikeFrame(file->span())) {
    auto m = DecodeMessage(*file, limits);
    if (!m.ok()) {
      std::cerr << "xsilo inspect: " << path << ": " << m.status().ToString() << "\n";
      return 1;
    }
    std::cout << "xsilo frame: type=" << m->type << " round=" << m->round << " sender=" << m->sender
              << " params=" << m->params.size() << (verify ? " checksum=ok" : "") << "\n";
    tensors = std::move(m->tensors);
  } else {
    auto t = DecodeSafetensors(*file, limits, &metadata);
    if (!t.ok()) {
      std::cerr << "xsilo inspect: " << path << ": " << t.status().ToString() << "\n";
      return 1;
    }
    std::cout << "safetensors file\n";
    tensors = std::move(t).value();
  }
  for (const auto& [k, v] : metadata) std::cout << "  metadata " << k << " = " << v << "\n";
  std::printf("%-40s %-5s %-24s %12s\n", "tensor", "dtype", "shape", "size");
  for (const auto* entry : PayloadOrder(tensors)) {
    const Tensor& t = entry->second;
    std::printf("%-40s %-5s %-24s %12s\n", entry->first.c_str(),
                std::string(DTypeName(t.dtype)).c_str(), ShapeString(t.shape).c_str(),
                HumanBytes(t.nbytes()).c_str());
  }
  std::printf("%zu tensors, %s\n", tensors.size(), HumanBytes(TotalBytes(tensors)).c_str());
  return 0;
}

}  // namespace

void AddInspectCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "List the tensors of a payload or .safetensors file");
  static std::string path;
  static bool no_verify = false;
  cmd->add_option("FILE", path, "xsilo frame or .safetensors file")->required();
  cmd->add_flag("--no-verify", no_verify, "skip the frame checksum");
  cmd->callback([] {
    int rc = Inspect(path, !no_verify);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace xsilo::cli
