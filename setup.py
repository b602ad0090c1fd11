"""Builds deltacast's Python module with the project's CMake, for
`pip install --no-build-isolation .` (the module and libdeltacast.so go into the
package; the module finds the library beside itself)."""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.path.join(os.path.abspath(self.build_temp), "cmake")
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build, *generator,
                               "-DCMAKE_BUILD_TYPE=Release", "-DDELTACAST_BUILD_TESTS=OFF",
                               "-DDELTACAST_BUILD_BENCH=OFF", f"-DPython_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build, "--target", "_deltacast"])
        target = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        os.makedirs(target, exist_ok=True)
        for path in glob.glob(os.path.join(build, "python", "deltacast", "_deltacast*.so")) + \
                glob.glob(os.path.join(build, "api", "libdeltacast.so.?")):  # the SONAME
            shutil.copy2(path, target)


setup(
    packages=["deltacast"],
    package_dir={"deltacast": "python/deltacast"},
    package_data={"deltacast": ["py.typed", "__init__.pyi"]},
    ext_modules=[Extension("deltacast._deltacast", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
