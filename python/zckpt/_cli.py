"""The console scripts `zckpt` and `zckpt-train`: run the programs shipped in the wheel.

exec replaces the Python process, so signals (Ctrl-C), exit codes and stdio are the
program's own."""
import os
import sys

_bin = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin")


def _exec(name):
    path = os.path.join(_bin, name)
    if not os.access(path, os.X_OK):
        sys.stderr.write(f"{name}: error: {path}: not installed with this zckpt package\n")
        sys.exit(1)
    os.execv(path, [name] + sys.argv[1:])


def zckpt():
    _exec("zckpt")


def zckpt_train():
    _exec("zckpt-train")
