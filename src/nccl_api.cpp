#include "nncomm/nccl_api.hpp"

#include <dlfcn.h>

#include <mutex>

namespace nncomm {

namespace {

template <typename Fn> bool bind(void *library, const char *name, Fn *fn) {
  *fn = reinterpret_cast<Fn>(dlsym(library, name));
  return *fn != nullptr;
}

Status load(const std::string &path, NcclApi *api) {
  const std::string name = path.empty() ? "libnccl.so.2" : path;
  void *library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    return Status::RuntimeError(
        "NCCL could not be loaded (" + std::string(dlerror()) +
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

Status load_nccl(const std::string &path, const NcclApi **api) {
  static std::mutex mutex;
  static NcclApi loaded;
  static std::string loaded_path;
  static bool ok = false;
  std::lock_guard<std::mutex> lock(mutex);
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
