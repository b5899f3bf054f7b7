# The flight recorder (src/observability/flight_recorder.cpp) as the
# communicator sets it up and feeds it: the process's ranks and signal
# handlers at init(), the Python line of each call, dumps on request.
# python -m nncomm.flight reads the files.

cdef extern from "Python.h":
    ctypedef struct PyFrameObject:
        pass
    PyFrameObject* PyEval_GetFrame()

# The package's own files, whose frames are skipped: a call site is the
# user's line that called into nncomm.
cdef str _PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# (code, line) -> "file:line in function", as bytes that are never freed:
# the recorders keep pointers into them. Bounded, so that generated code
# cannot grow it for ever; past the bound, calls go without a site.
cdef dict _call_sites = {}
cdef dict _internal_code = {}  # code -> whether it is nncomm's own
cdef Py_ssize_t _MAX_CALL_SITES = 10000


cdef const char* _call_site() except? NULL:
    """The innermost frame outside nncomm of this thread's Python stack, as
    an interned "file:line in function", or null."""
    cdef PyFrameObject* top = PyEval_GetFrame()
    if top == NULL:
        return NULL
    frame = <object><PyObject*>top
    while frame is not None:
        code = frame.f_code
        internal = _internal_code.get(code)
        if internal is None:
            internal = code.co_filename.startswith(_PACKAGE_DIR)
            if len(_internal_code) < _MAX_CALL_SITES:
                _internal_code[code] = internal
        if not internal:
            break
        frame = frame.f_back
    if frame is None:
        return NULL
    line = frame.f_lineno
    key = (code, line)
    site = _call_sites.get(key)
    if site is None:
        if len(_call_sites) >= _MAX_CALL_SITES:
            return NULL
        site = f"{code.co_filename}:{line} in {code.co_name}".encode(
            "utf-8", "replace")
        _call_sites[key] = site
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
