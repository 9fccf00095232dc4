# Only here because cffi_modules has no pyproject.toml spelling yet.
from setuptools import setup

setup(cffi_modules=["engine/_build.py:ffibuilder"])
