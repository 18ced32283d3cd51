#include "s3/xml.h"

namespace xsilo::s3 {

std::string XmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string XmlUnescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out.push_back(s[i]);
      continue;
    }
    size_t semi = s.find(';', i);
    if (semi == std::string_view::npos || semi - i > 10) {
      out.push_back('&');
      continue;
    }
    std::string_view ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp") {
      out.push_back('&');
    } else if (ent == "lt") {
      out.push_back('<');
    } else if (ent == "gt") {
      out.push_back('>');
    } else if (ent == "quot") {
      out.push_back('"');
    } else if (ent == "apos") {
      out.push_back('\'');
    } else if (!ent.empty() && ent[0] == '#') {
      unsigned long cp = 0;
      try {
        cp = ent.size() > 1 && (ent[1] == 'x' || ent[1] == 'X')
                 ? std::stoul(std::string(ent.substr(2)), nullptr, 16)
                 : std::stoul(std::string(ent.substr(1)));
      } catch (...) {
        out.push_back('&');
        continue;
      }
      // UTF-8 encode.
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
      } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    } else {
      out.push_back('&');
      continue;
    }
    i = semi;
  }
  return out;
}

namespace {
// Finds the next <tag> or <tag ...> opening at or after pos; returns the
// position just past '>' and sets *open_at; npos if none.
size_t FindOpen(std::string_view doc, std::string_view tag, size_t pos, size_t* open_at) {
  while (true) {
    size_t p = doc.find('<', pos);
    if (p == std::string_view::npos) return p;
    if (doc.compare(p + 1, tag.size(), tag) == 0) {
      size_t after = p + 1 + tag.size();
      if (after < doc.size() && (doc[after] == '>' || doc[after] == ' ')) {
        size_t gt = doc.find('>', after);
        if (gt == std::string_view::npos) return gt;
        if (doc[gt - 1] == '/') {  // <tag/>: empty element
          *open_at = p;
          return gt + 1;
        }
        *open_at = p;
        return gt + 1;
      }
    }
    pos = p + 1;
  }
}
}  // namespace

void XmlForEach(std::string_view doc, std::string_view tag,
                const std::function<void(std::string_view inner)>& fn) {
  std::string close = "</" + std::string(tag) + ">";
  size_t pos = 0;
  while (true) {
    size_t open_at = 0;
    size_t start = FindOpen(doc, tag, pos, &open_at);
    if (start == std::string_view::npos) return;
    if (doc[start - 2] == '/') {
      fn(std::string_view());
      pos = start;
      continue;
    }
    size_t end = doc.find(close, start);
    if (end == std::string_view::npos) return;
    fn(doc.substr(start, end - start));
    pos = end + close.size();
  }
}

std::optional<std::string> XmlText(std::string_view doc, std::string_view tag) {
  std::optional<std::string> out;
  bool done = false;
  XmlForEach(doc, tag, [&](std::string_view inner) {
    if (done) return;
    done = true;
    out = XmlUnescape(inner);
  });
  return out;
}

}  // namespace xsilo::s3
