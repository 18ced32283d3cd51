#include "s3/object_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>

#include "s3/errors.h"

namespace xsilo::s3 {

namespace {

Status NoSuchBucket(const std::string& b) {
  return S3Error("NoSuchBucket", "The specified bucket does not exist. (" + b + ")");
}
Status NoSuchKey(const std::string& b, const std::string& k) {
  return S3Error("NoSuchKey", "The specified key does not exist. (" + b + "/" + k + ")");
}

class MemoryObjectStore : public ObjectStore {
 public:
  Status CreateBucket(const std::string& bucket) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (buckets_.count(bucket)) {
      return S3Error("BucketAlreadyOwnedByYou", "bucket " + bucket + " already exists");
    }
    buckets_[bucket].created = std::time(nullptr);
    return Status::OK();
  }
  Status DeleteBucket(const std::string& bucket) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = buckets_.find(bucket);
    if (it == buckets_.end()) return NoSuchBucket(bucket);
    if (!it->second.objects.empty()) {
      return S3Error("BucketNotEmpty",
                     "The bucket you tried to delete is not empty. (" + bucket + ")");
    }
    buckets_.erase(it);
    return Status::OK();
  }
  Status HeadBucket(const std::string& bucket) override {
    std::lock_guard<std::mutex> lock(mu_);
    return buckets_.count(bucket) ? Status::OK() : NoSuchBucket(bucket);
  }
  Result<std::vector<BucketEntry>> ListBuckets() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<BucketEntry> out;
    for (const auto& [name, b] : buckets_) out.push_back({name, b.created});
    return out;
  }
  Status Put(const std::string& bucket, const std::string& key, StoredObject object,
             const PutCondition& condition) override {
    if (object.etag.empty()) {
      EtagHasher h(object.etag_hash);
      for (const Buffer& b : object.segments) h.Update(b.data(), b.size());
      object.etag = h.Finish();
    }
    StoredObject old;  // released outside the lock
    std::lock_guard<std::mutex> lock(mu_);
    auto it = buckets_.find(bucket);
    if (it == buckets_.end()) return NoSuchBucket(bucket);
    if (condition) {
      auto o = it->second.objects.find(key);
      ObjectEntry current;
      if (o != it->second.objects.end()) {
        current = {key, o->second.size, o->second.etag, o->second.mtime};
      }
      XSILO_RETURN_IF_ERROR(condition(o != it->second.objects.end() ? &current : nullptr));
    }
    auto& slot = it->second.objects[key];
    old = std::move(slot);
    slot = std::move(object);
    return Status::OK();
  }
  Result<StoredObject> Get(const std::string& bucket, const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = buckets_.find(bucket);
    if (it == buckets_.end()) return NoSuchBucket(bucket);
    auto o = it->second.objects.find(key);
    if (o == it->second.objects.end()) return NoSuchKey(bucket, key);
    return o->second;
  }
  Status Delete(const std::string& bucket, const std::string& key) override {
    StoredObject old;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = buckets_.find(bucket);
    if (it == buckets_.end()) return NoSuchBucket(bucket);
    auto o = it->second.objects.find(key);
    if (o != it->second.objects.end()) {
      old = std::move(o->second);
      it->second.objects.erase(o);
    }
    return Status::OK();
  }
  Result<std::vector<ObjectEntry>> List(const std::string& bucket,
                                        const std::string& prefix) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = buckets_.find(bucket);
    if (it == buckets_.end()) return NoSuchBucket(bucket);
    std::vector<ObjectEntry> out;
    for (auto o = it->second.objects.lower_bound(prefix); o != it->second.objects.end(); ++o) {
      if (o->first.compare(0, prefix.size(), prefix) != 0) break;
      out.push_back({o->first, o->second.size, o->second.etag, o->second.mtime});
    }
    return out;
  }

 private:
  struct Bucket {
    std::time_t created = 0;
    std::map<std::string, StoredObject> objects;
  };
  std::mutex mu_;
  std::map<std::string, Bucket> buckets_;
};

