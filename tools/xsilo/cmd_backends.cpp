// `xsilo backends`: the backends of this build, and every option key they
// read, from the option tables the parsers use (docs/backend-options.md is
// this command's --keys --markdown output).
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "xsilo/hybrid/hybrid.h"
#include "xsilo/store/connector.h"
#include "xsilo/transport/registry.h"

namespace xsilo::cli {

namespace {

const char* TypeName(OptionType t) {
  switch (t) {
    case OptionType::kInt:
      return "integer";
    case OptionType::kU64:
      return "unsigned";
    case OptionType::kBytes:
      return "bytes";
    case OptionType::kMillis:
      return "ms";
    case OptionType::kMicros:
      return "µs";
    case OptionType::kSeconds:
      return "s";
    case OptionType::kFlag:
      return "flag";
    case OptionType::kString:
      return "text";
    case OptionType::kEnum:
      return "choice";
    case OptionType::kReal:
      return "real";
    case OptionType::kFraction:
      return "fraction";
  }
  return "";
}

// Who reads a table's keys, for the section headings.
std::string Scope(const OptionTable& t) {
  if (t.owner() == "grpc")
    return "`grpc`, `auto` and the grpc under `grpc+<connector>`, `auto+<connector>`";
  if (t.owner() == "mpi") return "`mpi-generic`, `mpi-buffer`";
  if (t.owner() == "compression") return "any backend (a decorator around the whole backend)";
  if (t.owner() == "faulty transport") return "`faulty(<transport>)`";
  if (t.owner() == "hybrid") return "`<transport>+<connector>` and `auto+<connector>`";
  const std::string_view suffix = " connector";
  if (t.owner().size() > suffix.size() &&
      t.owner().compare(t.owner().size() - suffix.size(), suffix.size(), suffix) == 0) {
    const std::string type = t.owner().substr(0, t.owner().size() - suffix.size());
    return "the `" + type + "` connector: `store.KEY` of `<transport>+" + type +
           "`, or the options of a ConnectorConfig of type `" + type + "`";
  }
  return "`" + t.owner() + "`";
}

std::vector<const OptionTable*> AllTables() {
  std::vector<const OptionTable*> tables = BackendOptionTables();
  tables.push_back(&HybridOptionTable());
  for (const OptionTable* t : ConnectorOptionTables()) tables.push_back(t);
  return tables;
}

std::string Markdown() {
  std::ostringstream out;
  out << "# Backend options\n\n"
         "Every key a backend reads from `TransportOptions::backend` (`--backend KEY=VALUE`\n"
         "of `xsilo fl run`, a job file's `backend.KEY`, `--backend-option` of `xsilo bench\n"
         "p2p`), one table per layer that reads it. This file is the output of\n"
         "`xsilo backends --keys --markdown`, made from the tables the parsers read their keys\n"
         "through, so it cannot drift from the code: ctest `repo.backend_options` fails when\n"
         "it differs. A key that no layer of the backend reads is refused, naming the layer\n"
         "it belongs to or the nearest valid key. A connector's keys (the `store.*` keys\n"
         "of a hybrid backend) follow the backends' (docs/store.md says what each\n"
         "connector does with them).\n";
  for (const OptionTable* t : AllTables()) {
    out << "\n## " << t->owner() << "\n\nRead by " << Scope(*t) << ".\n\n"
        << "| key | type | accepted | default | what it does |\n|---|---|---|---|---|\n";
    for (const auto& row : t->rows()) {
      out << "| `" << row.name << "` | " << TypeName(row.type) << " | "
          << OptionTable::Accepted(row) << " | "
          << (row.default_value.empty() ? std::string("-")
                                        : "`" + std::string(row.default_value) + "`")
          << " | " << row.doc << (row.secret ? " (a secret: never logged)" : "") << " |\n";
    }
  }
  return out.str();
}

}  // namespace

void AddBackendsCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("backends", "List the backends and every option key they read");
  struct Args {
    bool keys = false, markdown = false;
    std::string check;
  };
  auto args = std::make_shared<Args>();
  cmd->add_flag("--keys", args->keys, "every option key: type, range, default, doc");
  cmd->add_flag("--markdown", args->markdown, "with --keys: as docs/backend-options.md");
  cmd->add_option("--check", args->check,
                  "with --keys --markdown: exit 1 unless FILE holds exactly that output");
  cmd->callback([args] {
    if (!args->keys) {
      auto& reg = TransportRegistry::Global();
      for (const auto& name : reg.Names()) {
        Status viable = reg.Viable(name);
        std::cout << name << "  " << reg.Description(name)
                  << (viable.ok() ? "" : "  [unavailable: " + viable.message() + "]") << "\n";
      }
      std::cout << "\nand faulty(<backend>); option keys: xsilo backends --keys\n";
      return;
    }
    if (args->markdown) {
      const std::string text = Markdown();
      if (args->check.empty()) {
        std::cout << text;
        return;
      }
      std::ifstream in(args->check);
      std::stringstream have;
      have << in.rdbuf();
      if (!in || have.str() != text) {
        std::cerr << "xsilo backends: " << args->check
                  << " is not the current option tables; regenerate it with\n"
                  << "  xsilo backends --keys --markdown > " << args->check << "\n";
        throw CLI::RuntimeError(1);
      }
      return;
    }
    for (const OptionTable* t : AllTables()) {
      std::cout << t->owner() << ":\n";
      for (const auto& row : t->rows()) {
        std::cout << "  " << row.name << " (" << OptionTable::Accepted(row)
                  << (row.default_value.empty() ? std::string()
                                                : "; default " + std::string(row.default_value))
                  << ")\n      " << row.doc << "\n";
      }
    }
  });
}

}  // namespace xsilo::cli
