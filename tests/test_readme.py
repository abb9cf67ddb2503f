"""The README's Python example runs as written (and warns about nothing)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_usage_example_runs(capsys):
    if not README.exists():
        pytest.skip("README.md is not beside the tests")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no Python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out
    assert printed.strip(), "the example prints its results"
