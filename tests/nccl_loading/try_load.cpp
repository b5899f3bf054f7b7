// Loads NCCL through nncomm's loader from each path given (in one process),
// printing "loaded" or the loader's message per path. "-" loads without a
// path (the default search); "--candidate FILE" adds FILE to that search.
#include <cstdio>
#include <cstring>

#include "nncomm/transports/nccl_api.hpp"

int main(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--candidate") == 0 && i + 1 < argc) {
      nncomm::add_nccl_candidates({argv[++i]});
      continue;
    }
    const char *path = std::strcmp(argv[i], "-") == 0 ? "" : argv[i];
    const nncomm::NcclApi *api = nullptr;
    const nncomm::Status s = nncomm::load_nccl(path, &api);
    std::printf("%s\n", s.ok() ? "loaded" : s.message().c_str());
  }
  return 0;
}
