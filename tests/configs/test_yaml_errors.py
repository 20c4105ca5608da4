"""A broken YAML file is one line naming the file, line and column, exit 2 (issue 14, finding 6)."""

import pytest

from roll.cli import main

FILES = {
    "syntax": ("exp_name: x\nfoo: [1, 2\n", "syntax.yaml:3:1: YAML: expected ','"),
    "tab": ("exp_name: x\n\tseed: 3\n", "tab.yaml:2:1: YAML: found character '\\t'"),
    "duplicate": ("exp_name: x\nexp_name: y\n", "duplicate.yaml:2:1: YAML: found duplicate key exp_name"),
    "python_tag": ("exp_name: !!python/object:os.system x\n", "python_tag.yaml:1:11: YAML: could not determine a constructor"),
    "uses_piece": ("defaults:\n  - piece@_here_\n  - _self_\nexp_name: x\n", "piece.yaml:3:1: YAML: expected ','"),
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_yaml_errors_are_one_line_with_file_line_and_column(tmp_path, capsys, name):
    text, expected = FILES[name]
    (tmp_path / f"{name}.yaml").write_text(text)
    (tmp_path / "piece.yaml").write_text("piece:\n  a: [1\n")
    assert main(["--config_path", str(tmp_path), "--config_name", name, "--dry_run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: ") and expected in err and "\n" not in err, err


def test_a_binary_file_is_named(tmp_path, capsys):
    (tmp_path / "binary.yaml").write_bytes(bytes(range(128, 256)))
    assert main(["--config_path", str(tmp_path), "--config_name", "binary", "--dry_run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "binary.yaml: YAML: not UTF-8 text" in err and "\n" not in err
