// SerializedTask, TaskRegistry and the submitter's side of RemoteTask
// (include/xsilo/store/serialized_task.h).
#include "xsilo/store/serialized_task.h"

#include <exception>
#include <nlohmann/json.hpp>

#include "xsilo/core/base64.h"

namespace xsilo {

using nlohmann::json;

namespace {

// The trailing byte of what a worker writes to the result key.
constexpr uint8_t kValueTag = 'V';
constexpr uint8_t kErrorTag = 'E';

Buffer TagBuffer(uint8_t tag) { return Buffer::CopyFrom(&tag, 1); }

GatherList ErrorOutcome(const Status& error) {
  std::string text =
      json{{"code", static_cast<int>(error.code())}, {"message", error.message()}}.dump();
  GatherList out;
  out.Append(Buffer::CopyFrom(text));
  out.Append(TagBuffer(kErrorTag));
  return out;
}

Status ParseErrorOutcome(const Buffer& body, const std::string& function) {
  json j = json::parse(body.view().begin(), body.view().end(), nullptr, false);
  auto code = j.is_object() ? j.find("code") : j.end();
  auto message = j.is_object() ? j.find("message") : j.end();
  if (code == j.end() || !code->is_number_integer() || message == j.end() ||
      !message->is_string()) {
    return Corrupt("task '" + function + "': the result key holds a malformed error");
  }
  int c = code->get<int>();
  if (c <= static_cast<int>(StatusCode::kOk) || c > static_cast<int>(StatusCode::kInternal)) {
    return Corrupt("task '" + function + "': the result key holds an unknown status code " +
                   std::to_string(c));
  }
  return Status(static_cast<StatusCode>(c), message->get<std::string>());
}

}  // namespace

std::string SerializedTask::Serialize() const {
  json args = json::array();
  for (const Argument& a : arguments) {
    if (a.key) {
      args.push_back({{"key", json::parse(a.key->ToJson())}});
    } else {
      args.push_back({{"value", Base64Encode(a.value.span())}});
    }
  }
  return json{{"function", function},
              {"store", json::parse(store.ToJson())},
              {"args", std::move(args)},
              {"result", json::parse(result.ToJson())}}
      .dump();
}

Result<SerializedTask> SerializedTask::Deserialize(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("task is not a JSON object");
  auto function = j.find("function");
  auto store = j.find("store");
  auto args = j.find("args");
  auto result = j.find("result");
  if (function == j.end() || !function->is_string() || store == j.end() || args == j.end() ||
      !args->is_array() || result == j.end()) {
    return InvalidArgument("task needs a string 'function', 'store', an array 'args' and 'result'");
  }
  SerializedTask task;
  task.function = function->get<std::string>();
  XSILO_ASSIGN_OR_RETURN(task.store, StoreConfig::FromJson(store->dump()));
  XSILO_ASSIGN_OR_RETURN(task.result, Key::FromJson(result->dump()));
  for (const json& a : *args) {
    Argument arg;
    auto key = a.is_object() ? a.find("key") : a.end();
    auto value = a.is_object() ? a.find("value") : a.end();
    if (key != a.end()) {
      XSILO_ASSIGN_OR_RETURN(arg.key, Key::FromJson(key->dump()));
    } else if (value != a.end() && value->is_string()) {
      auto bytes = Base64Decode(value->get<std::string>());
      if (!bytes) return InvalidArgument("task argument 'value' is not base64");
      arg.value = Buffer::CopyFrom(bytes->data(), bytes->size());
    } else {
      return InvalidArgument("task argument needs a 'key' or a base64 'value'");
    }
    task.arguments.push_back(std::move(arg));
  }
  return task;
}

Status SerializedTask::Run(const TaskRegistry& functions, StoreRegistry* stores) const {
  if (!stores) return InvalidArgument("task '" + function + "': null store registry");
  auto found = stores->GetOrCreate(store);
  if (!found.ok()) return found.status().WithContext("task '" + function + "'");
  Store& s = **found;

  // The stored arguments go before the outcome is written, so a submitter
  // that sees the outcome finds them gone.
  bool freed = false;
  auto write = [&](const GatherList& outcome) {
    if (!freed) {
      freed = true;
      for (const Argument& a : arguments) {
        if (a.key) (void)s.Evict(*a.key);
      }
    }
    return s.SetBytes(result, outcome);
  };

  bool delivered = false;
  Status delivery;
  Status task_status;
  std::shared_ptr<const detail::TaskRunner> runner = functions.Find(function);
  if (!runner) {
    task_status = NotFound("no function of this name is registered in the worker");
  } else {
    try {
      task_status = (*runner)(*this, s, [&](const GatherList& value) {
        GatherList outcome = value;
        outcome.Append(TagBuffer(kValueTag));
        delivered = true;
        delivery = write(outcome);
        return delivery;
      });
    } catch (const std::exception& e) {
      task_status = Internal(std::string("threw: ") + e.what());
    } catch (...) {
      task_status = Internal("threw a non-standard exception");
    }
  }
  if (delivered) {
    return delivery.ok() ? delivery : delivery.WithContext("task '" + function + "': result");
  }
  if (task_status.ok()) task_status = Internal("the function returned without a result");
  Status st = write(ErrorOutcome(task_status.WithContext("task '" + function + "'")));
  return st.ok() ? st : st.WithContext("task '" + function + "': writing its error");
}

std::shared_ptr<const detail::TaskRunner> TaskRegistry::Find(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = runners_.find(name);
  return it == runners_.end() ? nullptr : it->second;
}

namespace detail {

Result<RemoteOutcome> AwaitOutcome(Store& store, const SerializedTask& task,
                                   std::chrono::milliseconds timeout) {
  XSILO_RETURN_IF_ERROR(store.WaitForKey(task.result, timeout));
  XSILO_ASSIGN_OR_RETURN(std::optional<Buffer> bytes, store.GetBytes(task.result));
  if (!bytes) {
    return NotFound("task '" + task.function + "': its result key was evicted before it was read");
  }
  FreeTaskObjects(store, task);
  RemoteOutcome outcome;
  if (bytes->empty()) {
    outcome.task_status = Corrupt("task '" + task.function + "': the result key is empty");
    return outcome;
  }
  uint8_t tag = bytes->data()[bytes->size() - 1];
  Buffer body = bytes->SliceUnchecked(0, bytes->size() - 1);
  if (tag == kValueTag) {
    outcome.value = std::move(body);
  } else if (tag == kErrorTag) {
    outcome.task_status = ParseErrorOutcome(body, task.function);
  } else {
    outcome.task_status = Corrupt("task '" + task.function + "': the result key ends in no tag");
  }
  return outcome;
}

void FreeTaskObjects(Store& store, const SerializedTask& task) {
  for (const SerializedTask::Argument& a : task.arguments) {
    if (a.key) (void)store.Evict(*a.key);
  }
  (void)store.Evict(task.result);
}

}  // namespace detail

}  // namespace xsilo
