# The flight recorder (src/observability/flight_recorder.cpp) as the
# communicator sets it up and feeds it: the process's ranks and signal
# handlers at init(), the Python line of each call, dumps on request.
# python -m nncomm.flight reads the files.

cdef extern from "Python.h":
    ctypedef struct PyFrameObject:
        pass
    PyFrameObject* PyEval_GetFrame()
    # A new reference to a PyCodeObject, taken as any object.
    object PyFrame_GetCode "(PyObject*)PyFrame_GetCode" (PyFrameObject* f)
    int PyFrame_GetLineNumber(PyFrameObject* f)

cdef extern from *:
    """
    #include <frameobject.h>
    // The frame's last instruction: read directly, where finding its line
    // scans the code's line table.
    static int nncomm_frame_lasti(PyFrameObject *f) {
    #if PY_VERSION_HEX >= 0x030B0000
      return PyFrame_GetLasti(f);
    #else
      return f->f_lasti;
    #endif
    }
    """
    int frame_lasti "nncomm_frame_lasti" (PyFrameObject* f)

# The package's own files, whose frames are skipped: a call site is the
# user's line that called into nncomm.
cdef str _PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Code's address -> [code, whether it is nncomm's own, {instruction:
# site}], a site being "file:line in function" as bytes that are never
# freed: the recorders keep pointers into them. Keyed by address, which
# hashes at once (a code object's own hash reads all of it), the code kept
# alive so that its address is not reused; then by instruction, whose line
# is looked up once. Bounded, so that generated code cannot grow it for
# ever; past the bound, calls go without a site.
cdef dict _code_sites = {}
cdef Py_ssize_t _sites = 0
cdef Py_ssize_t _MAX_CALL_SITES = 10000


cdef const char* _call_site() except? NULL:
    """The innermost frame outside nncomm of this thread's Python stack, as
    an interned "file:line in function", or null."""
    global _sites
    cdef PyFrameObject* f = PyEval_GetFrame()
    cdef object frame = None  # keeps f alive once the walk leaves the top
    cdef list entry
    while f != NULL:
        code = PyFrame_GetCode(f)
        address = <Py_ssize_t><PyObject*>code
        entry = _code_sites.get(address)
        if entry is None:
            if _sites >= _MAX_CALL_SITES:
                return NULL
            entry = [code, code.co_filename.startswith(_PACKAGE_DIR), {}]
            _code_sites[address] = entry
            _sites += 1
        if not entry[1]:
            break
        frame = (<object><PyObject*>f).f_back
        if frame is None:
            return NULL
        f = <PyFrameObject*><PyObject*>frame
    if f == NULL:
        return NULL
    instruction = frame_lasti(f)
    cdef dict sites = entry[2]
    site = sites.get(instruction)
    if site is None:
        if _sites >= _MAX_CALL_SITES:
            return NULL
        site = (f"{code.co_filename}:{PyFrame_GetLineNumber(f)} in "
                f"{code.co_name}").encode("utf-8", "replace")
        sites[instruction] = site
        _sites += 1
    return <const char*>site


cdef inline int note_call_site() except -1:
    """Names the caller's line in the records of this thread's next
    operations (until end_call_site())."""
    FlightRecorder.set_call_site(_call_site())
    return 0


cdef inline void end_call_site() noexcept nogil:
    FlightRecorder.set_call_site(NULL)


cdef int flight_recorder_start(int world_rank, int world_size) except -1:
    """Names this process in its flight record and installs the dumps on
    signals; at init()."""
    FlightRecorder.set_process(world_rank, world_size)
    with nogil:
        FlightRecorder.install_signal_handlers()
    return 0


cdef int flight_recorder_name_job(_Group world) except -1:
    """Names the job in its ranks' flight records by a random number of
    world rank 0's, so that python -m nncomm.flight leaves out the files
    other jobs left in the same directory. Collective."""
    mine = np.frombuffer(os.urandom(8), np.int64).copy()
    everyone = np.zeros(len(world.ranks), np.int64)
    cdef int64_t[::1] send = mine
    cdef int64_t[::1] out = everyone
    cdef Status status
    with nogil:
        status = deref(world.core).allgather(&send[0], &out[0], 1,
                                              DType.kInt64)
    CHKSTATUS(status)
    FlightRecorder.set_job(<uint64_t>out[0])
    return 0


cdef object flight_record_dump(path):
    """Communicator.dump_flight_record's work."""
    if flight_recorder_entries() == 0:
        return None
    cdef string directory
    if path is not None:
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise TypeError(f"path must be a directory's path, not "
                            f"{type(path).__name__}")
        directory = os.fsencode(os.path.abspath(os.fsdecode(path)))
    cdef string written
    cdef string reason = b"requested (dump_flight_record)"
    cdef Status status
    with nogil:
        status = FlightRecorder.dump(directory, reason, &written)
    CHKSTATUS(status)
    return os.fsdecode(written)


def _set_flight_recording(bint on):
    """Turns the flight recorder's recording on or off in this process (for
    bench/callback_bench.py, which times both in one run); the rings keep
    what they hold."""
    FlightRecorder.set_recording(on)
