// memory: objects in this process's memory, in a named segment shared by
// every memory connector of the same name in the process. A key resolves
// only inside the process that stored it.
//
// Options: name (default "default").
// A single-Buffer put stores a reference to the caller's Buffer (no copy);
// callers must not modify bytes after putting them.
#include <map>
#include <mutex>
#include <set>

#include "store/builtin.h"

namespace xsilo {

namespace {

struct Segment {
  std::mutex mu;
  std::map<std::string, Buffer> objects;
  std::set<std::string> reserved;  // deferred keys not yet set
};

std::shared_ptr<Segment> SegmentNamed(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<Segment>> segments;
  std::lock_guard<std::mutex> lock(mu);
  auto& s = segments[name];
  if (!s) s = std::make_shared<Segment>();
  return s;
}

class MemoryConnector final : public Connector {
 public:
  explicit MemoryConnector(std::string name) : name_(std::move(name)), seg_(SegmentNamed(name_)) {}

  std::string_view type() const override { return "memory"; }
  ConnectorConfig config() const override { return {"memory", {{"name", name_}}}; }

  Result<Key> Put(const GatherList& bytes) override {
    Key key{"memory", RandomObjectId(), bytes.size, {}};
    XSILO_RETURN_IF_ERROR(Store(key.id, bytes));
    return key;
  }

  Result<std::optional<Buffer>> Get(const Key& key) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    std::lock_guard<std::mutex> lock(seg_->mu);
    auto it = seg_->objects.find(key.id);
    if (it == seg_->objects.end()) return std::optional<Buffer>();
    return std::optional<Buffer>(it->second);
  }

  Result<bool> Exists(const Key& key) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    std::lock_guard<std::mutex> lock(seg_->mu);
    return seg_->objects.count(key.id) > 0;
  }

  Status Evict(const Key& key) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    std::lock_guard<std::mutex> lock(seg_->mu);
    seg_->objects.erase(key.id);
    seg_->reserved.erase(key.id);
    return Status::OK();
  }

  Result<Key> NewKey() override {
    Key key{"memory", RandomObjectId(), 0, {}};
    std::lock_guard<std::mutex> lock(seg_->mu);
    seg_->reserved.insert(key.id);
    return key;
  }

  Status Set(const Key& key, const GatherList& bytes) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    return Store(key.id, bytes);
  }

 private:
  Status CheckKey(const Key& key) const {
    if (key.connector != "memory") {
      return InvalidArgument("key of connector '" + key.connector +
                             "' given to a memory connector");
    }
    return Status::OK();
  }

  Status Store(const std::string& id, const GatherList& bytes) {
    Buffer b;
    if (bytes.segments.size() == 1) {
      b = bytes.segments[0];
    } else {
      XSILO_ASSIGN_OR_RETURN(b, bytes.Flatten());
    }
    std::lock_guard<std::mutex> lock(seg_->mu);
    seg_->reserved.erase(id);
    seg_->objects[id] = std::move(b);
    return Status::OK();
  }

  const std::string name_;
  const std::shared_ptr<Segment> seg_;
};

}  // namespace

Result<std::unique_ptr<Connector>> MakeMemoryConnector(const ConnectorOptions& options) {
  const OptionTable& t = MemoryConnectorOptionTable();
  XSILO_RETURN_IF_ERROR(t.CheckKeys(options));
  return std::unique_ptr<Connector>(std::make_unique<MemoryConnector>(t.String(options, "name")));
}

}  // namespace xsilo
