"""The training config schema: errors that say what is wrong, --set overrides, shipped configs."""

from __future__ import annotations

import pytest

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
    with pytest.raises(ConfigError, match=r"'train\.batch' must be an integer or 'auto'"):
        load_config({**MINIMAL, "train": {"batch": "big"}})
    with pytest.raises(ConfigError, match=r"'model\.name' is required"):
        load_config({"model": {"scale": "tiny"}})
    with pytest.raises(ConfigError, match=r"'train\.memory_budget'.*4GiB"):
        load_config({**MINIMAL, "train": {"memory_budget": "lots"}})


def test_overrides_parse_yaml_values_and_check_keys():
    config = load_config(MINIMAL, overrides=["train.epochs=3", "train.batch=auto", "compression.bound=1e-2",
                                             "logging.progress=false", "compression.per_module.backbone.*={id: raw}",
                                             "compression.method=codec"])
    assert config["train"]["epochs"] == 3 and config["train"]["batch"] == "auto"
    assert config["compression"]["bound"] == pytest.approx(1e-2)
    assert config["logging"]["progress"] is False
    assert config["compression"]["per_module"] == {"backbone.*": {"id": "raw"}}
    with pytest.raises(ConfigError, match=r"unknown config key 'train\.epochz'.*'train\.epochs'"):
        load_config(MINIMAL, overrides=["train.epochz=3"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(MINIMAL, overrides=["train.epochs"])


def test_codec_config_takes_only_set_options():
    config = load_config(MINIMAL, overrides=["compression.method=codec", "compression.id=sz",
                                             "compression.mode=rel", "compression.bound=0.01"])
    assert codec_config(config["compression"]) == {"id": "sz", "mode": "rel", "bound": 0.01}


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
        spec = models.spec(config["model"]["name"])
        assert config["model"]["scale"] in spec.scales, name
        if config["compression"]["method"] == "codec":
            from hpcdl.compress import codec_class

            codec_class(config["compression"]["id"])
