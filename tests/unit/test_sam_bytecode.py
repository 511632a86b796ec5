"""`make sam` compiles the build's bytecode, the way the Makefile's `sam` recipe says, so that a
function imports it instead of compiling every module at every cold start. The build reaches
Lambda as SAM zips it: each entry dated 1980-01-01 (zipfile.ZipInfo's default, which SAM keeps
so that its zips hash the same), so bytecode that records its source's timestamp (compileall's
default) no longer matches the unpacked source and is ignored; unchecked-hash bytecode is used
as it is. Told apart here by bytecode that no longer matches its source (of the same size, so
that only the timestamps can tell): the module says which one ran."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is not a package of the library
    sys.path.insert(0, str(ROOT))

from bench.common import make_sam_compileall_options  # noqa: E402


def _zipped_as_sam_does(source: Path, archive: Path) -> None:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(source.rglob("*")):
            if path.is_file():
                info = zipfile.ZipInfo(str(path.relative_to(source)))  # dated 1980-01-01
                info.external_attr = 0o755 << 16
                zf.writestr(info, path.read_bytes())


def _which_ran(build: Path, tmp_path: Path, compile_options: list[str]) -> str:
    package = build / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    module = package / "module.py"
    module.write_text('RAN = "compiled"\n')
    subprocess.run(
        [sys.executable, "-m", "compileall", *compile_options, str(build)],
        check=True,
        capture_output=True,
    )
    module.write_text('RAN = "original"\n')  # the bytecode's source is gone; same size
    archive = tmp_path / "function.zip"
    _zipped_as_sam_does(build, archive)
    unpacked = tmp_path / "var-task"
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            path = Path(zf.extract(info, unpacked))
            dated = time.mktime((*info.date_time, 0, 0, -1))
            os.utime(path, (dated, dated))  # as unzip leaves it
    env = dict(os.environ, PYTHONPATH=str(unpacked), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import pkg.module; print(pkg.module.RAN)"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def test_the_makefile_compiles_bytecode_for_the_functions_runtime() -> None:
    recipe = (ROOT / "Makefile").read_text().split("\nsam:", 1)[1].split("\n\n", 1)[0]
    runtime = "python3.12"  # template.yaml's Runtime: the bytecode is for that interpreter
    assert f"Runtime: {runtime}" in (ROOT / "template.yaml").read_text()
    assert f"{runtime} -m compileall" in recipe and ".aws-sam/build" in recipe


@pytest.mark.parametrize(
    ("options", "ran"),
    [(None, "compiled"), (["-q"], "original")],
    ids=["make sam's options", "control: compileall's default, timestamped"],
)
def test_the_bytecode_make_sam_compiles_is_used_after_sams_zip(
    tmp_path: Path, options: list[str] | None, ran: str
) -> None:
    compile_options = make_sam_compileall_options() if options is None else options
    assert _which_ran(tmp_path / "build", tmp_path, compile_options) == ran
