"""The training config schema: errors that say what is wrong, --set overrides, shipped configs."""

from __future__ import annotations

import pytest

from hpcdl.runtime.policy import DEFAULT_POLICY_SPEC, config_from_spec, default_codec_config
from hpcdl.train.config import ConfigError, codec_config, load_config, parse_bytes, shipped_configs

MINIMAL = {"model": {"name": "hep-cnn", "scale": "tiny"}}


def test_defaults_fill_every_section():
    config = load_config(MINIMAL)
    assert config["model"] == {"name": "hep-cnn", "scale": "tiny", "options": {}}
    assert config["train"]["epochs"] == 1 and config["optimizer"]["name"] == "adamw"
    assert config["compression"]["method"] == "none" and config["checkpoint"]["keep"] == 2


def test_unknown_key_names_full_path_and_closest_key():
    with pytest.raises(ConfigError, match=r"unknown config key 'train\.epoch'.*did you mean 'train\.epochs'"):
        load_config({**MINIMAL, "train": {"epoch": 3}})
    with pytest.raises(ConfigError, match=r"unknown config key 'optimiser'.*did you mean 'optimizer'"):
        load_config({**MINIMAL, "optimiser": {}})


def test_bad_type_and_bad_value_are_named():
    with pytest.raises(ConfigError, match=r"'train\.epochs' must be an integer, got 'three'"):
        load_config({**MINIMAL, "train": {"epochs": "three"}})
    with pytest.raises(ConfigError, match=r"'train\.epochs' must be >= 1"):
        load_config({**MINIMAL, "train": {"epochs": 0}})
    with pytest.raises(ConfigError, match=r"'optimizer\.name' must be one of .*did you mean 'lamb'"):
        load_config({**MINIMAL, "optimizer": {"name": "lamd"}})
    with pytest.raises(ConfigError, match=r"'compression\.method' must be one of \[.*\], got 'foo'$"):
        load_config({**MINIMAL, "compression": {"method": "foo"}})  # the valid values once, not listed again
    with pytest.raises(ConfigError, match=r"'train\.batch' must be an integer or 'auto'"):
        load_config({**MINIMAL, "train": {"batch": "big"}})
    with pytest.raises(ConfigError, match=r"'model\.name' is required"):
        load_config({"model": {"scale": "tiny"}})
    with pytest.raises(ConfigError, match=r"'train\.memory_budget'.*4GiB"):
        load_config({**MINIMAL, "train": {"memory_budget": "lots"}})


