#include "endpoint/object_table.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace xsilo::endpoint {

bool ValidName(std::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  }
  return true;
}

Status ObjectTable::Open() {
  if (dir_.empty()) return Status::OK();
  std::error_code ec;
  std::filesystem::create_directories(dir_ + "/objects", ec);
  if (ec) return Internal("create " + dir_ + "/objects: " + ec.message());
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& e : std::filesystem::directory_iterator(dir_ + "/objects", ec)) {
    std::string name = e.path().filename().string();
    if (!ValidName(name)) {  // a temporary file an interrupted put left
      std::filesystem::remove(e.path(), ec);
      continue;
    }
    uint64_t size = e.file_size(ec);
    if (ec) continue;
    on_disk_[name] = size;
    used_ += size;
    stored_ += size;
  }
  // The readers of the objects found; a file of an object that is gone
  // (a crash between the two renames of a put, or of an erase) goes.
  std::filesystem::create_directories(dir_ + "/readers", ec);
  if (ec) return Internal("create " + dir_ + "/readers: " + ec.message());
  for (const auto& e : std::filesystem::directory_iterator(dir_ + "/readers", ec)) {
    const std::string name = e.path().filename().string();
    if (!ValidName(name) || on_disk_.count(name) == 0) {
      std::filesystem::remove(e.path(), ec);
      continue;
    }
    std::ifstream in(e.path());
    std::vector<std::string> readers;
    for (std::string r; std::getline(in, r, ',');) {
      if (!r.empty() && r.back() == '\n') r.pop_back();
      if (r == kAnyPeer || ValidName(r)) readers.push_back(r);
    }
    if (!readers.empty()) readers_[name] = std::move(readers);
  }
  return Status::OK();
}

Status ObjectTable::PersistReadersLocked(const std::string& id,
                                         const std::vector<std::string>& readers) {
  const std::string path = dir_ + "/readers/" + id;
  if (readers.empty()) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Internal("unlink " + path + ": " + std::strerror(errno));
    }
    return Status::OK();
  }
  std::string text;
  for (const std::string& r : readers) text += (text.empty() ? "" : ",") + r;
  const std::string tmp =
      dir_ + "/readers/.tmp-" + std::to_string(getpid()) + "-" + std::to_string(++tmp_counter_);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Internal("create " + tmp + ": " + std::strerror(errno));
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                       ::fsync(fd) == 0;
  ::close(fd);
  if (!written || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Internal("write " + path + ": " + std::strerror(errno));
  }
  return Status::OK();
}

Status ObjectTable::Reserve(uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (max_bytes_ > 0 && (size > max_bytes_ || used_ > max_bytes_ - size)) {
    return ResourceExhausted("endpoint holds " + std::to_string(used_) + " of " +
                             std::to_string(max_bytes_) + " bytes; " + std::to_string(size) +
                             " more do not fit");
  }
  // Without a bound, an object is still received whole in memory first: one
  // larger than this machine's RAM is refused before its bytes arrive (a
  // peer's header cannot make the endpoint map 100 GB).
  static const uint64_t ram =
      static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (max_bytes_ == 0 && size > ram) {
    return ResourceExhausted("an object of " + std::to_string(size) +
                             " bytes is larger than this machine's memory (" + std::to_string(ram) +
                             " bytes); set --max-bytes to bound objects");
  }
  used_ += size;
  return Status::OK();
}

void ObjectTable::Abandon(uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  used_ -= size;
}

Status ObjectTable::MayModifyLocked(const std::string& id, const std::string& writer) const {
  if (writer == kSite) return Status::OK();
  const bool stored = dir_.empty() ? memory_.count(id) > 0 : on_disk_.count(id) > 0;
  if (!stored) return Status::OK();
  auto w = peer_writer_.find(id);
  if (w != peer_writer_.end() && w->second == writer) return Status::OK();
  return PermissionDenied("object " + id + " was written by " +
                          (w == peer_writer_.end() ? std::string("this site") : w->second) +
                          ": only its writer may replace or delete it");
}

Status ObjectTable::MayModify(const std::string& id, const std::string& writer) const {
  std::lock_guard<std::mutex> lock(mu_);
  return MayModifyLocked(id, writer);
}

bool ObjectTable::MayRead(const std::string& id, const std::string& reader,
                          const std::string& identity) const {
  std::lock_guard<std::mutex> lock(mu_);
  const bool stored = dir_.empty() ? memory_.count(id) > 0 : on_disk_.count(id) > 0;
  if (!stored) return false;
  if (auto w = peer_writer_.find(id); w != peer_writer_.end() && w->second == identity) {
    return true;
  }
  auto r = readers_.find(id);
  if (r == readers_.end()) return false;
  return std::any_of(r->second.begin(), r->second.end(),
                     [&](const std::string& name) { return name == kAnyPeer || name == reader; });
}

