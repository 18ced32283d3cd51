// Private: where the embedded S3 server keeps buckets and objects.
//
// An object is a list of Buffers (a gather list): the memory store keeps the
// Buffers the request bodies were read into (a multipart object keeps its
// parts, never concatenated); the directory store hands out a file mapping.
// Either way a GET writes the stored bytes to the socket without copying.
// Errors are S3 errors (s3/errors.h): NoSuchBucket, NoSuchKey, ...
#pragma once

#include <chrono>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "s3/etag.h"
#include "xsilo/core/buffer.h"
#include "xsilo/core/status.h"

namespace xsilo::s3 {

// An open file descriptor, closed with the last owner.
struct OpenFile {
  explicit OpenFile(int f) : fd(f) {}
  ~OpenFile();
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
  const int fd;
};

struct StoredObject {
  std::vector<Buffer> segments;
  // Directory store: the open file the one segment maps, so that a GET can
  // send it with sendfile(2), no copy through user space. Null otherwise.
  std::shared_ptr<const OpenFile> file;
  uint64_t size = 0;
  // Quoted, as S3 sends it. Left empty, the store computes it itself with
  // `etag_hash` (the directory store while it writes).
  std::string etag;
  EtagHash etag_hash = EtagHash::kMd5;
  std::time_t mtime = 0;
  std::string content_type = "application/octet-stream";
  // The flexible checksum the object was stored with (verified at PUT):
  // "CRC32", "CRC32C", "CRC64NVME", "SHA1" or "SHA256", and its base64
  // value (a multipart object's composite one ends in "-<parts>"); both
  // empty when the upload sent none.
  std::string checksum_algorithm;
  std::string checksum;
  std::vector<std::pair<std::string, std::string>> user_metadata;  // x-amz-meta-* (lowercase)
  // The standard headers S3 keeps with an object and returns on GET/HEAD
  // (Cache-Control, Content-Disposition, Content-Encoding, Content-Language,
  // Expires), names as S3 spells them, values as the PUT sent them.
  std::vector<std::pair<std::string, std::string>> headers;
};

struct ObjectEntry {
  std::string key;
  uint64_t size = 0;
  std::string etag;
  std::time_t mtime = 0;
};

struct BucketEntry {
  std::string name;
  std::time_t created = 0;
};

// A conditional write's test of the object the key holds now (null: none),
// run by Put atomically with the replacement: no other write or delete
// through the same store comes between the test and the replacement. An
// error fails the Put and leaves the key as it was.
using PutCondition = std::function<Status(const ObjectEntry* current)>;

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  virtual Status CreateBucket(const std::string& bucket) = 0;
  virtual Status DeleteBucket(const std::string& bucket) = 0;
  virtual Status HeadBucket(const std::string& bucket) = 0;
  virtual Result<std::vector<BucketEntry>> ListBuckets() = 0;
  // Replaces the object atomically: readers see the old or the new one.
  // With a condition, only when it passes (see PutCondition).
  virtual Status Put(const std::string& bucket, const std::string& key, StoredObject object,
                     const PutCondition& condition = nullptr) = 0;
  virtual Result<StoredObject> Get(const std::string& bucket, const std::string& key) = 0;
  // Deleting a missing key succeeds, as in S3.
  virtual Status Delete(const std::string& bucket, const std::string& key) = 0;
  // All keys starting with `prefix`, sorted.
  virtual Result<std::vector<ObjectEntry>> List(const std::string& bucket,
                                                const std::string& prefix) = 0;
  // Periodic housekeeping (the directory store drops free files past their
  // age). Thread-safe; a no-op by default.
  virtual void Trim() {}
};

std::unique_ptr<ObjectStore> NewMemoryObjectStore();
struct DirectoryStoreOptions {
  // A deleted object of at least 8 MiB keeps its file in
  // <bucket>/.xsilo-free/ for reuse by a later PUT of up to its size (as
  // long as the free files stay within this many bytes and are younger
  // than recycle_max_age): on tmpfs, overwriting pages that exist costs
  // about half of allocating fresh ones. Every store reuses free files;
  // only one with recycle_bytes > 0 keeps them. 0 (default): deletes unlink.
  uint64_t recycle_bytes = 0;
  std::chrono::seconds recycle_max_age{30};
};

// Objects are files under `root`/<bucket>/, written to a temporary file and
// renamed into place, so a reader never sees a partial object.
Result<std::unique_ptr<ObjectStore>> NewDirectoryObjectStore(const std::string& root,
                                                             DirectoryStoreOptions options = {});

}  // namespace xsilo::s3