// Key -> one file name: bytes outside [A-Za-z0-9._-] (and a leading '.')
// are %XX-escaped, so keys with '/' stay flat and never collide with the
// store's own ".xsilo-*" entries.
std::string EncodeKey(const std::string& key) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  for (size_t i = 0; i < key.size(); ++i) {
    unsigned char c = key[i];
    bool plain = std::isalnum(c) || c == '-' || c == '_' || (c == '.' && i > 0);
    if (plain) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kDigits[c >> 4]);
      out.push_back(kDigits[c & 15]);
    }
  }
  return out;
}

bool DecodeKey(const std::string& name, std::string* key) {
  key->clear();
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] != '%') {
      key->push_back(name[i]);
      continue;
    }
    if (i + 2 >= name.size()) return false;
    auto hv = [](char c) {
      return c >= '0' && c <= '9' ? c - '0' : (c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1);
    };
    int hi = hv(name[i + 1]), lo = hv(name[i + 2]);
    if (hi < 0 || lo < 0) return false;
    key->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

Status WriteAll(int fd, const uint8_t* p, uint64_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<uint64_t>(n, 1ull << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return ResourceExhausted(std::string("InternalError: write: ") + std::strerror(errno));
    p += w;
    n -= w;
  }
  return Status::OK();
}

