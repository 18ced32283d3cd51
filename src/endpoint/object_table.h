// Private: the objects an endpoint owns. In memory, or with a directory one
// file per object (written to a temporary name, renamed into place, read
// back memory-mapped), so a restarted endpoint still has them. A byte bound
// covers all objects: a put past it is ResourceExhausted and stores nothing.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "xsilo/core/buffer.h"
#include "xsilo/core/status.h"

namespace xsilo::endpoint {

// Object ids and endpoint UUIDs: [A-Za-z0-9_-]{1,128}.
bool ValidName(std::string_view s);

class ObjectTable {
 public:
  // dir "" keeps objects in memory; max_bytes 0: no bound.
  ObjectTable(std::string dir, uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {}
  // Creates the directory and indexes the objects already in it.
  Status Open();

  // ResourceExhausted (nothing reserved) when `size` more bytes would pass
  // the bound; the reservation is released by Commit or Abandon.
  Status Reserve(uint64_t size);
  void Abandon(uint64_t size);
  // Who wrote an object: kSite for this site's own processes (the local
  // API, and every object found in the directory at Open), else the UUID
  // of the peer endpoint that put it. A peer may overwrite or erase only
  // what it wrote; the site may overwrite or erase anything.
  static constexpr const char* kSite = "";
  // PermissionDenied, naming the writer, unless `writer` may replace or
  // erase id (an id not stored may be written by anyone).
  Status MayModify(const std::string& id, const std::string& writer) const;

  // Stores `bytes` under id (replacing an older object) with `size`
  // reserved, as written by `writer`, readable by the peers `readers`
  // names (UUIDs, or kAnyPeer); PermissionDenied (the reservation released)
  // when MayModify refuses.
  static constexpr const char* kAnyPeer = "*";
  Status Commit(const std::string& id, Buffer bytes, const std::string& writer = kSite,
                std::vector<std::string> readers = {});
  // Whether the peer endpoint `reader` (its UUID; `identity` is the
  // UUID@fingerprint its writes are recorded under) may read id: it wrote
  // the object, or the object's readers name it or kAnyPeer (false for an
  // id not stored). With a directory, readers are kept in
  // <dir>/readers/<id>, so a restarted endpoint serves the same peers;
  // writers live in memory only (after a restart no peer may change an
  // object: that fails closed).
  bool MayRead(const std::string& id, const std::string& reader, const std::string& identity) const;

  Result<std::optional<Buffer>> Get(const std::string& id) const;
  std::optional<uint64_t> SizeOf(const std::string& id) const;
  Status Erase(const std::string& id, const std::string& writer = kSite);

  uint64_t objects() const;
  uint64_t bytes() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string PathOf(const std::string& id) const { return dir_ + "/objects/" + id; }
  Status MayModifyLocked(const std::string& id, const std::string& writer) const;
  // Writes (or, when empty, removes) <dir>/readers/<id>; caller holds mu_.
  Status PersistReadersLocked(const std::string& id, const std::vector<std::string>& readers);

  const std::string dir_;
  const uint64_t max_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, Buffer> memory_;     // dir_ == ""
  std::map<std::string, uint64_t> on_disk_;  // dir_ != "": id -> size
  // The objects peers wrote (absent: kSite). In memory only: after a
  // restart the site holds every object, which fails closed for peers.
  std::map<std::string, std::string> peer_writer_;
  std::map<std::string, std::vector<std::string>> readers_;  // absent: none
  uint64_t used_ = 0;                                        // stored + reserved
  uint64_t stored_ = 0;
  uint64_t tmp_counter_ = 0;
};

}  // namespace xsilo::endpoint
