"""A team's first day, from the wheel alone (no clone): pgdrain installed from its wheel into a
fresh virtualenv, `pgdrain init` writes a project into a folder outside this repository, and
from there `sam validate --lint`, `sam build`, `pgdrain invoke -e <event>` and a drain of the
team's own job all work; so does docs/deploy.md's Tracer recipe. The SAM part is skipped, with
the reason, only where the SAM CLI or a python3.12 is missing (CI installs both: `make sam`)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.cli import count_jobs, only_line
from helpers.sam_cli import NO_RUNTIME_PYTHON, NOT_INSTALLED, sam_cli, with_runtime_python
from helpers.wheel import (
    PIP_TIMEOUT_SECONDS,
    ROOT,
    Finished,
    Installed,
    install_wheel,
    outside_the_repository,
    run_checked,
)

pytestmark = pytest.mark.packaging

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
GUIDE = ROOT / "docs" / "deploy.md"


@pytest.fixture(scope="module")
def installed(pgdrain_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel, with the [invoke] extra `pgdrain invoke` needs, in a fresh virtualenv."""
    home = outside_the_repository(tmp_path_factory.mktemp("team"))
    return install_wheel(pgdrain_wheel, home, extras="invoke")


@pytest.fixture(scope="module")
def initialised(installed: Installed) -> tuple[Path, Finished]:
    """`pgdrain init drain`, from the team's repository (the virtualenv's workdir)."""
    done = installed.run("init", "drain", env=installed.environment())
    return installed.workdir / "drain", done


@pytest.fixture
def project(initialised: tuple[Path, Finished]) -> Path:
    folder, done = initialised
    assert done.code == 0, done.err
    return folder


def _local(url: str) -> str:
    """The test server has no TLS, which the template's PGSSLMODE requires: the URL's sslmode
    wins, as it would in the function."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["sslmode"] = "prefer"
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


def test_init_writes_the_project_with_the_wheel_pgdrain_came_from(
    initialised: tuple[Path, Finished], pgdrain_wheel: Path
) -> None:
    folder, done = initialised
    assert done.code == 0, done.err
    assert done.err == ""
    lines = done.out.splitlines()
    assert lines[0].startswith("wrote drain: README.md, template.yaml, handler/app.py,")
    assert lines[0].endswith(f", wheels/{pgdrain_wheel.name}")
    assert lines[1] == "next (drain/README.md says more):"  # no line on a missing wheel
    assert (folder / "wheels" / pgdrain_wheel.name).read_bytes() == pgdrain_wheel.read_bytes()
    requirements = (folder / "handler" / "requirements.txt").read_text()
    assert f"\npgdrain=={VERSION}\n" in requirements
    assert (folder / "template.yaml").read_bytes() == (ROOT / "template.yaml").read_bytes()


def test_the_pgdrain_command_says_where_the_projects_jobs_module_is(
    installed: Installed, project: Path, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """From the project's folder, handler/jobs.py is not on the path until PYTHONPATH says so:
    the error says where it is, and nothing is written."""
    env = installed.environment(db_url)
    done = installed.run("enqueue", "hello", env=env, cwd=project)
    assert done.code == 2
    assert only_line(done.err) == (
        "pgdrain: error: PGDRAIN_JOBS: module 'jobs' was not found on the Python path (which "
        "holds the current directory when run by the pgdrain command); --unregistered enqueues "
        "without it; handler/jobs.py is here: export PYTHONPATH=handler"
    )
    assert count_jobs(conn) == 0


def _readme_commands(project: Path) -> tuple[dict[str, str], list[list[str]]]:
    """The project README's "Try it here": the variables it exports, and its commands."""
    text = (project / "README.md").read_text()
    section = text.split("\n## Try it here\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    lines = [shlex.split(line, comments=True) for line in block.splitlines()]
    exports = dict(w[1].split("=", 1) for w in lines if w and w[0] == "export")
    return exports, [w for w in lines if w and w[0] != "export"]


def test_the_projects_readme_drains_the_teams_own_job(
    installed: Installed, project: Path, empty_db_url: str
) -> None:
    """The project's README, as written (its development database is the test's): migrate,
    enqueue its job, invoke the function with a kick."""
    exports, commands = _readme_commands(project)
    assert set(exports) == {"DATABASE_URL", "PYTHONPATH"}
    env = installed.environment(_local(empty_db_url), PYTHONPATH=exports["PYTHONPATH"])
    outputs = []
    for command in commands:
        assert command[0] == "pgdrain", command
        done = installed.run(*command[1:], env=env, cwd=project)
        assert done.code == 0, f"{command}: {done.err}"
        outputs.append(done)
    assert outputs[0].out.startswith("applied: 0001_")
    kicked = outputs[-1]
    assert commands[-1][1:] == ["invoke", "-e", "infra/events/enqueue.json"]
    assert '"ok": true' in kicked.out and '"done": 1,' in kicked.out, kicked.out
    assert "hello, world" in kicked.err.splitlines()  # the job printed it, in the function

    scheduled = installed.run("invoke", "-e", "infra/events/schedule.json", env=env, cwd=project)
    assert scheduled.code == 0, scheduled.err
    assert '"trigger": "schedule"' in scheduled.out and '"claimed": 0,' in scheduled.out
    with psycopg.connect(empty_db_url) as conn:
        rows = conn.execute("SELECT kind, status, attempts FROM pgdrain.jobs").fetchall()
    assert rows == [("hello", "done", 1)]


def test_invoke_outside_a_project_says_what_it_needs(installed: Installed, db_url: str) -> None:
    done = installed.run("invoke", env=installed.environment(db_url))
    assert done.code == 2
    assert only_line(done.err) == (
        "pgdrain: error: no template template.yaml: run `pgdrain invoke` in the folder of a SAM "
        "project (`pgdrain init` writes one), or name its template with --template"
    )


def _sam(sam: Path, args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(sam), *args],
        cwd=cwd,
        env={**env, "SAM_CLI_TELEMETRY": "0"},
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_SECONDS,
        check=False,
    )
    assert done.returncode == 0, f"sam {args}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_sam_validates_and_builds_the_project(
    installed: Installed, project: Path, pgdrain_wheel: Path
) -> None:
    """What `sam build` puts in the function: the project's handler/ (app.py, jobs.py) and the
    pinned requirements, pgdrain from the wheel init copied, psycopg for arm64."""
    sam = sam_cli()
    if sam is None:
        pytest.skip(NOT_INSTALLED)
    env = with_runtime_python(installed.environment())
    if env is None:
        pytest.skip(NO_RUNTIME_PYTHON)
    said = _sam(sam, ["validate", "--lint", "--region", "us-east-1"], project, env)
    assert "is a valid SAM Template" in said
    _sam(sam, ["build"], project, env)

    built = project / ".aws-sam" / "build" / "DrainFunction"
    assert (built / "app.py").read_bytes() == (project / "handler" / "app.py").read_bytes()
    assert (built / "jobs.py").read_bytes() == (project / "handler" / "jobs.py").read_bytes()
    assert (built / f"pgdrain-{VERSION}.dist-info").is_dir()
    with zipfile.ZipFile(pgdrain_wheel) as wheel:
        assert (built / "pgdrain" / "cli" / "init.py").read_bytes() == wheel.read(
            "pgdrain/cli/init.py"
        )
    assert list((built / "psycopg_binary").glob("_psycopg.cpython-312-aarch64-linux-gnu.so"))
    assert not (built / "wheels").exists()  # only handler/ is the function's code


