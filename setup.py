"""Builds deltacast's Python module with the project's CMake, for
`pip install --no-build-isolation .` (the module and libdeltacast.so go into the
package; the module finds the library beside itself).

The build takes minutes and pip shows a build's own output only with -v, so the
build's progress (ninja's [done/total] count) is also drawn on the terminal pip runs
in, one line updated in place, when there is one (/dev/tty). The build's output
still goes to stdout: pip shows it with -v, and on failure."""
import glob
import os
import re
import shutil
import subprocess
import sys
import time

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))

# "[12/140] Building CXX object ..." (ninja), "[ 12%] Building ..." (make).
_NINJA = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)")
_MAKE = re.compile(r"^\[\s*(\d+)%\]\s*(.*)")


class BuildStatus:
    """One line on the controlling terminal saying how far the build is; nothing
    when there is no terminal (CI, a pipe). Redrawn at most every 0.2 s."""

    def __init__(self, tty="auto"):
        """tty: a file to draw on, None for none, "auto" for /dev/tty if it opens."""
        self.start = time.monotonic()
        self.last = 0.0
        self.tty = tty
        if tty == "auto":
            try:
                self.tty = open("/dev/tty", "w")
            except OSError:
                self.tty = None
        self.width = 80
        if self.tty is not None:
            try:
                columns = os.get_terminal_size(self.tty.fileno()).columns
                if columns >= 20:  # 0: a terminal that does not say
                    self.width = columns
            except OSError:
                pass
            self.tty.write("\n")  # below pip's "Building wheel ..." line

    def elapsed(self):
        s = int(time.monotonic() - self.start)
        return f"{s // 60}m{s % 60:02d}s"

    def line(self, output_line, phase):
        """The status for one line of the build's output."""
        m = _NINJA.match(output_line)
        if m:
            done, total = int(m.group(1)), int(m.group(2))
            what = m.group(3).strip()
            return (f"deltacast: {phase} [{done}/{total}] {100 * done // max(total, 1)}% "
                    f"{self.elapsed()}  {what}")
        m = _MAKE.match(output_line)
        if m:
            return f"deltacast: {phase} {m.group(1)}% {self.elapsed()}  {m.group(2).strip()}"
        return f"deltacast: {phase} {self.elapsed()}"

    def show(self, text, force=False):
        if self.tty is None:
            return
        now = time.monotonic()
        if not force and now - self.last < 0.2:
            return
        self.last = now
        # A blank last column: pip's spinner backs up one column and draws there.
        self.tty.write("\r\x1b[K" + text[: self.width - 2] + " ")
        self.tty.flush()

    def finish(self, text):
        if self.tty is None:
            return
        self.show(text, force=True)
        self.tty.write("\n")
        self.tty.flush()


def run(command, status, phase):
    """Runs `command`, passing its output on to stdout and its progress to `status`."""
    status.show(f"deltacast: {phase} {status.elapsed()}", force=True)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace", bufsize=1)
    for line in process.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        status.show(status.line(line, phase))
    if process.wait() != 0:
        status.finish(f"deltacast: {phase} failed after {status.elapsed()} "
                      "(pip prints the build's output; -v shows it as it runs)")
        raise subprocess.CalledProcessError(process.returncode, command)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.path.join(os.path.abspath(self.build_temp), "cmake")
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        status = BuildStatus()
        run(["cmake", "-S", ROOT, "-B", build, *generator, "-DCMAKE_BUILD_TYPE=Release",
             "-DDELTACAST_BUILD_TESTS=OFF", "-DDELTACAST_BUILD_BENCH=OFF",
             f"-DPython_EXECUTABLE={sys.executable}"], status, "configuring")
        run(["cmake", "--build", build, "--target", "_deltacast"], status, "building")
        status.finish(f"deltacast: built in {status.elapsed()}")
        target = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        os.makedirs(target, exist_ok=True)
        for path in glob.glob(os.path.join(build, "python", "deltacast", "_deltacast*.so")) + \
                glob.glob(os.path.join(build, "api", "libdeltacast.so.?")):  # the SONAME
            shutil.copy2(path, target)


if __name__ == "__main__":
    setup(
        packages=["deltacast"],
        package_dir={"deltacast": "python/deltacast"},
        package_data={"deltacast": ["py.typed", "__init__.pyi"]},
        ext_modules=[Extension("deltacast._deltacast", sources=[])],
        cmdclass={"build_ext": CMakeBuild},
    )
