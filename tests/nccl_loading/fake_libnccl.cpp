// A stand-in libnccl.so.2 for the loader's tests: the symbols nncomm binds,
// doing nothing, with the version given by -DVERSION; -DWITHOUT_PREMULSUM
// leaves out ncclRedOpCreatePreMulSum, as NCCL before 2.11 does.
#include <cstddef>

extern "C" {
int ncclGetVersion(int *v) {
  *v = VERSION;
  return 0;
}
const char *ncclGetErrorString(int) { return "fake"; }
int ncclGetUniqueId(void *) { return 0; }
int ncclCommInitRank(void *, int, ...) { return 0; }
int ncclCommDestroy(void *) { return 0; }
int ncclCommAbort(void *) { return 0; }
int ncclCommGetAsyncError(void *, int *) { return 0; }
#ifndef WITHOUT_PREMULSUM
int ncclRedOpCreatePreMulSum(void *, void *, int, int, void *) { return 0; }
#endif
int ncclRedOpDestroy(int, void *) { return 0; }
int ncclAllReduce(...) { return 0; }
int ncclReduce(...) { return 0; }
int ncclBroadcast(...) { return 0; }
int ncclAllGather(...) { return 0; }
int ncclReduceScatter(...) { return 0; }
int ncclGroupStart() { return 0; }
int ncclGroupEnd() { return 0; }
int ncclSend(...) { return 0; }
int ncclRecv(...) { return 0; }
}
