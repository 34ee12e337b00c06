"""serve.py's configuration: flags, YAML, precedence, and refusals that name the fix."""

import pytest

from reef_lab.config import ServeConfig, parse_serve_config


def test_defaults_are_the_embedded_server():
    c = parse_serve_config([])
    assert (c.host, c.port, c.data_dir, c.recipe, c.upstream_url) == ("127.0.0.1", 8900, "./.reef_lab", "basic", None)


def test_yaml_then_flags_win(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("port: 9001\nupstream-url: http://127.0.0.1:7000\nupstream_model: gpt-x\nrecipe: basic\n")
    c = parse_serve_config(["-c", str(f), "--port", "9002"])
    assert c.port == 9002 and c.upstream_url == "http://127.0.0.1:7000" and c.upstream_model == "gpt-x"


def test_unknown_yaml_key_is_refused(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text("prot: 1\n")
    with pytest.raises(SystemExit):
        parse_serve_config(["-c", str(f)])
    assert "unknown option 'prot'" in capsys.readouterr().err


@pytest.mark.parametrize("kw,needle", [
    ({"upstream_model": "m"}, "needs upstream_url"),
    ({"upstream_url": "http://x", "model_path": "/m"}, "either upstream_url"),
    ({"upstream_url": "ftp://x"}, "must start with http"),
    ({"port": 0}, "port must be"),
    ({"sched_slice_us": 50}, "100..100000"),
])
def test_bad_combinations_name_the_rule(kw, needle):
    with pytest.raises(ValueError, match=needle):
        ServeConfig(**kw)


def test_help_explains_each_flag(capsys):
    with pytest.raises(SystemExit):
        parse_serve_config(["--help"])
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "--data-dir", "--recipe", "--upstream-url", "--upstream-model", "--model-path"):
        assert flag in out
    assert "REEF_UPSTREAM_API_KEY" in out


def test_recipe_and_its_config_are_checked_at_the_command_line(tmp_path, capsys):
    import pytest as _pytest

    from reef_lab.config import parse_serve_config

    cfg_file = tmp_path / "sao.yaml"
    cfg_file.write_text("batch_size: 4\nmode: manual\n")
    cfg = parse_serve_config(["--recipe", "sao", "--recipe-config", str(cfg_file)])
    assert cfg.recipe_settings() == {"batch_size": 4, "mode": "manual"}
    for argv, needle in ((["--recipe", "sao", "--upstream-url", "http://x"], "cannot serve"),
                         (["--recipe", "nosuch"], "cannot be loaded"),
                         (["--recipe", "sao", "--recipe-config", str(tmp_path / "none.yaml")], "does not exist")):
        with _pytest.raises(SystemExit):
            parse_serve_config(argv)
        assert needle in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("batch_size: 4\nnot_a_field: 1\n")
    with _pytest.raises(SystemExit):
        parse_serve_config(["--recipe", "sao", "--recipe-config", str(bad)])
    assert "not_a_field" in capsys.readouterr().err


def test_help_lists_the_chosen_recipes_own_fields(capsys):
    with pytest.raises(SystemExit) as e:
        parse_serve_config(["--recipe", "sao", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "config of recipe 'sao'" in out
    assert "critic_updates (default: 2): value-model steps per policy step" in out
    assert "trainer.lr (default: 1.0e-05): AdamW learning rate" in out  # nested configs too


def test_print_config_is_a_file_that_reads_back(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        parse_serve_config(["--recipe", "sft", "--port", "8123", "--recipe-config",
                            "{batch_size: 4, eval_task: {name: arithmetic, max_digits: 3}}", "--print-config"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "# rollouts per policy step" not in text and "# samples per optimizer step" in text  # sft's help
    (tmp_path / "c.yaml").write_text(text)
    cfg = parse_serve_config(["-c", str(tmp_path / "c.yaml")])
    settings = cfg.recipe_settings()
    assert cfg.port == 8123 and cfg.recipe == "sft"
    assert settings["batch_size"] == 4 and settings["eval_task"]["max_digits"] == 3
    assert settings["trainer"]["lr"] == 1e-5  # defaults written out in full


def test_a_mistyped_nested_key_is_refused_at_start_with_its_path(capsys):
    with pytest.raises(SystemExit):
        parse_serve_config(["--recipe", "sao", "--recipe-config", "{eval_task: {name: arithmetic, max_digit: 3}}"])
    assert "eval_task.max_digit is not a TaskConfig field" in capsys.readouterr().err
