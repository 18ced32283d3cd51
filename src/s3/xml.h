// Private: the little XML S3 needs. Writing escapes text; reading finds
// elements by name in the flat documents S3 exchanges (no namespaces
// resolution, no attributes, no DTDs).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace xsilo::s3 {

std::string XmlEscape(std::string_view s);
std::string XmlUnescape(std::string_view s);

// Inner text of the first <tag>...</tag> in `doc` (unescaped), if any.
std::optional<std::string> XmlText(std::string_view doc, std::string_view tag);
// Calls fn with the raw inner XML of every <tag>...</tag> in `doc`, in order.
void XmlForEach(std::string_view doc, std::string_view tag,
                const std::function<void(std::string_view inner)>& fn);

}  // namespace xsilo::s3
