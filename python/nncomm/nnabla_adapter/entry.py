"""nnabla's own communicator entry points, answered by nncomm, so that a
script written for nnabla's NCCL communicator runs data-parallel with no
edit: ``nnabla.communicators.MultiProcessDataParallelCommunicator`` (and
every alias, in ``nnabla.communicator`` too) and
``nnabla.utils.communicator_util.create_communicator``.

``python -m nncomm script.py`` (what ``nncomm-run`` starts on every rank)
installs them before the script runs, as ``NNCOMM_NNABLA`` says:

- ``auto`` (the default): the factories return nnabla's communicator where
  nnabla has one for the context (nnabla-ext-cuda's NCCL communicator on a
  CUDA context), nncomm's where it has none (CPU contexts, CUDA contexts
  without nnabla-ext-cuda's communicator);
- ``nncomm``: nncomm's communicator for every context;
- ``off``: nnabla's names are left as they are.

In ``auto`` and ``nncomm``, ``create_communicator()`` makes a communicator
wherever the job has several ranks (nnabla's looks for Open MPI's
``OMPI_COMM_WORLD_SIZE`` only, so under any other launcher it returned
None and each rank trained alone).

nnabla is patched as it is imported: the modules are wrapped by an import
hook, so that installing costs nothing for scripts that never import them.
"""
import functools
import importlib.abc
import os
import sys
import warnings

from nncomm.launched import SeveralRanks, job_size

MODES = ("auto", "nncomm", "off")
# nnabla 1.39's factory names, the misspelt one included.
FACTORIES = ("MultiProcessDataParallelCommunicator",
             "MultiProcessDataParalellCommunicator",
             "MultiProcessCommunicator", "Comm", "Dist")
UTIL = "nnabla.utils.communicator_util"
MODULES = ("nnabla.communicator", "nnabla.communicators", UTIL)


def mode(environ=None):
    """``NNCOMM_NNABLA``'s value: ``auto`` (unset), ``nncomm`` or ``off``.

    Raises:
        ValueError: Any other value.
    """
    environ = os.environ if environ is None else environ
    value = environ.get("NNCOMM_NNABLA", "").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"NNCOMM_NNABLA={value!r}: expected one of "
                         f"{', '.join(MODES)}")
    return value


def install(environ=None):
    """Answers nnabla's entry points with nncomm's, as ``NNCOMM_NNABLA``
    says: in the modules already imported, and in those imported later.

    Returns:
        str: The mode installed.
    """
    how = mode(environ)
    if how == "off":
        return how
    for name in MODULES:
        if name in sys.modules:
            patch(sys.modules[name], how)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(how))
    return how


def patch(module, how):
    """Replaces nnabla's entry points in `module` (one of MODULES)."""
    if module.__name__ == UTIL:
        original = module.create_communicator
        if not getattr(original, "_nncomm", False):
            module.create_communicator = _create_communicator(module)
        return
    for name in FACTORIES:
        original = getattr(module, name, None)
        if original is not None and not getattr(original, "_nncomm", False):
            setattr(module, name, _factory(original, how))


def _factory(nnabla_factory, how):
    """nnabla's factory answered: nnabla's communicator where it has one
    for the context and `how` is auto, else nncomm's."""

    @functools.wraps(nnabla_factory)
    def factory(ctx):
        # nnabla has communicators for CUDA contexts only; asked for a CPU
        # one, it warns of Open MPI's dlopen issue on every rank, then
        # fails.
        if how == "auto" and not _cpu_only(ctx):
            try:
                return nnabla_factory(ctx)
            except RuntimeError:
                # "Any of [cudnn:float] could not be found in []": nnabla
                # has no communicator for this context.
                pass
        from nncomm.communicators import MultiProcessDataParallelCommunicator
        return MultiProcessDataParallelCommunicator(ctx)

    factory._nncomm = True
    return factory


def _cpu_only(ctx):
    """Whether every backend `ctx` names is the CPU's."""
    backends = getattr(ctx, "backend", None) or []
    return bool(backends) and all(str(b).startswith("cpu:")
                                  for b in backends)


def _create_communicator(util):
    """create_communicator, of nnabla.utils.communicator_util (`util`), for
    jobs of several ranks under any launcher."""

    def create_communicator(ignore_error=False, extension_module="cudnn",
                            type_config="float"):
        """nnabla's create_communicator, answered by nncomm: a
        communicator, initialized, wherever the job has several ranks (by
        its launcher's variables or by MPI); None on a single rank.

        Args:
            ignore_error (bool): Accepted and without effect: nnabla
                returns None where creating fails, but in a job of several
                ranks each would then train alone, so there any failure
                raises :obj:`nncomm.errors.DataParallelError`, naming the
                cause; on a single rank nothing is created.
            extension_module (str): The context's extension, as nnabla's
                ``get_extension_context`` takes it. Where it is not
                installed (nnabla's default, ``'cudnn'``, on a machine
                with nnabla's CPU extension only), the CPU's, with a
                warning on each rank that fell back: nnabla-examples call
                this with no
                arguments and set their own context, and no array can be
                on an extension that is not there.
            type_config (str): Its type configuration.

        Returns:
            The communicator, also from ``current_communicator()``, or
            None on a single rank.
        """
        util._current_communicator = None
        if job_size()[0] < 2:
            return None
        from nnabla.ext_utils import get_extension_context
        with SeveralRanks("create_communicator()"):
            try:
                context = get_extension_context(extension_module,
                                                type_config=type_config)
                missing = None
            except ImportError as e:
                missing = e
                context = get_extension_context("cpu",
                                                type_config=type_config)
            comm = util.C.MultiProcessCommunicator(context)
            comm.init()
        if missing is not None:
            warnings.warn(
                f"create_communicator(extension_module="
                f"{extension_module!r}): {missing}; the communicator takes "
                f"a CPU context", RuntimeWarning)
        util._current_communicator = comm
        return comm

    create_communicator._nncomm = True
    return create_communicator


class _Finder(importlib.abc.MetaPathFinder):
    """Finds MODULES as the other finders do, with a loader that patches
    each once it has run."""

    def __init__(self, how):
        self.how = how

    def find_spec(self, fullname, path, target=None):
        if fullname not in MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                spec.loader = _Patching(spec.loader, self.how)
                return spec
        return None


class _Patching(importlib.abc.Loader):
    """A module's loader, then patch()."""

    def __init__(self, loader, how):
        self.loader, self.how = loader, how

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        patch(module, self.how)

    def __getattr__(self, name):  # get_source, is_package, ...
        return getattr(self.loader, name)