// Unique names for temporary and recycled files, across every store of
// this process (rank 0 opens a store per direct put, concurrently).
std::string UniqueName() {
  static std::atomic<uint64_t> counter{0};
  return std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

// Files of deleted objects kept for reuse (DirectoryStoreOptions).
constexpr const char* kFreeDir = ".xsilo-free";
constexpr uint64_t kRecycleMinBytes = 8ull << 20;

// Put's condition test and renames, and Delete's rename, in every directory
// store of the process: PutObjectInDirectory opens a store of its own on the
// server's directory.
std::mutex& CommitMutex() {
  static std::mutex mu;
  return mu;
}

class DirectoryObjectStore : public ObjectStore {
 public:
  DirectoryObjectStore(std::string root, DirectoryStoreOptions options)
      : root_(std::move(root)), options_(options) {}

  Status CreateBucket(const std::string& bucket) override {
    if (!InsideRoot(bucket))
      return S3Error("InvalidBucketName", "The specified bucket is not valid.");
    std::string dir = BucketDir(bucket);
    if (::mkdir(dir.c_str(), 0755) != 0) {
      if (errno == EEXIST)
        return S3Error("BucketAlreadyOwnedByYou", "bucket " + bucket + " already exists");
      return S3Error("InternalError", "mkdir " + dir + ": " + std::strerror(errno));
    }
    ::mkdir((dir + "/.xsilo-tmp").c_str(), 0755);
    ::mkdir((dir + "/.xsilo-meta").c_str(), 0755);
    ::mkdir((dir + "/" + kFreeDir).c_str(), 0755);
    return Status::OK();
  }
  Status DeleteBucket(const std::string& bucket) override {
    XSILO_RETURN_IF_ERROR(HeadBucket(bucket));
    auto list = List(bucket, "");
    if (!list.ok()) return list.status();
    if (!list->empty()) {
      return S3Error("BucketNotEmpty",
                     "The bucket you tried to delete is not empty. (" + bucket + ")");
    }
    std::error_code ec;
    std::filesystem::remove_all(BucketDir(bucket), ec);
    if (ec) return S3Error("InternalError", "remove " + bucket + ": " + ec.message());
    return Status::OK();
  }
  Status HeadBucket(const std::string& bucket) override {
    struct stat st {};
    if (!InsideRoot(bucket) || ::stat(BucketDir(bucket).c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode)) {
      return NoSuchBucket(bucket);
    }
    return Status::OK();
  }
  Result<std::vector<BucketEntry>> ListBuckets() override {
    std::vector<BucketEntry> out;
    DIR* d = ::opendir(root_.c_str());
    if (!d) return S3Error("InternalError", "opendir " + root_);
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.empty() || name[0] == '.') continue;
      struct stat st {};
      if (::stat((root_ + "/" + name).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        out.push_back({name, st.st_mtime});
      }
    }
    ::closedir(d);
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.name < b.name; });
    return out;
  }
  Status Put(const std::string& bucket, const std::string& key, StoredObject object,
             const PutCondition& condition) override {
    XSILO_RETURN_IF_ERROR(HeadBucket(bucket));
    std::string name = EncodeKey(key);
    if (name.size() > 240) return S3Error("KeyTooLongError", "Your key is too long");
    std::string dir = BucketDir(bucket);
    std::string tmp = dir + "/.xsilo-tmp/" + UniqueName();
    // A big object overwrites the file of a deleted one when there is one:
    // its pages are there already, and writing into them costs about half
    // of allocating fresh tmpfs pages (docs/hybrid.md, "Recycled files").
    int fd = object.size >= kRecycleMinBytes ? ClaimFreeFile(dir, tmp, object.size) : -1;
    if (fd < 0) fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return S3Error("InternalError", "open " + tmp + ": " + std::strerror(errno));
    Status st;
    // Without an ETag, hash each chunk just before writing it, while it is
    // still in cache: one pass over the bytes instead of two.
    std::optional<EtagHasher> hash;
    if (object.etag.empty()) hash.emplace(object.etag_hash);
    constexpr uint64_t kChunk = 1 << 20;
    for (const Buffer& b : object.segments) {
      for (uint64_t off = 0; st.ok() && off < b.size(); off += kChunk) {
        const uint64_t n = std::min(kChunk, b.size() - off);
        if (hash) hash->Update(b.data() + off, n);
        st = WriteAll(fd, b.data() + off, n);
      }
      if (!st.ok()) break;
    }
    if (hash) object.etag = hash->Finish();
    // A recycled file may be longer than the object.
    if (st.ok() && ::ftruncate(fd, static_cast<off_t>(object.size)) != 0) {
      st = S3Error("InternalError", std::string("ftruncate: ") + std::strerror(errno));
    }
    ::close(fd);
    if (st.ok()) {
      std::string meta_tmp = tmp + ".meta";
      {
        std::ofstream m(meta_tmp, std::ios::binary | std::ios::trunc);
        m << object.etag << "\n" << object.content_type << "\n";
        if (!object.checksum.empty()) m << object.checksum_algorithm << ":" << object.checksum;
        m << "\n";
        for (const auto& [k, v] : object.user_metadata) m << k << "\t" << v << "\n";
        for (const auto& [k, v] : object.headers) m << k << "\t" << v << "\n";
        if (!m) st = S3Error("InternalError", "write " + meta_tmp);
      }
      // The condition's test and both renames under one lock, so that two
      // writes of one key cannot pair one's metadata with the other's data.
      std::lock_guard<std::mutex> lock(CommitMutex());
      if (st.ok() && condition) {
        struct stat sb {};
        const std::string path = dir + "/" + name;
        if (::stat(path.c_str(), &sb) == 0 && S_ISREG(sb.st_mode)) {
          StoredObject meta;
          meta.mtime = sb.st_mtime;
          ReadMeta(bucket, name, &meta);
          ObjectEntry current{key, static_cast<uint64_t>(sb.st_size), meta.etag, meta.mtime};
          st = condition(&current);
        } else {
          st = condition(nullptr);
        }
      }
      // Metadata first: a reader that sees the new data finds its ETag.
      if (st.ok() && ::rename(meta_tmp.c_str(), (dir + "/.xsilo-meta/" + name).c_str()) != 0) {
        st = S3Error("InternalError", std::string("rename: ") + std::strerror(errno));
      }
      if (st.ok() && ::rename(tmp.c_str(), (dir + "/" + name).c_str()) != 0) {
        st = S3Error("InternalError", std::string("rename: ") + std::strerror(errno));
      }
      if (!st.ok()) ::unlink(meta_tmp.c_str());
    }
    if (!st.ok()) ::unlink(tmp.c_str());
    return st;
  }
  Result<StoredObject> Get(const std::string& bucket, const std::string& key) override {
    XSILO_RETURN_IF_ERROR(HeadBucket(bucket));
    std::string name = EncodeKey(key);
    std::string path = BucketDir(bucket) + "/" + name;
    struct stat st {};
    if (name.size() > 240 || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return NoSuchKey(bucket, key);
    }
    StoredObject o;
    o.mtime = st.st_mtime;
    if (st.st_size > 0) {
      XSILO_ASSIGN_OR_RETURN(Buffer mapped, MapObject(path, bucket, key, &o.file));
      o.size = mapped.size();
      o.segments.push_back(std::move(mapped));
    }
    ReadMeta(bucket, name, &o);
    return o;
  }
  Status Delete(const std::string& bucket, const std::string& key) override {
    XSILO_RETURN_IF_ERROR(HeadBucket(bucket));
    std::string name = EncodeKey(key);
    if (name.size() > 240) return Status::OK();
    const std::string dir = BucketDir(bucket);
    const std::string path = dir + "/" + name;
    // Out of its key under the commit lock (not between a write's test and
    // its renames); recycled or unlinked after it.
    const std::string gone = dir + "/.xsilo-tmp/" + UniqueName();
    bool moved;
    {
      std::lock_guard<std::mutex> lock(CommitMutex());
      moved = ::rename(path.c_str(), gone.c_str()) == 0;
      ::unlink((dir + "/.xsilo-meta/" + name).c_str());
    }
    if (moved && !Recycle(dir, gone)) ::unlink(gone.c_str());
    return Status::OK();
  }

  void Trim() override {
    auto buckets = ListBuckets();
    if (!buckets.ok()) return;
    for (const auto& b : *buckets) ScanFree(BucketDir(b.name), nullptr);
  }
  Result<std::vector<ObjectEntry>> List(const std::string& bucket,
                                        const std::string& prefix) override {
    XSILO_RETURN_IF_ERROR(HeadBucket(bucket));
    std::string dir = BucketDir(bucket);
    DIR* d = ::opendir(dir.c_str());
    if (!d) return NoSuchBucket(bucket);
    std::vector<ObjectEntry> out;
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.empty() || name[0] == '.') continue;
      std::string key;
      if (!DecodeKey(name, &key) || key.compare(0, prefix.size(), prefix) != 0) continue;
      struct stat st {};
      if (::stat((dir + "/" + name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      StoredObject meta;
      meta.mtime = st.st_mtime;
      ReadMeta(bucket, name, &meta);
      out.push_back({key, static_cast<uint64_t>(st.st_size), meta.etag, st.st_mtime});
    }
    ::closedir(d);
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.key < b.key; });
    return out;
  }

 private:
  // A bucket is one directory right under the root: not "", ".", "..", the
  // store's hidden entries, or anything with a '/' (every operation checks
  // this through HeadBucket or CreateBucket before touching the path).
  static bool InsideRoot(const std::string& bucket) {
    return !bucket.empty() && bucket[0] != '.' && bucket.find('/') == std::string::npos &&
           bucket.find('\0') == std::string::npos;
  }
  std::string BucketDir(const std::string& bucket) const { return root_ + "/" + bucket; }

  // Maps the object's file for a reader, holding a shared lock on it for as
  // long as the mapping lives: a deleted object's file is reused only when
  // no reader holds it (ClaimFreeFile). The lock is taken before checking
  // that the path still names the opened file, so a reader either maps the
  // object the path names, whole, or finds no object.
  Result<Buffer> MapObject(const std::string& path, const std::string& bucket,
                           const std::string& key, std::shared_ptr<const OpenFile>* file) {
    int fd = -1;
    struct stat opened = {}, named = {};
    // A key replaced between the open and the check is opened again (a few
    // times: a key rewritten without pause may still come out missing).
    for (int attempt = 0;; ++attempt) {
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        if (errno == ENOENT) return NoSuchKey(bucket, key);
        return S3Error("InternalError", "open " + path + ": " + std::strerror(errno));
      }
      // A filesystem without flock fails it: the reader goes on unlocked,
      // and a claimer's exclusive lock fails too, so no file is reused.
      while (::flock(fd, LOCK_SH) != 0 && errno == EINTR) {
      }
      const bool same = ::fstat(fd, &opened) == 0 && ::stat(path.c_str(), &named) == 0 &&
                        opened.st_ino == named.st_ino && opened.st_dev == named.st_dev;
      if (same) break;
      ::close(fd);
      if (attempt == 3 || ::access(path.c_str(), F_OK) != 0) {
        return NoSuchKey(bucket, key);  // deleted meanwhile
      }
    }
    const uint64_t size = static_cast<uint64_t>(opened.st_size);
    if (size == 0) {
      ::close(fd);
      return Buffer();
    }
    // Private and writable, as Buffer::MapFile: a receiver may change its
    // tensors in place without touching the stored object.
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return S3Error("InternalError", "mmap " + path + ": " + std::strerror(e));
    }
    // The descriptor (and with it the lock) lives as long as the mapping
    // and the caller's handle.
    auto open = std::make_shared<const OpenFile>(fd);
    *file = open;
    return Buffer::Wrap(p, size, [p, size, open] { ::munmap(p, size); });
  }

  // Deleting `path`: moves it into the bucket's free files when recycling
  // is on, the file is big enough and the free files stay within the
  // budget. False: the caller unlinks it.
  bool Recycle(const std::string& dir, const std::string& path) {
    if (options_.recycle_bytes == 0) return false;
    // One delete at a time counts and adds (the budget holds within this
    // store; the server has one).
    std::lock_guard<std::mutex> lock(recycle_mu_);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<uint64_t>(st.st_size) < kRecycleMinBytes) {
      return false;
    }
    uint64_t held = 0;
    ScanFree(dir, &held);
    if (held + static_cast<uint64_t>(st.st_size) > options_.recycle_bytes) return false;
    const std::string free_dir = dir + "/" + kFreeDir;
    ::mkdir(free_dir.c_str(), 0755);  // buckets made before recycling existed
    return ::rename(path.c_str(), (free_dir + "/" + UniqueName()).c_str()) == 0;
  }

  struct FreeFile {
    std::string path;
    uint64_t size = 0;
    std::time_t deleted = 0;  // a rename sets ctime: when it became free
  };
  static std::vector<FreeFile> ListFree(const std::string& dir) {
    const std::string free_dir = dir + "/" + kFreeDir;
    std::vector<FreeFile> out;
    DIR* d = ::opendir(free_dir.c_str());
    if (!d) return out;
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      FreeFile f{free_dir + "/" + e->d_name};
      struct stat st {};
      if (::stat(f.path.c_str(), &st) != 0) continue;
      f.size = static_cast<uint64_t>(st.st_size);
      f.deleted = st.st_ctime;
      out.push_back(std::move(f));
    }
    ::closedir(d);
    return out;
  }

  // Removes free files older than the maximum age; *held (optional) gets
  // the bytes of those that remain.
  void ScanFree(const std::string& dir, uint64_t* held) {
    if (held) *held = 0;
    const std::time_t now = std::time(nullptr);
    for (const FreeFile& f : ListFree(dir)) {
      if (now - f.deleted > options_.recycle_max_age.count()) {
        ::unlink(f.path.c_str());
      } else if (held) {
        *held += f.size;
      }
    }
  }

  // Takes the smallest free file of `size` to 2 x `size` bytes for a new
  // object: renamed to `tmp` (only one claimer can), then locked
  // exclusively; a file some reader still maps is unlinked instead (the
  // reader keeps its pages) and the next one tried. Returns a descriptor
  // open for writing at offset 0, or -1 when there is none.
  int ClaimFreeFile(const std::string& dir, const std::string& tmp, uint64_t size) {
    std::vector<FreeFile> fits = ListFree(dir);
    std::erase_if(fits, [&](const FreeFile& f) { return f.size < size || f.size / 2 > size; });
    std::sort(fits.begin(), fits.end(),
              [](const FreeFile& a, const FreeFile& b) { return a.size < b.size; });
    for (const FreeFile& f : fits) {
      if (::rename(f.path.c_str(), tmp.c_str()) != 0) continue;  // another claimer won
      int fd = ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
      if (fd >= 0) ::close(fd);
      ::unlink(tmp.c_str());
    }
    return -1;
  }
  void ReadMeta(const std::string& bucket, const std::string& name, StoredObject* o) const {
    std::ifstream m(BucketDir(bucket) + "/.xsilo-meta/" + name, std::ios::binary);
    std::string etag, type;
    if (std::getline(m, etag) && !etag.empty()) o->etag = etag;
    if (std::getline(m, type) && !type.empty()) o->content_type = type;
    std::string line;
    // "<algorithm>:<base64>"; before flexible checksums, a bare base64 SHA-256.
    if (std::getline(m, line) && !line.empty()) {
      const size_t colon = line.find(':');
      o->checksum_algorithm = colon == std::string::npos ? "SHA256" : line.substr(0, colon);
      o->checksum = colon == std::string::npos ? line : line.substr(colon + 1);
    }
    while (std::getline(m, line)) {
      size_t tab = line.find('\t');
      if (tab == std::string::npos) continue;
      // x-amz-meta-* names are lowercase; the standard headers start uppercase.
      auto& list = line.compare(0, 11, "x-amz-meta-") == 0 ? o->user_metadata : o->headers;
      list.emplace_back(line.substr(0, tab), line.substr(tab + 1));
    }
    if (o->etag.empty()) o->etag = "\"" + std::to_string(o->mtime) + "\"";
  }

  std::string root_;
  const DirectoryStoreOptions options_;
  std::mutex recycle_mu_;
};

}  // namespace

