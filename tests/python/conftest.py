"""pytest setup: the tests import the built module (PYTHONPATH=build/python, as the Makefile
sets it) and the helpers beside this file."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD_PY = os.path.join(ROOT, "build", "python")
if BUILD_PY not in sys.path and os.path.isdir(BUILD_PY):
    sys.path.append(BUILD_PY)

# diffattn.gpu's Triton kernels run on CPU tensors under Triton's interpreter where no NVIDIA GPU
# is visible; @triton.jit reads the variable when a kernel is defined, so it is set here, before
# any test imports triton.
if "TRITON_INTERPRET" not in os.environ and not os.path.exists("/dev/nvidiactl"):
    os.environ["TRITON_INTERPRET"] = "1"
