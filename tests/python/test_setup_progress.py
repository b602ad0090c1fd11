"""setup.py shows the build's progress on the terminal pip runs in (pip hides a
build's output without -v) and still passes the build's output on to stdout."""
import importlib.util
import io
import os
import subprocess
import sys
import unittest
from contextlib import redirect_stdout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("deltacast_setup", os.path.join(ROOT, "setup.py"))
setup_py = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup_py)  # not __main__: defines, builds nothing


class FakeTty(io.StringIO):
    def fileno(self):
        raise OSError("not a real terminal")


class BuildStatusTest(unittest.TestCase):
    def test_ninja_and_make_lines_become_a_status(self):
        status = setup_py.BuildStatus(tty=FakeTty())
        line = status.line("[35/140] Building CXX object topology/x.cc.o\n", "building")
        self.assertIn("[35/140] 25%", line)
        self.assertIn("topology/x.cc.o", line)
        self.assertIn("38%", status.line("[ 38%] Building CXX object y.o\n", "building"))
        self.assertIn("configuring", status.line("-- Found zstd\n", "configuring"))

    def test_run_draws_on_the_terminal_and_passes_the_output_on(self):
        tty = FakeTty()
        status = setup_py.BuildStatus(tty=tty)
        out = io.StringIO()
        script = 'printf "[1/3] a.o\\n[2/3] b.o\\n[3/3] Linking _deltacast\\n"'
        with redirect_stdout(out):
            setup_py.run(["sh", "-c", script], status, "building")
        status.finish("deltacast: built")
        # Every line of the build reaches stdout (pip -v, and pip's report on failure).
        self.assertEqual(out.getvalue().splitlines(), ["[1/3] a.o", "[2/3] b.o",
                                                       "[3/3] Linking _deltacast"])
        drawn = tty.getvalue()
        self.assertTrue(drawn.startswith("\n"))  # below pip's own line
        self.assertIn("\r\x1b[Kdeltacast: building", drawn)
        self.assertTrue(drawn.endswith("deltacast: built \n"))
        # Redraws are rate-limited: three lines at once draw the first status only.
        self.assertNotIn("[3/3]", drawn)

    def test_a_failing_build_raises_and_says_so(self):
        tty = FakeTty()
        status = setup_py.BuildStatus(tty=tty)
        with redirect_stdout(io.StringIO()):
            with self.assertRaises(subprocess.CalledProcessError):
                setup_py.run(["sh", "-c", "echo '[1/2] x'; exit 3"], status, "building")
        self.assertIn("building failed", tty.getvalue())

    def test_without_a_terminal_nothing_is_drawn(self):
        status = setup_py.BuildStatus(tty=None)  # as when /dev/tty cannot be opened
        with redirect_stdout(io.StringIO()) as out:
            setup_py.run(["sh", "-c", "echo '[1/1] x'"], status, "building")
        status.finish("done")
        self.assertEqual(out.getvalue(), "[1/1] x\n")


if __name__ == "__main__":
    unittest.main()
