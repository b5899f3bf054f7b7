// Loads NCCL through nncomm's loader from each path given (in one process),
// printing "loaded" or the loader's message per path.
#include <cstdio>

#include "nncomm/nccl_api.hpp"

int main(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) {
    const nncomm::NcclApi *api = nullptr;
    const nncomm::Status s = nncomm::load_nccl(argv[i], &api);
    std::printf("%s\n", s.ok() ? "loaded" : s.message().c_str());
  }
  return 0;
}