OpenFile::~OpenFile() {
  if (fd >= 0) ::close(fd);
}

std::unique_ptr<ObjectStore> NewMemoryObjectStore() {
  return std::make_unique<MemoryObjectStore>();
}

namespace {

// Removes the temporary files (<bucket>/.xsilo-tmp/<pid>-<n>) of writers
// that died mid-PUT: a server killed while receiving an object leaves its
// file there, never listed or served, holding disk (or, on tmpfs, memory).
// Files of a live process, this one included, are kept: every store of a
// directory shares it (a direct put opens a store of its own).
void RemoveDeadWritersTemporaries(const std::string& root) {
  std::error_code ec;
  for (const auto& bucket : std::filesystem::directory_iterator(root, ec)) {
    std::error_code ec2;
    for (const auto& f : std::filesystem::directory_iterator(bucket.path() / ".xsilo-tmp", ec2)) {
      const std::string name = f.path().filename().string();
      const size_t dash = name.find('-');
      if (dash == std::string::npos || dash == 0) continue;
      pid_t pid = 0;
      auto [end, err] = std::from_chars(name.data(), name.data() + dash, pid);
      if (err != std::errc() || end != name.data() + dash || pid <= 0) continue;
      if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
      std::error_code ec3;
      std::filesystem::remove(f.path(), ec3);
    }
  }
}

}  // namespace

Result<std::unique_ptr<ObjectStore>> NewDirectoryObjectStore(const std::string& root,
                                                             DirectoryStoreOptions options) {
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) return InvalidArgument("cannot create directory " + root + ": " + ec.message());
  RemoveDeadWritersTemporaries(root);
  return std::unique_ptr<ObjectStore>(std::make_unique<DirectoryObjectStore>(root, options));
}

}  // namespace xsilo::s3
