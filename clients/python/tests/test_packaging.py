"""Packaging, with real installs: a wheel's grpcio/protobuf floors are those of
the code its pinned grpcio-tools generates (not whatever the build machine has),
and ``pip install -e`` into a fresh venv generates the stubs it imports, which
work on exactly those floors. pip fetches what it needs from the package index
(setuptools and the pinned grpcio-tools to build, grpcio and protobuf to run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

from servers import REPO

PACKAGE = REPO / "clients" / "python"
ENV = {**os.environ, "QUOTAD_PROTO_DIR": str(REPO / "crates" / "quotad-proto" / "proto")}


def copy_of_the_package(tmp_path: Path) -> Path:
    """The package's source alone, as a checkout elsewhere would hold it (nothing
    built or generated in it, and this tree left untouched)."""
    target = tmp_path / "python"
    shutil.copytree(
        PACKAGE,
        target,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "v1", "__pycache__", "tests", "bench"),
    )
    return target


def run(*args: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], env=ENV, cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def generated_versions(quota_pb2: str, quota_pb2_grpc: str) -> tuple[str, str]:
    """The grpcio and protobuf versions generated code requires at least."""
    grpc_version = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", quota_pb2_grpc)
    gencode = re.search(
        r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),",
        quota_pb2,
    )
    assert grpc_version is not None and gencode is not None, "version checks in the stubs"
    return grpc_version.group(1), ".".join(gencode.groups())


def requires(metadata: str) -> dict[str, set[str]]:
    """Requires-Dist without extras: name -> its version specifiers."""
    out: dict[str, set[str]] = {}
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            m = re.match(r"Requires-Dist: ([A-Za-z0-9_.-]+)\s*\(?([^;)]*)", line)
            assert m is not None, line
            out[m.group(1).lower()] = {s.strip() for s in m.group(2).split(",") if s.strip()}
    return out


def test_a_wheels_grpcio_and_protobuf_floors_are_those_its_generated_code_needs(
    tmp_path: Path,
) -> None:
    source = copy_of_the_package(tmp_path)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", source)
    [wheel] = (tmp_path / "dist").glob("quotad-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        grpc_version, protobuf_version = generated_versions(
            z.read("quotad/v1/quota_pb2.py").decode(),
            z.read("quotad/v1/quota_pb2_grpc.py").decode(),
        )
        deps = requires(z.read(metadata).decode())
    major = int(protobuf_version.split(".")[0])
    assert deps["grpcio"] == {f">={grpc_version}"}, deps
    assert deps["protobuf"] == {f">={protobuf_version}", f"<{major + 1}"}, deps
    assert "quotad/v1/quota_pb2.pyi" in names and "quotad/py.typed" in names


def test_an_editable_install_into_a_fresh_venv_generates_the_stubs_and_runs_on_the_floors(
    tmp_path: Path,
) -> None:
    source = copy_of_the_package(tmp_path)
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    pip = (python, "-m", "pip", "--disable-pip-version-check", "-q")
    run(*pip, "install", "-e", source)
    stubs = source / "src" / "quotad" / "v1"
    assert (stubs / "quota_pb2.py").is_file(), "generated where the editable install imports"
    where = run(python, "-c", "import quotad.v1.quota_pb2 as m; print(m.__file__)", cwd=tmp_path)
    assert Path(where.strip()).resolve() == (stubs / "quota_pb2.py").resolve()

    # The oldest runtime the package admits runs its generated code.
    grpc_version, protobuf_version = generated_versions(
        (stubs / "quota_pb2.py").read_text(), (stubs / "quota_pb2_grpc.py").read_text()
    )
    run(*pip, "install", f"grpcio=={grpc_version}", f"protobuf=={protobuf_version}")
    check = (
        "import quotad, quotad.v1.quota_pb2_grpc, quotad.v1.lease_pb2_grpc;"
        "c = quotad.Client('http://127.0.0.1:1', deadline=0.05, on_unavailable='fail_open');"
        "print(c.check('k', 'login').reason.name); c.close()"
    )
    assert run(python, "-c", check, cwd=tmp_path).strip() == "FAIL_OPEN"
