"""The README's set-up commands are the ones CI runs, it stays a short manual, and every command the README
and docs/ document exists."""

import re
from pathlib import Path

from click.testing import CliRunner

from charlm.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))}


def setup_commands() -> list[str]:
    setup = README.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", setup)


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one():
    install_and_train, install_and_test = setup_commands()
    assert install_and_train == "pip install -e . && charlm train corpora/tinyshakespeare.txt"
    assert (ROOT / "corpora" / "tinyshakespeare.txt").is_file()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert install_and_test in ci.splitlines(), "CI must run the README's test command verbatim"


def test_the_readme_is_a_short_manual_and_links_every_page_of_the_docs():
    assert len(README.splitlines()) <= 200  # a short manual: set-up, a tour of short excerpts, links (issue 36)
    assert "<<" not in README  # no placeholder left
    for name in DOCS:
        assert f"docs/{name}" in README, name


def test_every_documented_command_exists():
    documented = set()
    for text in (README, *DOCS.values()):
        documented |= set(re.findall(r"^\$ charlm ([a-z]+)", text, flags=re.M))
    assert set(main.commands) <= documented  # every command has a real example somewhere
    for name in documented:
        result = CliRunner().invoke(main, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)


def test_the_readme_says_to_install_cpu_torch_before_the_command_it_must_precede():
    """Found: the note on the CPU build of PyTorch came after the command it must precede."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    setup = readme.split("## Set-up", 1)[1]
    assert setup.index("download.pytorch.org/whl/cpu") < setup.index("pip install -e . && charlm train")
