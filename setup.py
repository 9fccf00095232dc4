# Here because cffi_modules has no pyproject.toml spelling yet, and for engine._hot, the hot
# calls as CPython methods (csrc/hot.c; it calls the cffi core through function pointers).
import importlib.util

from setuptools import Extension, setup

_spec = importlib.util.spec_from_file_location("_rl_build", "engine/_build.py")
_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_build)
_compile, _link = _build.flags()

setup(
    cffi_modules=["engine/_build.py:ffibuilder"],
    ext_modules=[Extension("engine._hot", ["csrc/hot.c"], include_dirs=["csrc"],
                           extra_compile_args=_compile, extra_link_args=_link)],
)
