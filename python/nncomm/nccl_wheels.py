"""Where the nvidia-nccl wheels put NCCL.

``pip install nvidia-nccl-cu12`` (or ``-cu13``) installs ``libnccl.so.2``
under ``site-packages/nvidia/nccl/lib``, a directory the dynamic loader
does not search, so ``dlopen("libnccl.so.2")`` alone misses it. nncomm
tries these copies after the loader's own search, unless
``NNCOMM_NCCL_LIBRARY`` names the library.
"""
import os
import sys

_RELATIVE = os.path.join("nvidia", "nccl", "lib", "libnccl.so.2")


def libraries(path=None):
    """The wheels' copies of NCCL on the import path.

    Args:
        path (list of str): directories to look in; ``sys.path`` if None.

    Returns:
        list of str: each existing ``nvidia/nccl/lib/libnccl.so.2``, in
        the path's order, without repeats.

    Example:

        .. code-block:: python

            from nncomm import nccl_wheels
            print(nccl_wheels.libraries())
    """
    found = []
    for directory in sys.path if path is None else path:
        candidate = os.path.abspath(os.path.join(directory or ".", _RELATIVE))
        if os.path.isfile(candidate) and candidate not in found:
            found.append(candidate)
    return found
