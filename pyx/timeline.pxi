# The timeline (src/observability/timeline.cpp) as the communicator starts
# and stops it: each rank records into a part of its own beside the file
# asked for, and
# rank 0 merges the parts into that file (nncomm/timeline.py) when the
# timeline stops, once every rank has closed its part, or at exit, where the
# ranks no longer meet, after a bounded wait for the others' parts.


# Seconds rank 0 waits at exit for the other ranks' parts.
cdef double _EXIT_WAIT_SECONDS = 10.0

# (path, world rank, world size) while this process records a timeline.
cdef object _recording = None
cdef bint _exit_hooked = False


cdef int _check_recording_alike(_Group world) except -1:
    if not world.same_everywhere(_recording is not None,
                                 b"agreeing that a timeline records"):
        raise RuntimeError("a timeline is being recorded on some ranks "
                           "only; start and stop it on every rank")
    return 0


cdef int timeline_start(_Group world, path) except -1:
    """Communicator.start_timeline's work, on the world group."""
    global _recording, _exit_hooked
    path = os.path.abspath(os.fsdecode(path))
    _check_recording_alike(world)
    if _recording is not None:
        raise RuntimeError(f"a timeline is already being recorded, to "
                           f"{_recording[0]}; call stop_timeline() first")
    digest = hashlib.sha256(os.fsencode(path)).digest()
    if not world.same_everywhere(int.from_bytes(digest[:8], "little"),
                                 b"start_timeline: agreeing on the file"):
        raise ValueError(f"start_timeline: the ranks name different files "
                         f"(this one {path!r}); every rank must pass the "
                         f"same path")
    cdef int rank = deref(world.core).rank()
    cdef string part = os.fsencode(timeline_files.part_path(path, rank))
    cdef Status status
    # Times count from here on every rank alike.
    world.barrier()
    with nogil:
        status = Timeline.start(part, rank)
    if not world.same_everywhere(status.ok(), b"start_timeline: "
                                 b"agreeing that every rank started") or \
            not status.ok():
        if status.ok():
            with nogil:
                Timeline.stop()
            os.remove(part)
        CHKSTATUS(status)
        raise RuntimeError("the timeline could not be started on every "
                           "rank (see the other ranks' errors)")
    _recording = (path, rank, len(world.ranks))
    if not _exit_hooked:
        atexit.register(_stop_timeline_at_exit)
        _exit_hooked = True
    return 0


cdef object timeline_stop(_Group world):
    """Communicator.stop_timeline's work, on the world group: the merged
    file's path, or None when no timeline was being recorded."""
    global _recording
    _check_recording_alike(world)
    if _recording is None:
        return None
    path, rank, size = _recording
    _recording = None
    cdef Status stopped
    with nogil:
        stopped = Timeline.stop()
    world.barrier()  # every part is complete
    failure = None
    if rank == 0:
        try:
            timeline_files.merge_parts(path, size)
        except OSError as e:
            failure = e  # raised once the other ranks are released
    world.barrier()
    if failure is not None:
        raise failure
    CHKSTATUS(stopped)
    return path


def _stop_timeline_at_exit():
    global _recording
    if _recording is None:
        return
    path, rank, size = _recording
    _recording = None
    cdef Status stopped
    with nogil:
        stopped = Timeline.stop()
    if not stopped.ok():
        print(f"nncomm: {stopped.message().decode()}", file=sys.stderr)
    if rank == 0:
        timeline_files.merge_parts(path, size, _EXIT_WAIT_SECONDS)
