#include "nncomm/transports/nccl_api.hpp"

#include <dlfcn.h>

#include <mutex>
#include <vector>

namespace nncomm {

namespace {

template <typename Fn> bool bind(void *library, const char *name, Fn *fn) {
  *fn = reinterpret_cast<Fn>(dlsym(library, name));
  return *fn != nullptr;
}

// Guards the candidates and the loaded table.
std::mutex loader;

// Files tried after "libnccl.so.2" when no path is given.
std::vector<std::string> candidates;

// The first of `names` that the dynamic loader opens, its name in `*name`;
// null with every loader message in `*errors` if none.
void *open_first(const std::vector<std::string> &names, std::string *name,
                 std::string *errors) {
  for (const std::string &n : names) {
    if (void *library = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *name = n;
      return library;
    }
    *errors += (errors->empty() ? "" : "; ") + std::string(dlerror());
  }
  return nullptr;
}

Status load(const std::string &path, NcclApi *api) {
  std::vector<std::string> names{path};
  if (path.empty()) {
    names = {"libnccl.so.2"};
    names.insert(names.end(), candidates.begin(), candidates.end());
  }
  std::string name, errors;
  void *library = open_first(names, &name, &errors);
  if (library == nullptr) {
    return Status::RuntimeError(
        "NCCL could not be loaded (" + errors +
        "); install it (pip install nvidia-nccl-cu12 or nvidia-nccl-cu13) or "
        "use NNCOMM_GPU_TRANSPORT=mpi");
  }
  const struct {
    const char *name;
    bool bound;
  } symbols[] = {
      {"ncclGetVersion", bind(library, "ncclGetVersion", &api->GetVersion)},
      {"ncclGetErrorString",
       bind(library, "ncclGetErrorString", &api->GetErrorString)},
      {"ncclGetUniqueId", bind(library, "ncclGetUniqueId", &api->GetUniqueId)},
      {"ncclCommInitRank",
       bind(library, "ncclCommInitRank", &api->CommInitRank)},
      {"ncclCommDestroy", bind(library, "ncclCommDestroy", &api->CommDestroy)},
      {"ncclCommAbort", bind(library, "ncclCommAbort", &api->CommAbort)},
      {"ncclCommGetAsyncError",
       bind(library, "ncclCommGetAsyncError", &api->CommGetAsyncError)},
      {"ncclRedOpCreatePreMulSum",
       bind(library, "ncclRedOpCreatePreMulSum", &api->RedOpCreatePreMulSum)},
      {"ncclRedOpDestroy",
       bind(library, "ncclRedOpDestroy", &api->RedOpDestroy)},
      {"ncclAllReduce", bind(library, "ncclAllReduce", &api->AllReduce)},
      {"ncclReduce", bind(library, "ncclReduce", &api->Reduce)},
      {"ncclBroadcast", bind(library, "ncclBroadcast", &api->Broadcast)},
      {"ncclAllGather", bind(library, "ncclAllGather", &api->AllGather)},
      {"ncclReduceScatter",
       bind(library, "ncclReduceScatter", &api->ReduceScatter)},
      {"ncclGroupStart", bind(library, "ncclGroupStart", &api->GroupStart)},
      {"ncclGroupEnd", bind(library, "ncclGroupEnd", &api->GroupEnd)},
      {"ncclSend", bind(library, "ncclSend", &api->Send)},
      {"ncclRecv", bind(library, "ncclRecv", &api->Recv)},
  };
  for (const auto &s : symbols) {
    if (!s.bound) {
      return Status::RuntimeError(name + " has no " + s.name +
                                  "; nncomm needs NCCL 2.11 or newer");
    }
  }
  int version = 0;
  if (api->GetVersion(&version) != nccl::kSuccess || version < 21100) {
    return Status::RuntimeError(name + " is NCCL version " +
                                std::to_string(version) +
                                "; nncomm needs 2.11 or newer");
  }
  return Status::Ok();
}

} // namespace

void add_nccl_candidates(const std::vector<std::string> &files) {
  std::lock_guard<std::mutex> lock(loader);
  candidates.insert(candidates.end(), files.begin(), files.end());
}

Status load_nccl(const std::string &path, const NcclApi **api) {
  static NcclApi loaded;
  static std::string loaded_path;
  static bool ok = false;
  std::lock_guard<std::mutex> lock(loader);
  if (ok && path != loaded_path) {
    return Status::RuntimeError("NCCL was loaded from '" + loaded_path +
                                "' already; cannot load '" + path + "' too");
  }
  if (!ok) {
    NNCOMM_RETURN_IF_ERROR(load(path, &loaded));
    ok = true;
    loaded_path = path;
  }
  *api = &loaded;
  return Status::Ok();
}

} // namespace nncomm
