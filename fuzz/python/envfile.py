"""Fuzz target (atheris, coverage-guided) for the training side's env-file loader
(python/linkpilot/envfile.py), as ``init_process_group`` uses it: any bytes at the path.

Oracles: the only error is EnvFileError, and then nothing was set; otherwise every variable was
set, every key is an environment name, and the variables written back as ``KEY=value`` lines
read back the same. Run through ``cargo xtask fuzz`` (libFuzzer's flags and corpus directories
as arguments); ``python/tests/test_envfile.py`` runs ``one_input`` on every committed seed.
"""

import atexit
import os
import shutil
import sys
import tempfile

from linkpilot import envfile

_DIR = tempfile.mkdtemp(prefix="fz-envfile-")
_PATH = os.path.join(_DIR, "nccl.env")
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)


def one_input(data: bytes) -> None:
    with open(_PATH, "wb") as f:
        f.write(data)
    environ = {"KEPT": "1"}
    try:
        variables = envfile.load_env_file(_PATH, environ=environ)
    except envfile.EnvFileError as e:
        assert environ == {"KEPT": "1"}, f"{e} but the environment changed: {environ}"
        assert str(e).startswith(_PATH + ":"), str(e)
        return
    for key, value in variables.items():
        assert environ[key] == value
        assert envfile._NAME.match(key), key
        assert "\n" not in value
    text = "".join(f"{k}={v}\n" for k, v in variables.items())
    assert envfile.parse_env(text) == variables, (data, text)


def main() -> None:
    # Imported here so that the oracle above loads without atheris (the seeds' test);
    # instrument_all covers the modules already imported, the loader among them.
    import atheris

    atheris.instrument_all()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
