#include <fstream>
#include <sstream>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "trisolve/swc.h"

namespace trisolve {

absl::StatusOr<Morphology> ParseSwc(const std::string& text, const std::string& origin) {
  Morphology m;
  std::unordered_map<int64_t, int32_t> index;  // SWC id -> node
  int64_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ":", line_no, ": ", why));
    };
    if (f.size() < 7) return bad("expected 7 fields: id type x y z radius parent");
    int64_t id, type, parent;
    double x, y, z, r;
    if (!absl::SimpleAtoi(f[0], &id) || !absl::SimpleAtoi(f[1], &type) ||
        !absl::SimpleAtod(f[2], &x) || !absl::SimpleAtod(f[3], &y) ||
        !absl::SimpleAtod(f[4], &z) || !absl::SimpleAtod(f[5], &r) ||
        !absl::SimpleAtoi(f[6], &parent))
      return bad("a field is not a number");
    if (index.count(id)) return bad(absl::StrCat("sample id ", id, " appears twice"));
    if (m.size() >= INT32_MAX) return bad("too many samples");
    int32_t p = -1;
    if (parent == -1) {
      if (m.size() > 0)
        return bad(absl::StrCat("sample ", id, " is a second root; one tree per file"));
    } else {
      auto it = index.find(parent);
      if (it == index.end())
        return bad(absl::StrCat("parent ", parent, " of sample ", id,
                                " does not come before it (every parent must come before its "
                                "children)"));
      p = it->second;
    }
    if (m.size() == 0 && parent != -1)
      return bad("the first sample must be the root (parent -1)");
    index[id] = static_cast<int32_t>(m.size());
    m.parent.push_back(p);
    m.type.push_back(static_cast<int32_t>(type));
    m.x.push_back(x);
    m.y.push_back(y);
    m.z.push_back(z);
    m.radius.push_back(r);
  }
  if (m.size() == 0) return absl::InvalidArgumentError(absl::StrCat(origin, ": no samples"));
  return m;
}

absl::StatusOr<Morphology> ReadSwc(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseSwc(ss.str(), path);
}

}  // namespace trisolve
