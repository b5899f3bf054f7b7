"""What a CUDA context needs of this process, named piece by piece, so that
a script whose context computes on CUDA learns what to install, or where to
run, instead of failing inside a collective."""
import importlib


def missing_pieces():
    """The pieces a CUDA context needs that this process lacks.

    Returns:
        list of str: one sentence per missing piece; empty when none is.
    """
    missing = []
    try:
        importlib.import_module("nnabla_ext.cuda")
    except ImportError as e:
        missing.append(
            f"nnabla-ext-cuda, nnabla's CUDA extension (import "
            f"nnabla_ext.cuda: {e}; its 1.39 wheels need CUDA <= 12 with "
            f"cuDNN 8)")
    from nncomm import packing
    try:
        packing.device_count()
    except RuntimeError as e:
        missing.append(f"a CUDA GPU ({e})")
    return missing


def refusal(backends, missing):
    """Why a communicator cannot be made for a context computing on
    `backends` (a list of nnabla backend names, some not ``cpu``).

    Args:
        backends (list of str): The context's backends.
        missing (list of str): What :func:`missing_pieces` found, not empty.

    Returns:
        str: the message, naming every missing piece.
    """
    return (f"the context's backend {backends} computes on CUDA, and this "
            f"process lacks " + "; and ".join(missing) + ". On this machine "
            f"use a CPU context, as from get_extension_context('cpu')")
