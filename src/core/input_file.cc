#include "chorus/core/input_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include <sys/stat.h>

#include "chorus/core/error.h"

namespace chorus {

std::string readInputFile(const std::string& path, const std::string& what) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0)
    CHORUS_THROW(ConfigError, "cannot read ", what, " '", path, "': ", std::strerror(errno));
  if (S_ISDIR(info.st_mode))
    CHORUS_THROW(ConfigError, "cannot read ", what, " '", path, "': it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) CHORUS_THROW(ConfigError, "cannot read ", what, " '", path, "': ", std::strerror(errno));
  // Read at most one byte past the limit: a device file such as /dev/zero never ends.
  std::string text;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxInputFileBytes)
      CHORUS_THROW(ConfigError, "cannot read ", what, " '", path, "': larger than ",
                   kMaxInputFileBytes >> 20, " MiB (not a ", what, ")");
  }
  if (in.bad()) CHORUS_THROW(ConfigError, "cannot read ", what, " '", path, "': read error");
  return text;
}

}  // namespace chorus
