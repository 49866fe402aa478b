"""Each test runs in its own temporary directory, so the engine's default run directory
(runs/<time>-python, as the CLI's) lands there."""

import pytest


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
