"""Every command's --help ends with an example (issue 19, item 9c), and the examples' config files exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpsynth.cli.examples import EXAMPLES, walk
from dpsynth.cli.main import cli_command

REPO = Path(__file__).resolve().parent.parent
COMMANDS = [" ".join(path) for path, _ in walk(cli_command())]


def test_every_command_is_listed():
    assert {"run actg", "run dpfair", "eval tabular", "train", "privacy epsilon", "submit"} <= set(COMMANDS)
    assert sorted(set(COMMANDS) - set(EXAMPLES)) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_an_example(command, capsys):
    code = cli_command().main(args=[*command.split(), "--help"], prog_name="dpsynth", standalone_mode=False)
    out = capsys.readouterr().out
    assert code in (0, None), out
    assert "Example" in out, out
    assert EXAMPLES[command][0].split()[1] in out.split("Example")[-1]  # this command's own example


def test_example_config_files_exist():
    for lines in EXAMPLES.values():
        for line in lines:
            assert line.startswith("dpsynth ")
            for cfg in re.findall(r"configs/\S+\.yaml", line):
                assert (REPO / cfg).is_file(), line


def test_console_entry_shows_the_example():
    res = subprocess.run([sys.executable, "-m", "dpsynth", "run", "dpfair", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "dpsynth run dpfair --config configs/dpfair_demo.yaml" in res.stdout
