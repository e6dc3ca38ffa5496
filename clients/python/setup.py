"""Generates the gRPC stubs from quotad's protos while the package is built.

The protos are read from ``proto/`` beside this file when it exists (an
sdist carries them there), else from the repository's
``crates/quotad-proto/proto/``, or from the folder named by
``QUOTAD_PROTO_DIR``. The stubs land in ``quotad/v1/`` of the build, with
``.pyi`` type stubs. An editable install (``pip install -e``) imports the
package from ``src/``, so there they are generated into ``src/quotad/v1/``
(ignored by git), the one place such an install reads them from.

The runtime floors (``grpcio``, ``protobuf``) are static, in
``pyproject.toml``, matching the pinned ``grpcio-tools``: never whatever the
build machine happens to have.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PROTOS = ("quotad/v1/quota.proto", "quotad/v1/lease.proto")


def proto_root() -> Path:
    candidates = []
    if os.environ.get("QUOTAD_PROTO_DIR"):
        candidates.append(Path(os.environ["QUOTAD_PROTO_DIR"]))
    candidates += [HERE / "proto", HERE.parent.parent / "crates" / "quotad-proto" / "proto"]
    for root in candidates:
        if all((root / p).is_file() for p in PROTOS):
            return root
    raise RuntimeError(
        "quotad's protos not found: looked in "
        + ", ".join(str(c) for c in candidates)
        + " (set QUOTAD_PROTO_DIR to the folder holding quotad/v1/*.proto)"
    )


def generate(out: Path) -> None:
    from grpc_tools import protoc  # a build requirement (pyproject.toml)

    root = proto_root()
    include = Path(protoc.__file__).resolve().parent / "_proto"
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *PROTOS,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(PROTOS)} in {root}")
    (out / "quotad" / "v1" / "__init__.py").write_text(
        '"""gRPC stubs generated from quotad\'s protos when the package was built."""\n'
    )


class BuildWithStubs(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            # An editable install imports from src/: the stubs go there.
            generate(HERE / "src")
        else:
            generate(Path(self.build_lib))


class SdistWithProtos(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        root = proto_root()
        for p in PROTOS:
            target = Path(base_dir) / "proto" / p
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / p, target)


setup(
    cmdclass={"build_py": BuildWithStubs, "sdist": SdistWithProtos},
)
