"""The README's set-up commands are the ones CI runs, and every command it documents exists."""

import re
from pathlib import Path

from click.testing import CliRunner

from charlm.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def setup_commands() -> list[str]:
    setup = README.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", setup)


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one():
    install_and_train, install_and_test = setup_commands()
    assert install_and_train == "pip install -e . && charlm train corpora/tinyshakespeare.txt"
    assert (ROOT / "corpora" / "tinyshakespeare.txt").is_file()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert install_and_test in ci.splitlines(), "CI must run the README's test command verbatim"


def test_every_documented_command_exists():
    documented = set(re.findall(r"^\$ charlm ([a-z]+)", README, flags=re.M))
    assert {"train", "info", "sample", "chat", "attn", "gates", "eval", "compare"} <= documented
    for name in documented:
        result = CliRunner().invoke(main, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
