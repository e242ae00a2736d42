"""setuptools hooks that pyproject.toml cannot express.

1. Ship python/torch-arena-autostart.pth at the root of the wheel (site-packages), where site.py
   runs it at every interpreter start; it does nothing unless TORCH_ARENA is set.
2. Tag the wheel cp310-abi3: the package is pure Python plus a cdylib with no Python binding, so
   one wheel serves every CPython >= 3.10.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "torch-arena-autostart.pth"


class BuildPyWithPth(build_py):
    """build_py that also copies the autostart .pth next to the package."""

    def run(self):
        super().run()
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", PTH)
        self.copy_file(src, os.path.join(self.build_lib, PTH), preserve_mode=0)


setup(
    cmdclass={"build_py": BuildPyWithPth},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