Status ObjectTable::Commit(const std::string& id, Buffer bytes, const std::string& writer,
                           std::vector<std::string> readers) {
  const uint64_t size = bytes.size();
  auto note_writer = [&] {
    if (writer == kSite) {
      peer_writer_.erase(id);
    } else {
      peer_writer_[id] = writer;
    }
    if (readers.empty()) {
      readers_.erase(id);
    } else {
      readers_[id] = std::move(readers);
    }
  };
  if (dir_.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (Status may = MayModifyLocked(id, writer); !may.ok()) {
      used_ -= size;
      return may;
    }
    note_writer();
    auto it = memory_.find(id);
    if (it != memory_.end()) {
      used_ -= it->second.size();
      stored_ -= it->second.size();
    }
    memory_[id] = std::move(bytes);
    stored_ += size;
    return Status::OK();
  }
  std::string tmp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tmp = dir_ + "/objects/.tmp-" + std::to_string(getpid()) + "-" + std::to_string(++tmp_counter_);
  }
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    Abandon(size);
    return Internal("create " + tmp + ": " + std::strerror(errno));
  }
  uint64_t off = 0;
  while (off < size) {
    ssize_t w = ::write(fd, bytes.data() + off, std::min<uint64_t>(size - off, 1u << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      Abandon(size);
      return e == ENOSPC ? ResourceExhausted("write " + tmp + ": no space")
                         : Internal("write " + tmp + ": " + std::strerror(e));
    }
    off += static_cast<uint64_t>(w);
  }
  // On disk before the rename makes it visible: after a crash a renamed
  // file is whole, never empty or short.
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    Abandon(size);
    return Internal("fsync " + tmp + ": " + std::strerror(e));
  }
  ::close(fd);
  std::lock_guard<std::mutex> lock(mu_);
  if (Status may = MayModifyLocked(id, writer); !may.ok()) {  // checked once the bytes are in
    ::unlink(tmp.c_str());
    used_ -= size;
    return may;
  }
  // The readers before the object: a crash between the renames leaves the
  // new readers on the old object of the same site, never an object with
  // readers it was not given.
  if (Status kept = PersistReadersLocked(id, readers); !kept.ok()) {
    ::unlink(tmp.c_str());
    used_ -= size;
    return kept;
  }
  if (::rename(tmp.c_str(), PathOf(id).c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    used_ -= size;
    return Internal("rename " + tmp + ": " + std::strerror(e));
  }
  // And the rename itself, so that the name survives a crash too.
  const std::string dir = std::filesystem::path(PathOf(id)).parent_path().string();
  if (int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    (void)::fsync(d);
    ::close(d);
  }
  auto it = on_disk_.find(id);
  if (it != on_disk_.end()) {
    used_ -= it->second;
    stored_ -= it->second;
  }
  on_disk_[id] = size;
  stored_ += size;
  note_writer();
  return Status::OK();
}

Result<std::optional<Buffer>> ObjectTable::Get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (dir_.empty()) {
    auto it = memory_.find(id);
    if (it == memory_.end()) return std::optional<Buffer>();
    return std::optional<Buffer>(it->second);
  }
  auto it = on_disk_.find(id);
  if (it == on_disk_.end()) return std::optional<Buffer>();
  if (it->second == 0) return std::optional<Buffer>(Buffer());
  auto b = Buffer::MapFile(PathOf(id));
  if (!b.ok()) {
    if (b.status().code() == StatusCode::kNotFound) return std::optional<Buffer>();
    return b.status();
  }
  return std::optional<Buffer>(std::move(b).value());
}

std::optional<uint64_t> ObjectTable::SizeOf(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (dir_.empty()) {
    auto it = memory_.find(id);
    if (it == memory_.end()) return std::nullopt;
    return it->second.size();
  }
  auto it = on_disk_.find(id);
  if (it == on_disk_.end()) return std::nullopt;
  return it->second;
}

Status ObjectTable::Erase(const std::string& id, const std::string& writer) {
  std::lock_guard<std::mutex> lock(mu_);
  XSILO_RETURN_IF_ERROR(MayModifyLocked(id, writer));
  peer_writer_.erase(id);
  readers_.erase(id);
  if (dir_.empty()) {
    auto it = memory_.find(id);
    if (it == memory_.end()) return Status::OK();
    used_ -= it->second.size();
    stored_ -= it->second.size();
    memory_.erase(it);
    return Status::OK();
  }
  auto it = on_disk_.find(id);
  if (it == on_disk_.end()) return Status::OK();
  ::unlink(PathOf(id).c_str());
  (void)PersistReadersLocked(id, {});  // an orphan left by a failure goes at the next Open
  used_ -= it->second;
  stored_ -= it->second;
  on_disk_.erase(it);
  return Status::OK();
}

uint64_t ObjectTable::objects() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dir_.empty() ? memory_.size() : on_disk_.size();
}

uint64_t ObjectTable::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stored_;
}

}  // namespace xsilo::endpoint
