// Reading MXNet node attributes.
#include "attrs.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <sstream>

namespace mxamp_onednn {

std::string text(const Node* n, const std::string& key, const std::string& fallback) {
  auto it = n->attrs.find(key);
  return it == n->attrs.end() ? fallback : it->second;
}

bool flag(const Node* n, const std::string& key, bool fallback) {
  std::string v = text(n, key);
  if (v.empty()) return fallback;
  return v == "True" || v == "true" || v == "1";
}

double number(const Node* n, const std::string& key, double fallback) {
  std::string v = text(n, key);
  if (v.empty() || v == "None") return fallback;
  try {
    return std::stod(v);
  } catch (const std::logic_error&) {  // invalid_argument, out_of_range
    throw std::invalid_argument("node " + n->name + ": attribute " + key + " = '" + v +
                                "' is not a number");
  }
}

Dims ints(const Node* n, const std::string& key) {
  const std::string s = text(n, key);
  Dims out;
  const char* at = s.c_str();  // read in place: a copy of the rest per number made long lists quadratic
  while (*at) {
    bool digit = std::isdigit(static_cast<unsigned char>(*at));
    bool minus = *at == '-' && std::isdigit(static_cast<unsigned char>(at[1]));
    if (digit || minus) {
      char* end;
      errno = 0;
      long long v = std::strtoll(at, &end, 10);
      if (errno == ERANGE)
        throw std::out_of_range("node " + n->name + ": attribute " + key + " holds a number out of range");
      out.push_back(v);
      at = end;
    } else {
      ++at;
    }
  }
  return out;
}

Dims pair(const Node* n, const std::string& key, Dims fallback) {
  Dims v = ints(n, key);
  return v.empty() ? fallback : v;
}

Range range_attr(const Node* n) {
  return {number(n, kAmaxAttr, 0), number(n, kMinAttr, 0)};
}

bool keeps_float(const Node* n) { return flag(n, "__mxamp_float__", false); }

std::vector<Range> parse_ranges(const std::string& s) {
  std::vector<Range> out;
  std::istringstream in(s);
  for (std::string item; std::getline(in, item, ';');) {
    Range r;
    size_t comma = item.find(',');
    if (comma != std::string::npos)
      r = {std::stod(item.substr(0, comma)), std::stod(item.substr(comma + 1))};
    out.push_back(r);
  }
  return out;
}

}  // namespace mxamp_onednn
