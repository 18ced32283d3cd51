// Secrets (keys, passwords, tokens) read from files, so that they need not
// be on a command line (where `ps` shows them) or in a config that travels.
#pragma once

#include <string>
#include <string_view>

#include "xsilo/core/status.h"

namespace xsilo {

// The secret in the file at `path`: its text without trailing whitespace.
// InvalidArgument (naming the path, never the content) when the file cannot
// be read, is empty, or can be read by its group or others (chmod 600).
Result<std::string> ReadSecretFile(const std::string& path);

// Whether a == b, in time that depends on their lengths only, never on where
// they differ: for tokens, signatures and MACs. The length is not secret
// (a token's or a hex signature's is public).
bool SecretEquals(std::string_view a, std::string_view b);

}  // namespace xsilo
