// NCCL on the emulated CUDA device (TROUPE_CUDA_EMULATION): none. The library answers, and every
// communicator fails to form, so whatever would take NCCL is refused with NCCL's own error:
// members sharing the one emulated device go host-staged, as on a GPU that NCCL cannot share.
#include <nccl.h>

#include <cstring>

namespace {
constexpr ncclResult_t kNone = ncclSystemError;
}

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  return r == ncclSuccess ? "no error" : "NCCL is not there on the emulated CUDA device";
}
ncclResult_t ncclGetVersion(int* version) {
  *version = 0;
  return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof *id);
  return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int, ncclUniqueId, int, ncclConfig_t*) {
  *comm = nullptr;
  return kNone;
}
ncclResult_t ncclCommSplit(ncclComm_t, int, int, ncclComm_t* child, ncclConfig_t*) {
  *child = nullptr;
  return kNone;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* e) {
  *e = kNone;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommCount(const ncclComm_t, int*) { return kNone; }
ncclResult_t ncclCommUserRank(const ncclComm_t, int*) { return kNone; }
ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }
ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return kNone;
}
ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return kNone;
}
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                           cudaStream_t) {
  return kNone;
}
ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t) {
  return kNone;
}
ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
  return kNone;
}
ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                           cudaStream_t) {
  return kNone;
}

}  // extern "C"
