"""`pgdrain init [DIR]`, the real command in a process of its own, from a folder outside the
repository: it writes the scaffold's files as they are, beside whatever the folder already
holds, and never over a file that exists unless told to (--force): each such file is named, in
one line, exit 2, and nothing is written. (From the installed wheel, with sam and the function:
tests/acceptance/test_init_project.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.cli import EXIT_BAD_INPUT, EXIT_OK, ROOT, Run, only_line, run_pgdrain
from pgdrain.cli import init

SCAFFOLD = {f.path: f.source.read_bytes() for f in init.scaffold_files()}


def _init(cwd: Path, *args: str, path: str = str(ROOT / "handler")) -> Run:
    assert not cwd.resolve().is_relative_to(ROOT)
    run = run_pgdrain("init", *args, env={"PYTHONPATH": path}, cwd=cwd)
    assert "Traceback" not in run.err, run.err
    return run


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_init_writes_the_project_into_a_new_folder(tmp_path: Path) -> None:
    run = _init(tmp_path, "drain")
    assert run.code == EXIT_OK, run
    project = tmp_path / "drain"
    written = _files(project)
    # Run from a source tree, pgdrain was not installed from a wheel: none to copy.
    assert written == SCAFFOLD
    lines = run.out.splitlines()
    assert lines[0] == f"wrote drain: {', '.join(SCAFFOLD)}"
    assert lines[1].startswith("wheels/: pgdrain was not installed from a wheel file")
    assert "  cd drain" in lines
    assert "  pgdrain invoke -e infra/events/enqueue.json" in " ".join(lines)
    for event in ("schedule", "enqueue", "continue", "wake"):
        assert (project / "infra" / "events" / f"{event}.json").is_file()


INSTALL_PYYAML = "  pip install PyYAML    # invoke reads template.yaml (the [invoke] extra)"


@pytest.mark.parametrize("pyyaml", ["installed", "missing"])
def test_the_next_steps_install_pyyaml_before_invoke_only_where_it_is_missing(
    tmp_path: Path, pyyaml: str
) -> None:
    """A plain `pip install pgdrain` has no PyYAML, which `pgdrain invoke` needs: the steps say
    how to get it, before the step that needs it. Missing here: a `yaml` module first on the
    path that cannot be imported."""
    path = str(ROOT / "handler")
    if pyyaml == "missing":
        (tmp_path / "blocked").mkdir()
        (tmp_path / "blocked" / "yaml.py").write_text("raise ImportError('no PyYAML here')\n")
        path = f"{tmp_path / 'blocked'}:{path}"
    (tmp_path / "repo").mkdir()
    run = _init(tmp_path / "repo", path=path)
    assert run.code == EXIT_OK, run
    lines = run.out.splitlines()
    invoke = next(i for i, line in enumerate(lines) if "pgdrain invoke" in line)
    if pyyaml == "missing":
        assert lines[invoke - 1] == INSTALL_PYYAML
    else:
        assert INSTALL_PYYAML not in lines


def test_init_adds_the_project_beside_the_files_a_repository_already_has(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("print('the application')\n")
    (tmp_path / ".gitignore").write_text("*.pyc\n")
    run = _init(tmp_path)  # DIR defaults to the current folder
    assert run.code == EXIT_OK, run
    assert "cd " not in run.out
    written = _files(tmp_path)
    assert written.pop("src/app.py") == b"print('the application')\n"
    assert written.pop(".gitignore") == b"*.pyc\n"
    assert written == SCAFFOLD


def _a_users_project(tmp_path: Path) -> Path:
    project = tmp_path / "drain"
    (project / "handler").mkdir(parents=True)
    (project / "handler" / "jobs.py").write_text("# my jobs\n")
    (project / "README.md").write_text("# my project\n")
    return project


def test_init_never_overwrites_a_file_names_them_and_writes_nothing(tmp_path: Path) -> None:
    project = _a_users_project(tmp_path)
    run = _init(tmp_path, "drain")
    assert run.code == EXIT_BAD_INPUT, run
    assert only_line(run.err) == (
        "pgdrain: error: drain already has README.md, handler/jobs.py: nothing was written "
        "(--force overwrites these files)"
    )
    assert run.out == ""
    assert _files(project) == {"handler/jobs.py": b"# my jobs\n", "README.md": b"# my project\n"}


def test_control_with_force_the_users_files_are_overwritten(tmp_path: Path) -> None:
    """What the refusal above prevents: the same folder, --force."""
    project = _a_users_project(tmp_path)
    run = _init(tmp_path, "drain", "--force")
    assert run.code == EXIT_OK, run
    assert _files(project) == SCAFFOLD
    assert _init(tmp_path, "drain", "--force").code == EXIT_OK  # and again: the same files
    assert _files(project) == SCAFFOLD


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (
            lambda d: (d / "drain").write_text("a file\n"),
            "pgdrain: error: drain is not a directory",
        ),
        (
            lambda d: ((d / "drain").mkdir(), (d / "drain" / "infra").write_text("a file\n")),
            "pgdrain: error: drain/infra is a file, where the project has a folder: nothing "
            "was written",
        ),
    ],
    ids=["DIR is a file", "a folder of the project is a file"],
)
@pytest.mark.parametrize("force", [(), ("--force",)], ids=["", "--force"])
def test_a_path_taken_by_a_file_is_bad_input(
    tmp_path: Path, setup: object, message: str, force: tuple[str, ...]
) -> None:
    assert callable(setup)
    setup(tmp_path)
    before = _files(tmp_path)
    run = _init(tmp_path, "drain", *force)
    assert (run.code, only_line(run.err)) == (EXIT_BAD_INPUT, message)
    assert _files(tmp_path) == before
