"""pytest setup: the tests run in the project's environment .venv/, where `make test` installed
diffattn (pip install -e .), and import the helpers beside this file."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# diffattn.gpu's Triton kernels run on CPU tensors under Triton's interpreter where no NVIDIA GPU
# is visible; @triton.jit reads the variable when a kernel is defined, so it is set here, before
# any test imports triton.
if "TRITON_INTERPRET" not in os.environ and not os.path.exists("/dev/nvidiactl"):
    os.environ["TRITON_INTERPRET"] = "1"
