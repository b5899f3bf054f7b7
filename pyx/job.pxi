# The job a communicator joins: the settings every rank must share, the
# processes of the job (CNTK's workers), and what this process can do
# (BytePS's is_capable).

WorkerDescriptor = collections.namedtuple(
    "WorkerDescriptor", ["global_rank", "host_id"], module="nncomm")
WorkerDescriptor.__doc__ = """A process of the job, as CNTK's
``WorkerDescriptor``: ``global_rank``, its world rank, and ``host_id``, the
name of its host (``MPI_Get_processor_name``)."""

# Settings that change which MPI calls a collective makes (or, on a GPU,
# which transport and which steps): ranks that differ in them would match
# different calls.
cdef tuple _AGREED_SETTINGS = ("NNCOMM_CHUNK_BYTES", "NNCOMM_DIRECT_BYTES",
                               "NNCOMM_CHECK_CALLS", "NNCOMM_HIERARCHICAL",
                               "NNCOMM_GPU_TRANSPORT",
                               "NNCOMM_IPC_CHUNK_BYTES",
                               "NNCOMM_IPC_MIN_BYTES",
                               "NNCOMM_IPC_BUCKET_BYTES")


cdef int _agree_on_settings(_Group world) except -1:
    """Raises ValueError on every rank, naming the setting and which ranks
    have which value, unless all ranks run with the same settings."""
    cdef int64_t mine[8]
    mine[0] = chunk_bytes()
    mine[1] = direct_bytes()
    mine[2] = <int>check_calls()
    mine[3] = <int>hierarchical()
    mine[4] = <int>gpu_transport()
    mine[5] = ipc_chunk_bytes()
    mine[6] = ipc_min_bytes()
    mine[7] = ipc_bucket_bytes()
    n = len(world.ranks)
    everyone = np.zeros((n, len(_AGREED_SETTINGS)), np.int64)
    cdef int64_t[:, ::1] out = everyone
    cdef Status status
    with nogil:
        status = deref(world.core).allgather(mine, &out[0, 0], 8,
                                              DType.kInt64)
    CHKSTATUS(status)
    for k, name in enumerate(_AGREED_SETTINGS):
        values = everyone[:, k]
        if (values != values[0]).any():
            by_value = {}
            for r, v in enumerate(values.tolist()):
                by_value.setdefault(v, []).append(r)
            raise ValueError(
                f"{name} differs between ranks: "
                + "; ".join(f"{v} on ranks {rs}"
                            for v, rs in by_value.items())
                + "; every rank must run with the same value")
    return 0


cdef tuple _gather_workers(_Group world):
    """Every world rank's WorkerDescriptor: the host names, NUL-padded to
    MPI's longest, in one allgather."""
    cdef size_t width = -(-MPI.MAX_PROCESSOR_NAME // 8)
    mine = np.zeros(width, np.int64)
    name = MPI.Get_processor_name().encode()
    mine.view(np.uint8)[:len(name)] = np.frombuffer(name, np.uint8)
    everyone = np.zeros((len(world.ranks), width), np.int64)
    cdef int64_t[::1] send = mine
    cdef int64_t[:, ::1] out = everyone
    cdef Status status
    with nogil:
        status = deref(world.core).allgather(&send[0], &out[0, 0], width,
                                              DType.kInt64)
    CHKSTATUS(status)
    return tuple(WorkerDescriptor(r, row.tobytes().rstrip(b"\0").decode())
                 for r, row in enumerate(everyone))


def _engine_threads():
    """Whether MPI allows the engines' threads to call it."""
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


def _gpu_capable():
    """Whether this build has the CUDA kernels and sees a device."""
    try:
        return packing.device_count() > 0
    except RuntimeError:
        return False


cdef bint _nccl_candidates_named = False


cdef int name_nccl_candidates() except -1:
    """Has the NCCL loader's search go on to the nvidia-nccl wheels'
    copies: called before anything loads NCCL (a group's device path,
    opened at its first GPU collective, or is_capable), once."""
    global _nccl_candidates_named
    if not _nccl_candidates_named:
        add_nccl_candidates([f.encode() for f in nccl_wheels.libraries()])
        _nccl_candidates_named = True
    return 0


def _nccl_capable():
    """Whether a GPU group could take NCCL, as its device path decides
    when it opens (cuda_device_path.cu)."""
    cdef const NcclApi* api
    name_nccl_candidates()
    return _gpu_capable() and load_nccl(nccl_library(), &api).ok()


cdef dict _CAPABILITIES = {"gpu": _gpu_capable, "nccl": _nccl_capable,
                           "callback": _engine_threads,
                           "gradient_reducer": _engine_threads}
