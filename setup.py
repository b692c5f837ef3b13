"""Build script: the C core is compiled by cffi (see native/build_ffi.py)."""

import os
import re

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


def read_version():
    with open(os.path.join(HERE, "mxprof", "_version.py"), encoding="utf-8") as f:
        return re.search(r'__version__ = "([^"]+)"', f.read()).group(1)


setup(
    version=read_version(),
    cffi_modules=["native/build_ffi.py:ffibuilder"],
)