def _tracer_recipe() -> tuple[str, str]:
    """docs/deploy.md's Tracer recipe: the requirement line, and the lines for jobs.py."""
    section = GUIDE.read_text().split("### Traces per job: Powertools Tracer", 1)[1]
    section = section.split("\n## ", 1)[0]
    (requirement,) = re.findall(r"```text\n(.*?)\n```", section, flags=re.DOTALL)
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    return requirement, code


def test_the_documented_tracer_recipe_makes_tracer_work(
    installed: Installed, project: Path, db_url: str, tmp_path: Path
) -> None:
    requirement, code = _tracer_recipe()
    traced = outside_the_repository(tmp_path / "traced")
    shutil.copytree(project, traced, ignore=shutil.ignore_patterns(".aws-sam"))
    env = installed.environment(_local(db_url), PYTHONPATH="handler")
    assert installed.run("enqueue", "hello", env=env, cwd=traced).code == 0
    with (traced / "handler" / "jobs.py").open("a") as jobs:
        jobs.write("\n" + code)

    def invoke() -> Finished:
        return installed.run("invoke", "-e", "infra/events/enqueue.json", env=env, cwd=traced)

    # Control: the middleware without the requirement. The function cannot start its jobs.
    without = invoke()
    assert without.code != 0 and "aws_xray_sdk" in without.out, without.out

    requirements = traced / "handler" / "requirements.txt"
    text = requirements.read_text()
    assert f"\npgdrain=={VERSION}\n" in text
    requirements.write_text(text.replace(f"\npgdrain=={VERSION}\n", f"\n{requirement}\n"))
    run_checked(
        [installed.bin / "pip", "install", "--quiet", "-r", requirements],
        cwd=traced,
        env=env,
    )
    with_it = invoke()
    assert with_it.code == 0, with_it.out + with_it.err
    assert '"done": 1,' in with_it.out  # the job the control could not run
