"""The package as pip builds it: `pip wheel .` gives a wheel with the compiled core, every
module of the package (diffattn.torch and diffattn.gpu included), the `diffattn` command and
the version of CMakeLists.txt's project(); installed from that wheel into a directory of its
own (not the editable install the other tests use), it imports, runs an operator and the
command. The wheel builds in build/wheel (persistent: a rebuild is incremental)."""

import os
import re
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(diffattn[^)]*VERSION\s+([0-9.]+)", f.read()).group(1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ, CMAKE_GENERATOR="Unix Makefiles",
               CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                        "-q", "-w", str(out), "-C", "build-dir=build/wheel", "."],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    wheels = [f for f in os.listdir(out) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    return out / wheels[0]


def test_wheel_holds_the_package_and_the_command(wheel):
    v = project_version()
    assert os.path.basename(wheel).startswith(f"diffattn-{v}-cp")
    names = zipfile.ZipFile(wheel).namelist()
    for want in ["diffattn/__init__.py", "diffattn/torch/__init__.py", "diffattn/torch/ops.py",
                 "diffattn/torch/modules.py", f"diffattn-{v}.data/scripts/diffattn"]:
        assert want in names, want
    assert any(re.fullmatch(r"diffattn/_core\.cpython-.*\.so", n) for n in names)
    meta = zipfile.ZipFile(wheel).read(f"diffattn-{v}.dist-info/METADATA").decode()
    assert f"Version: {v}" in meta and "Requires-Dist: numpy" in meta


def test_installed_wheel_imports_and_runs(wheel, tmp_path):
    target = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    # -S: no site processing, so the editable install's import hook (a .pth file) stays out;
    # NumPy still comes from this environment's site-packages, after the wheel's directory
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]]))
    code = ("import numpy as np, diffattn\n"
            "assert diffattn.__file__.startswith(%r), diffattn.__file__\n"
            "q = np.ones((1, 3, 2, 4), np.float32); k = np.ones((1, 3, 2, 4), np.float32)\n"
            "v = np.ones((1, 3, 1, 8), np.float32); lam = np.full(1, 0.5, np.float32)\n"
            "print(diffattn.__version__, float(diffattn.diff_attention(q, k, v, lam)[0, 0, 0, 0]))\n"
            % str(target))
    r = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [project_version(), "0.5"]
    tool = target / "bin" / "diffattn"
    r = subprocess.run([str(tool), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"diffattn {project_version()}"
