import json
import os
import subprocess
import sys
from string import Template

import pytest

from nbtools import kernels

# Shaped like CANN's ascend-toolkit/set_env.sh: a toolkit home, list variables extended in front.
FAKE_SET_ENV = """
export ASCEND_TOOLKIT_HOME={root}/ascend-toolkit/latest
export LD_LIBRARY_PATH=${{ASCEND_TOOLKIT_HOME}}/lib64:${{ASCEND_TOOLKIT_HOME}}/lib64/plugin/opskernel:$LD_LIBRARY_PATH
export PYTHONPATH=${{ASCEND_TOOLKIT_HOME}}/python/site-packages:$PYTHONPATH
export PATH=${{ASCEND_TOOLKIT_HOME}}/bin:$PATH
export ASCEND_OPP_PATH=${{ASCEND_TOOLKIT_HOME}}/opp
echo "set_env.sh: CANN loaded"
"""


@pytest.fixture
def set_env(tmp_path):
    script = tmp_path / "set_env.sh"
    script.write_text(FAKE_SET_ENV.format(root=tmp_path))
    return script


BASE = {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "LD_LIBRARY_PATH": "/opt/lib"}


def test_diff_holds_exactly_what_the_script_set(set_env, tmp_path):
    before, after = kernels.sourced_env(set_env, base=BASE)
    env = kernels.env_diff(before, after)
    home = f"{tmp_path}/ascend-toolkit/latest"
    assert env == {
        "ASCEND_TOOLKIT_HOME": home,
        "ASCEND_OPP_PATH": f"{home}/opp",
        "LD_LIBRARY_PATH": f"{home}/lib64:{home}/lib64/plugin/opskernel:${{LD_LIBRARY_PATH}}",
        "PATH": f"{home}/bin:${{PATH}}",
        "PYTHONPATH": f"{home}/python/site-packages",  # was unset: no empty entry left behind
    }


def test_template_is_filled_from_the_server_environment(set_env, tmp_path):
    spec = kernels.from_set_env(set_env, python="/envs/py/bin/python", base=BASE)
    server = {"PATH": "/srv/bin:/usr/bin", "LD_LIBRARY_PATH": "/srv/lib"}
    filled = {k: Template(v).safe_substitute(server) for k, v in spec["env"].items()}  # what jupyter_client does
    home = f"{tmp_path}/ascend-toolkit/latest"
    assert filled["PATH"] == f"{home}/bin:/srv/bin:/usr/bin"
    assert filled["LD_LIBRARY_PATH"].endswith(":/srv/lib")
    assert spec["argv"][:3] == ["/envs/py/bin/python", "-m", "ipykernel_launcher"]
    assert spec["display_name"] == "Python (CANN)" and spec["language"] == "python"


def test_full_values_and_dollar_escaping():
    before = {"PATH": "/usr/bin"}
    after = {"PATH": "/x/bin:/usr/bin", "ODD": "a$b", "_": "/usr/bin/env", "SHLVL": "2"}
    assert kernels.env_diff(before, after, template=False) == {"PATH": "/x/bin:/usr/bin", "ODD": "a$b"}
    env = kernels.env_diff(before, after)
    assert env["ODD"] == "a$$b" and Template(env["ODD"]).substitute({}) == "a$b"


def test_failing_or_missing_script(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("echo 'cannot find the toolkit' >&2\nreturn 3\n")
    with pytest.raises(RuntimeError, match="exit 3.*cannot find the toolkit"):
        kernels.sourced_env(bad)
    with pytest.raises(FileNotFoundError):
        kernels.sourced_env(tmp_path / "nope.sh")


def test_install_is_ipykernels_own(set_env, tmp_path, capsys, monkeypatch):
    """The spec's interpreter installs it with its ipykernel: ipykernel's kernel.json (argv, metadata,
    logos) with our display name and env, under PREFIX/share/jupyter/kernels, or the user's data dir."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    spec = kernels.from_set_env(set_env)
    path = kernels.install(spec, "cann-test", prefix=tmp_path / "jupyter")
    assert path == tmp_path / "jupyter" / "share" / "jupyter" / "kernels" / "cann-test" / "kernel.json"
    written = json.loads(path.read_text())
    assert written["env"] == spec["env"] and written["display_name"] == "Python (CANN)" and written["language"] == "python"
    assert written["argv"][0] == sys.executable and written["argv"][-4:] == ["-m", "ipykernel_launcher", "-f", "{connection_file}"]
    assert (path.parent / "logo-64x64.png").is_file()  # ipykernel's resources came with it
    user = kernels.install(spec, "cann-user")
    assert user == tmp_path / "data" / "kernels" / "cann-user" / "kernel.json" and json.loads(user.read_text()) == written
    assert kernels.main([str(set_env), "--print", "--name", "cann-print"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == written
    assert sorted(p.name for p in (tmp_path / "data" / "kernels").iterdir()) == ["cann-user"]  # --print installed nothing


def test_install_says_when_the_interpreter_has_no_ipykernel(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'ipykernel'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    spec = kernels.kernel_json({"A": "1"}, python=str(fake))
    with pytest.raises(RuntimeError, match=f"{fake}: ipykernel could not install.*exit 1.*No module named 'ipykernel'"):
        kernels.install(spec, "x", prefix=tmp_path)
    with pytest.raises(RuntimeError, match="cannot run"):
        kernels.install(kernels.kernel_json({}, python=str(tmp_path / "missing")), "x", prefix=tmp_path)


def test_a_kernel_started_from_the_spec_sees_the_variables(set_env, tmp_path):
    """End to end: jupyter_client starts the kernel with the spec's env, ${PATH} filled in."""
    kernels.install(kernels.from_set_env(set_env), "cann-e2e", prefix=tmp_path / "jupyter")
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nprint('home=' + os.environ['ASCEND_TOOLKIT_HOME'])\nprint('path=' + os.environ['PATH'])\n")
    env = dict(os.environ, JUPYTER_PATH=str(tmp_path / "jupyter" / "share" / "jupyter"))
    out = subprocess.run(
        [sys.executable, "-m", "jupyter", "run", "--kernel", "cann-e2e", str(probe)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"home={tmp_path}/ascend-toolkit/latest" in out.stdout
    assert f"path={tmp_path}/ascend-toolkit/latest/bin:{os.environ['PATH']}" in out.stdout
