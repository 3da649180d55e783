"""`make install` sets up system packages on a machine that has only Python (install_system_packages.sh)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO, run_bounded

SCRIPT = REPO / "recipes" / "tools" / "install_system_packages.sh"
BASH = shutil.which("bash")


@pytest.fixture
def path_without_espeak_and_sox():
    """A PATH holding the script's basic tools (and apt-get) but neither espeak-ng nor sox, readable by anyone."""
    d = Path(tempfile.mkdtemp(prefix="corpus-io-path-"))
    os.chmod(d, 0o755)
    for tool in ("grep", "id", "ldconfig", "apt-get", "dpkg", "sudo"):
        found = shutil.which(tool, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        if found:
            (d / tool).symlink_to(found)
    yield str(d)
    shutil.rmtree(d)


def test_a_machine_with_every_package_is_left_alone():
    result = run_bounded([BASH, str(SCRIPT)], 60)
    assert result.returncode == 0 and result.stderr == "" and result.stdout == ""


def _as_an_ordinary_user(request) -> list[str]:
    """The command that runs the script as a user without root: this user when it is one; as root, uid 65534
    (setpriv) on a copy of the script in a directory anyone can read (the checkout may be mode 700)."""
    if os.geteuid() != 0:
        if run_bounded(["sudo", "-n", "true"], 30).returncode == 0 if shutil.which("sudo") else False:
            pytest.skip("this user has password-less sudo, so the script would install; run as root or "
                        "as a user without sudo")
        return [BASH, str(SCRIPT)]
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed, so root cannot run the script as another user")
    public = Path(tempfile.mkdtemp(prefix="corpus-io-script-"))
    request.addfinalizer(lambda: shutil.rmtree(public, ignore_errors=True))
    os.chmod(public, 0o755)
    copy = public / SCRIPT.name
    shutil.copy(SCRIPT, copy)
    os.chmod(copy, 0o755)
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", BASH, str(copy)]


def test_without_root_or_sudo_it_prints_the_exact_command_and_stops(path_without_espeak_and_sox, request):
    result = run_bounded(_as_an_ordinary_user(request), 60, env={"PATH": path_without_espeak_and_sox, "LANG": "C"},
                         cwd="/")
    assert result.returncode == 1
    assert result.stderr.count("error:") == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "apt-get update && apt-get install -y espeak-ng sox" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="installs with apt-get as root, as make install does on CI")
def test_as_root_the_missing_packages_are_installed_with_apt_get(path_without_espeak_and_sox):
    result = run_bounded([BASH, str(SCRIPT)], 600, env={"PATH": path_without_espeak_and_sox, "LANG": "C"})
    assert result.returncode == 0, result.stderr
    assert "installing system packages: espeak-ng sox (apt-get)" in result.stderr
    for package in ("espeak-ng", "sox"):  # really installed: dpkg says so
        status = run_bounded(["dpkg-query", "-W", "-f=${Status}", package], 60)
        assert status.stdout == "install ok installed"
