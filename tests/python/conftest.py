"""pytest setup: the tests run in the project's environment .venv/, where `make test` installed
diffattn (pip install -e .), and import the helpers beside this file."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