def test_overrides_parse_yaml_values_and_check_keys():
    config = load_config(MINIMAL, overrides=["train.epochs=3", "train.batch=auto", "compression.codec.bound=1e-2",
                                             "logging.progress=false", "compression.per_module.backbone.*={id: raw}",
                                             "compression.method=codec"])
    assert config["train"]["epochs"] == 3 and config["train"]["batch"] == "auto"
    assert config["compression"]["codec"] == {**default_codec_config(), "bound": pytest.approx(1e-2)}
    assert config["logging"]["progress"] is False
    assert config["compression"]["per_module"] == {"backbone.*": {"id": "raw"}}
    with pytest.raises(ConfigError, match=r"unknown config key 'train\.epochz'.*'train\.epochs'"):
        load_config(MINIMAL, overrides=["train.epochz=3"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(MINIMAL, overrides=["train.epochs"])


def test_codec_config_takes_only_set_options():
    config = load_config(MINIMAL, overrides=["compression.method=codec", "compression.codec.id=sz",
                                             "compression.codec.mode=rel", "compression.codec.bound=0.01"])
    assert config["compression"]["codec"] == {"id": "sz", "mode": "rel", "bound": 0.01}
    assert codec_config(config["compression"]) == config["compression"]["codec"]  # the alias kept one release


def test_memory_sizes():
    assert parse_bytes("4GiB") == 4 * 2**30 and parse_bytes("512 MB") == 512 * 10**6 and parse_bytes(1024) == 1024
    with pytest.raises(ValueError, match="not a size"):
        parse_bytes("4 gigs")


def test_unknown_config_name_suggests_shipped_one():
    with pytest.raises(FileNotFoundError, match="did you mean 'hep-jets'"):
        load_config("hep-jet")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config("/nonexistent/run.yaml")


def test_extends_merges_sections(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("extends: hep-jets\ntrain:\n  epochs: 7\n")
    base, mine = load_config("hep-jets"), load_config(path)
    assert mine["train"]["epochs"] == 7 and mine["name"] == "mine"
    assert mine["model"] == base["model"] and mine["train"]["batch"] == base["train"]["batch"]


def test_every_shipped_config_validates_and_has_a_description():
    from hpcdl import models

    listing = shipped_configs()
    expected = {"climate-deeplab", "climate-deeplab-gpu", "climate-deeplab-multinode", "hep-jets", "hep-jets-gpu",
                "hep-jets-multinode", "hep-particles"}
    assert expected <= set(listing)
    for name, description in listing.items():
        assert description, f"{name} has no description"
        config = load_config(name)
        spec = models.family(config["model"]["name"])
        assert config["model"]["scale"] in spec.scales, name
        if config["compression"]["method"] == "codec":
            from hpcdl.compress import codec_class

            codec_class(config["compression"]["codec"]["id"])


def test_numbers_too_large_are_config_errors_not_overflow():
    for value in ("1e400", "1.0e+400", ".inf", ".nan", "1e19"):
        with pytest.raises(ConfigError, match=r"'train\.memory_budget'.*finite number of bytes"):
            load_config(MINIMAL, overrides=[f"train.memory_budget={value}"])
    with pytest.raises(ConfigError, match=r"'train\.seed' must be <= 4294967295"):
        load_config(MINIMAL, overrides=["train.seed=99999999999999999999"])
    with pytest.raises(ConfigError, match=r"'train\.epochs' must be an integer of at most"):
        load_config(MINIMAL, overrides=[f"train.epochs={10**30}"])


@pytest.mark.parametrize("name", ["../../x", "..", ".", ".hidden", "a/b", "x\ny", "a b", "-x", "", "é", "a" * 101,
                                  "run*", "run[1]"])
def test_run_names_are_single_safe_path_components(name):
    from hpcdl.train.config import check_run_name

    with pytest.raises(ConfigError, match=r"config key 'name' must be a run name of 1 to 100 letters, digits"):
        check_run_name(load_config({**MINIMAL, "name": name})["name"])
    assert check_run_name(load_config({**MINIMAL, "name": "my-run_2.0+sz"})["name"]) == "my-run_2.0+sz"


def test_a_config_file_whose_name_is_not_a_run_name_needs_a_name(tmp_path):
    from hpcdl.train.config import check_run_name

    path = tmp_path / "my run.yaml"
    path.write_text("extends: hep-jets\n")
    with pytest.raises(ConfigError, match=r"got 'my run' \(it defaults to the config file's name; set `name:`"):
        check_run_name(load_config(path)["name"])
    assert check_run_name(load_config(path, overrides=["name=mine"])["name"]) == "mine"


def test_yaml_tags_and_non_mappings_are_one_line_config_errors(tmp_path):
    cases = {
        "x: !!python/object:os.system {}\n": r"constructor for the tag .*python/object:os.system.*plain YAML",
        "model: !foo {name: hep-cnn}\n": r"constructor for the tag '!foo'",
        "- 1\n- 2\n": r"must hold a mapping of config sections, got list",
        "model: [\n": r"is not valid YAML: .* at line 2, column 1",
        "train: {epochs: 2024-13-45}\n": r"holds a value YAML cannot build: month must be in 1\.\.12",
    }
    for text, message in cases.items():
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=message) as info:
            load_config(path)
        assert "\n" not in str(info.value)
    path.write_bytes(b"model: {name: \xff}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml is not UTF-8 text"):
        load_config(path)


# --- A bounded fuzz campaign: malformed configs through load_config and through the CLI ---------------------

BAD_VALUES = ["x", "[1, 2]", "{a: 1}", "true", "null", "1e400", "1.0e+400", ".nan", "-.inf", "-1", "0",
              str(10**30), "2024-13-45", "!!python/object:os.system {}", "!foo 1", "é\u202e", "''", "'a\nb'", "[",
              "0x10", "&a [*a]", "[" * 200 + "]" * 200, "!!binary notbase64", "!!int abc"]
BAD_DOCUMENTS = ["", "~", "5", "'text'", "- 1", "[", "{", ": :", "\t- a", "a: b: c", "model: 5", "model: [1]",
                 "model: {name: !!python/name:os.system}", "extends: 5", "extends: ''", "extends: nope",
                 "extends: [hep-jets]", "extends: bad.yaml", "!!python/object/apply:os.system [ls]",
                 "? [a, b]\n: c", "&a {extends: hep-jets, model: {options: *a}}", "\xef\xbb\xbfmodel: {name: x}",
                 "model: {name: hep-cnn}\nmodel: {name: other}", "name: ../x\nextends: hep-jets", "%YAML 9.9\n---\na: 1",
                 "a: &x [*x, *x]", "train: {epochs: 1e400}", "logging: {out_dir: !!binary aGk=}"]


def _leaf_keys(schema=None, prefix=""):
    from hpcdl.train.config import SCHEMA

    for key, spec in (SCHEMA if schema is None else schema).items():
        if isinstance(spec, dict):
            yield from _leaf_keys(spec, f"{prefix}{key}.")
        else:
            yield prefix + key


def _cli_outcome(capsys, argv) -> str:
    """Run ``hpcdl`` in this process: 'ok', or 'error' when it printed one `hpcdl train: error:` line with exit 2."""
    from hpcdl.cli import main

    code = main(argv)
    err = capsys.readouterr().err
    if code == 0:
        return "ok"
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("hpcdl train: error: "), (argv, code, err)
    return "error"


def test_fuzz_malformed_configs_give_config_errors_never_other_exceptions(tmp_path, capsys):
    """Every bad value of every key, and malformed documents: a ConfigError (one line) or a valid config.

    Through ``load_config`` and through ``hpcdl train --print-config`` in this process (no subprocess).
    """
    from hpcdl.train.config import ConfigError

    counts = {"cases": 0, "config errors": 0, "accepted": 0}

    def outcome(source, overrides=()):
        counts["cases"] += 1
        try:
            load_config(source, overrides=list(overrides))
        except (ConfigError, FileNotFoundError) as err:
            assert "\n" not in str(err), str(err)
            counts["config errors"] += 1
            return "error"
        counts["accepted"] += 1
        return "ok"

    cli_cases = 0
    for index, key in enumerate(_leaf_keys()):
        for position, value in enumerate(BAD_VALUES):
            override = f"{key}={value}"
            direct = outcome(MINIMAL, [override])
            # Through the CLI too for a rotating quarter of the values (building its parser costs ~15 ms).
            if (index + position) % 4 == 0:
                cli_cases += 1
                shipped = outcome("hep-jets", [override])
                assert _cli_outcome(capsys, ["train", "hep-jets", "--set", override, "--print-config"]) == shipped
    for key in ["", ".", "train..epochs", "train.epochs.x", "nope.x", "=", "model.options.x.y", "train"]:
        outcome(MINIMAL, [f"{key}=1"])
    for number, text in enumerate(BAD_DOCUMENTS):
        path = tmp_path / f"doc{number}.yaml"
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        direct = outcome(path)
        assert _cli_outcome(capsys, ["train", str(path), "--print-config"]) == direct
    assert counts["cases"] == len(list(_leaf_keys())) * len(BAD_VALUES) + cli_cases + 8 + len(BAD_DOCUMENTS)
    assert cli_cases >= len(list(_leaf_keys())) * len(BAD_VALUES) // 4
    assert counts["config errors"] > 0.8 * counts["cases"], counts


def test_the_codec_is_one_mapping_set_whole_or_by_option():
    config = load_config("hep-jets", ["compression.codec.bound=1e-3"])  # YAML 1.1 reads 1e-3 as text: taken as a number
    assert config["compression"]["codec"] == {"id": "sz", "mode": "rel", "bound": 1e-3}
    config = load_config("hep-jets", ["compression.codec={id: quant, bits: 4, group_size: 128}"])
    assert config["compression"]["codec"] == {"id": "quant", "bits": 4, "group_size": 128}  # nothing of sz left
    assert load_config(MINIMAL)["compression"]["codec"] == default_codec_config() == config_from_spec(DEFAULT_POLICY_SPEC)
    assert load_config("hep-jets")["compression"]["codec"] == default_codec_config()  # the shipped configs use it
    assert load_config(MINIMAL, ["compression.codec={mode: abs, bound: 0.5}"])["compression"]["codec"] == {
        "id": "sz", "mode": "abs", "bound": 0.5}


def test_the_codecs_own_check_names_the_full_key_path():
    with pytest.raises(ConfigError, match=r"^config key 'compression.codec' = \{'id': 'sz', 'mode': 'rel', "
                                          r"'bound': -0.001\}: error bound must be"):
        load_config("hep-jets", ["compression.codec.bound=-1e-3"])
    with pytest.raises(ConfigError, match=r"^config key 'compression.codec.id': unknown codec id 'szz'; known ids: "):
        load_config("hep-jets", ["compression.codec.id=szz"])
    with pytest.raises(ConfigError, match=r"^config key 'compression.per_module.head.\*' = .*bits must be one of"):
        load_config("hep-jets", ["compression.per_module.head.*={id: quant, bits: 3}"])
    with pytest.raises(ConfigError, match=r"'compression.codec' must be a codec config mapping"):
        load_config("hep-jets", ["compression.codec=sz"])


def test_an_extending_config_replaces_a_codec_with_an_id_and_changes_options_without_one(tmp_path):
    (tmp_path / "tighter.yaml").write_text("extends: hep-jets\ncompression: {codec: {bound: 1.0e-3}}\n")
    (tmp_path / "quant.yaml").write_text("extends: hep-jets\ncompression: {codec: {id: quant, bits: 2}}\n")
    assert load_config(tmp_path / "tighter.yaml")["compression"]["codec"] == {"id": "sz", "mode": "rel", "bound": 1e-3}
    assert load_config(tmp_path / "quant.yaml")["compression"]["codec"] == {"id": "quant", "bits": 2}


def test_the_flat_codec_keys_still_work_for_one_release_with_a_warning(tmp_path):
    (tmp_path / "old.yaml").write_text("model: {name: hep-cnn}\ncompression: {method: codec, id: sz, mode: abs, "
                                       "bound: 1.0e-3}\n")
    (tmp_path / "old-child.yaml").write_text("extends: hep-jets\ncompression: {bound: 1.0e-1}\n")
    with pytest.warns(FutureWarning, match=r"compression.id, compression.mode, compression.bound in .*old.yaml are "
                                           r"deprecated.*write compression.codec.id, compression.codec.mode"):
        old = load_config(tmp_path / "old.yaml")
    assert old["compression"]["codec"] == {"id": "sz", "mode": "abs", "bound": 1e-3}
    assert "bound" not in old["compression"]
    with pytest.warns(FutureWarning, match="compression.bound"):
        assert load_config(tmp_path / "old-child.yaml")["compression"]["codec"] == {"id": "sz", "mode": "rel",
                                                                                    "bound": 0.1}
    with pytest.warns(FutureWarning, match=r"keys compression.id, compression.mode, compression.bound in the --set overrides"):
        config = load_config("hep-jets", ["compression.id=raw", "compression.mode=null", "compression.bound=null"])
    assert config["compression"]["codec"] == {"id": "raw"}  # null removes an option, as it always did
    with pytest.warns(FutureWarning):
        config = load_config({"model": {"name": "hep-cnn"}, "compression": {"method": "codec", "bits": 2, "id": "quant"}})
    assert config["compression"]["codec"] == {"id": "quant", "bits": 2}
