// file: one file per object in a shared directory. Writes go to a hidden
// temporary file that is renamed into place, so a reader never sees a
// partial object. Reads memory-map the file (no copy).
//
// Options: dir (required; created if missing), fsync (0|1, default 0: fsync
// each object before the rename, for durability across power loss).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "store/builtin.h"

namespace xsilo {

namespace {

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 200 || id[0] == '.') return false;
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  }
  return true;
}

class FileConnector final : public Connector {
 public:
  FileConnector(std::string dir, bool fsync) : dir_(std::move(dir)), fsync_(fsync) {}

  std::string_view type() const override { return "file"; }
  ConnectorConfig config() const override {
    return {"file", {{"dir", dir_}, {"fsync", fsync_ ? "1" : "0"}}};
  }

  Result<Key> Put(const GatherList& bytes) override {
    Key key{"file", RandomObjectId(), bytes.size, {}};
    XSILO_RETURN_IF_ERROR(Write(key.id, bytes));
    return key;
  }

  Result<std::optional<Buffer>> Get(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(std::string path, PathOf(key));
    auto b = Buffer::MapFile(path);
    if (!b.ok()) {
      if (b.status().code() == StatusCode::kNotFound) return std::optional<Buffer>();
      return b.status();
    }
    return std::optional<Buffer>(std::move(b).value());
  }

  Result<bool> Exists(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(std::string path, PathOf(key));
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT) return false;
    return ErrnoStatus("stat " + path, errno);
  }

  Status Evict(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(std::string path, PathOf(key));
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus("unlink " + path, errno);
    return Status::OK();
  }

  Result<Key> NewKey() override { return Key{"file", RandomObjectId(), 0, {}}; }

  Status Set(const Key& key, const GatherList& bytes) override {
    XSILO_RETURN_IF_ERROR(PathOf(key).status());
    return Write(key.id, bytes);
  }

 private:
  Result<std::string> PathOf(const Key& key) const {
    if (key.connector != "file") {
      return InvalidArgument("key of connector '" + key.connector + "' given to a file connector");
    }
    if (!ValidId(key.id)) return InvalidArgument("invalid object id '" + key.id + "'");
    return dir_ + "/" + key.id;
  }

  Status Write(const std::string& id, const GatherList& bytes) {
    std::string final_path = dir_ + "/" + id;
    std::string tmp = dir_ + "/.tmp-" + id + "-" + RandomObjectId().substr(0, 8);
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus("create " + tmp, errno);
    Status st;
    for (const Buffer& seg : bytes.segments) {
      uint64_t done = 0;
      while (done < seg.size() && st.ok()) {
        ssize_t n = ::write(fd, seg.data() + done, std::min<uint64_t>(seg.size() - done, 1 << 30));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
          st = ErrnoStatus("write " + tmp, errno);
        else
          done += static_cast<uint64_t>(n);
      }
    }
    if (st.ok() && fsync_ && ::fsync(fd) != 0) st = ErrnoStatus("fsync " + tmp, errno);
    if (::close(fd) != 0 && st.ok()) st = ErrnoStatus("close " + tmp, errno);
    if (st.ok() && ::rename(tmp.c_str(), final_path.c_str()) != 0)
      st = ErrnoStatus("rename " + tmp, errno);
    if (!st.ok()) ::unlink(tmp.c_str());
    return st;
  }

  const std::string dir_;
  const bool fsync_;
};

}  // namespace

Result<std::unique_ptr<Connector>> MakeFileConnector(const ConnectorOptions& options) {
  const OptionTable& t = FileConnectorOptionTable();
  XSILO_RETURN_IF_ERROR(t.CheckKeys(options));
  const std::string dir = t.String(options, "dir");
  if (dir.empty()) return InvalidArgument("file connector needs option 'dir'");
  XSILO_ASSIGN_OR_RETURN(bool fsync, t.Flag(options, "fsync"));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoStatus("create directory " + dir, ec.value());
  return std::unique_ptr<Connector>(std::make_unique<FileConnector>(dir, fsync));
}

}  // namespace xsilo
