import subprocess
import sys

import pytest

from smoothscale.cli import build_parser


def test_every_subcommand_has_help() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    for name, sub in subparsers.choices.items():  # type: ignore[union-attr]
        assert sub.format_help().strip(), name


def test_version_answers_without_heavy_imports() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, smoothscale.cli as c; c.build_parser(); "
            "print('pyspark' in sys.modules, 'confluent_kafka' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False False"


def test_unknown_subcommand_is_refused() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["no-such-command"])


@pytest.mark.parametrize("label", ["smoothscale.io/streamingapps", "key=", "bad key=x"])
def test_an_operator_secret_label_that_is_not_a_label_is_refused_with_an_example(
    label: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "--namespace", "shop", "--secret-label", label])

    assert "write KEY=VALUE" in capsys.readouterr().err
