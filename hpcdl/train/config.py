"""Training configs: the schema, validation, ``--set`` overrides and the shipped configs.

A config is a YAML mapping with the sections ``model``, ``data``, ``train``,
``optimizer``, ``compression``, ``distributed``, ``checkpoint`` and ``logging``.
Every key is declared in :data:`SCHEMA` with its type, allowed values or range
and default, so a typo is an error that names the key's full path and the
closest valid key instead of a setting silently ignored. The one exception is
the codec: ``compression.codec`` is a codec config mapping (``{id: sz, mode:
rel, bound: 1e-3}``) whose options the codec itself checks, through
:func:`hpcdl.compress.get_codec`, so a codec brings its own options with it.
Its default, and what a mapping without an ``id`` changes the options of, is
hpcdl's default policy (:data:`hpcdl.runtime.policy.DEFAULT_POLICY_SPEC`).

Shipped configs live in ``hpcdl/configs/<name>.yaml`` and are found by name. A
config may start from another with ``extends: <name>``; its own keys then
override the base's, section by section.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from hpcdl.errors import HpcdlError
from hpcdl.runtime.policy import default_codec_config
from hpcdl.units import parse_bytes

_MISSING = object()
# Integer keys end up in C longs (torch seeds, tensor sizes, loops); larger ones are typos, not settings.
MAX_INT = 2**63 - 1
# A run name becomes one path component of the run directory (``<out_dir>/<name>-<timestamp>``) and a glob
# pattern for --resume: letters, digits, '.', '_', '+', '-', starting with a letter or digit, at most 100.
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
RUN_NAME_HELP = ("1 to 100 letters, digits, '.', '_', '+' or '-', starting with a letter or digit "
                 "(it names the run directory)")


@dataclass(frozen=True)
class Field:
    """One config key: what values it accepts and its default (``required`` when it has none)."""

    kind: str
    default: Any = _MISSING
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False
    also: tuple = ()  # string values accepted besides the kind, e.g. ("auto",) for train.batch
    aliases: tuple = ()  # (old spelling, current value) pairs: an old value is read as the current one
    help: str = ""

    @property
    def required(self) -> bool:
        return self.default is _MISSING


#: ``compression.method`` values: one method, or ``recompute`` (activation recomputation, PyTorch's activation or
#: gradient checkpointing) combined with the one saved-tensor hook method.
COMPRESSION_METHODS = ("none", "codec", "recompute", "offload", "recompute+codec", "recompute+offload")

#: Old spellings of activation method names, still read (one release): ``checkpoint`` was ``recompute``'s name,
#: which the ``checkpoint`` section (training checkpoints, the saved run state) also used.
METHOD_ALIASES = {"checkpoint": "recompute"}


def canonical_method(method: str) -> str:
    """``method`` (a ``compression.method`` value) with old part names written the current way:
    ``checkpoint+codec`` -> ``recompute+codec``; any other string comes back unchanged."""
    return "+".join(METHOD_ALIASES.get(part, part) for part in method.split("+"))


#: Deprecated: codec keys written flat into ``compression`` (``compression.bound``), the form before
#: ``compression.codec``. Still read for one release: each is moved into ``compression.codec`` (a null
#: value removes the option) with a FutureWarning; see :func:`_translate_legacy_codec_keys`.
LEGACY_CODEC_KEYS = ("id", "mode", "bound", "bits", "dtype", "group_size")


def method_parts(compression: dict) -> tuple[str, ...]:
    """The methods a resolved ``compression`` section combines: ``recompute+codec`` -> (recompute, codec)."""
    return tuple(compression["method"].split("+"))


SCHEMA: dict[str, Any] = {
    "description": Field("str", "", help="one line shown by `hpcdl configs`"),
    "name": Field("str", None, nullable=True, help="run name (default: the config's name)"),
    "model": {
        "name": Field("str", help="a name from `hpcdl models`"),
        "scale": Field("str", "small", help="a scale of that model, e.g. tiny, small, full"),
        "options": Field("dict", {}, help="keyword arguments passed to hpcdl.models.get"),
    },
    "data": {
        "dataset": Field("str", None, nullable=True,
                         help="dataset name (climate-sample, hep-sample, random-*) or path; default: the model's "
                              "default dataset; 'synthetic' = random samples of the model's own input (particle "
                              "sets, tokens, images) from its example_batch, for memory/speed only"),
        "features": Field("str", None, nullable=True, help="dataset feature set, e.g. images|constituents for HEP"),
        "val_fraction": Field("float", 0.2, minimum=0.0, maximum=0.9, help="fraction held out for validation"),
        "synthetic_samples": Field("int", 256, minimum=1,
                                   help="training samples of 'synthetic' and random-* data sets"),
    },
    "train": {
        "epochs": Field("int", 1, minimum=1),
        "batch": Field("int", 8, minimum=1, also=("auto",),
                       help="GLOBAL batch, split evenly across ranks; auto = the largest per-device batch that "
                            "fits memory_budget (or the GPU's memory) times the number of ranks"),
        "steps_per_epoch": Field("int", None, minimum=1, nullable=True, help="cap on optimizer steps per epoch"),
        "val_steps": Field("int", None, minimum=1, nullable=True, help="cap on validation batches per epoch"),
        "seed": Field("int", 0, minimum=0, maximum=2**32 - 1),
        "memory_budget": Field("bytes", None, nullable=True, help="bytes or e.g. '4GiB'; for batch: auto"),
        "miou": Field("str", "global", choices=("global", "deepcam"),
                      help="segmentation mIoU: global = per-class IoU over all pixels of the validation set; "
                           "deepcam = the MLPerf DeepCAM metric (per-sample mean over classes, absent class = 1)"),
    },
    "optimizer": {
        "name": Field("str", "adamw", choices=("sgd", "adamw", "lamb", "lars")),
        "lr": Field("float", 1e-3, minimum=0.0),
        "momentum": Field("float", 0.9, minimum=0.0, maximum=1.0, help="sgd/lars momentum"),
        "betas": Field("list", [0.9, 0.999], help="adamw/lamb moment decay rates"),
        "eps": Field("float", 1e-8, minimum=0.0),
        "weight_decay": Field("float", 0.0, minimum=0.0),
        "trust_coefficient": Field("float", 1e-3, minimum=0.0, help="lars trust coefficient (eta)"),
        "lr_scaling": Field("str", "none", choices=("linear", "none"),
                            help="linear: lr * global_batch / base_batch"),
        "base_batch": Field("int", 32, minimum=1),
        "warmup_steps": Field("int", 0, minimum=0),
        "schedule": Field("str", "constant", choices=("cosine", "constant")),
        "min_lr_fraction": Field("float", 0.0, minimum=0.0, maximum=1.0, help="cosine floor as a fraction of lr"),
    },
    "compression": {
        "method": Field("str", "none", choices=COMPRESSION_METHODS,
                        aliases=tuple((old, canonical_method(old)) for old in ("checkpoint", "checkpoint+codec",
                                                                               "checkpoint+offload")),
                        help="what autograd keeps for backward; recompute+X recomputes the blocks in backward "
                             "and applies X to what they still save (checkpoint: the old name of recompute)"),
        "codec": Field("codec", default_codec_config(),
                       help="the codec of method: codec, one mapping checked by the codec itself, e.g. "
                            "{id: sz, mode: rel, bound: 1e-3}; without an id it changes the options of the "
                            "codec it extends, else of hpcdl's default policy (hpcdl.runtime.policy."
                            "DEFAULT_POLICY_SPEC), which is also the default"),
        "per_module": Field("dict", {}, help="module-name glob -> codec config, overriding the default codec"),
        "min_bytes": Field("int", None, nullable=True, minimum=0, help="saved tensors smaller than this stay raw"),
    },
    "distributed": {
        "backend": Field("str", "auto", choices=("auto", "horovod", "torch", "none")),
    },
    "checkpoint": {
        "every_steps": Field("int", 0, minimum=0, help="0 = only at the end"),
        "keep": Field("int", 2, minimum=1),
    },
    "logging": {
        "out_dir": Field("str", "runs"),
        "every_steps": Field("int", 1, minimum=1, help="write a metrics.jsonl line every N steps"),
        "progress": Field("bool", True),
        "tensorboard": Field("bool", False),
        "mlflow": Field("bool", False, help="also log to MLflow (needs the mlflow package)"),
        "mlflow_uri": Field("str", None, nullable=True,
                            help="MLflow tracking URI; default a file store in <run dir>/mlruns (offline)"),
    },
}

#: Deprecated alias (one release): the flat codec options of the old ``compression`` form.
CODEC_OPTION_KEYS = LEGACY_CODEC_KEYS[1:]


class ConfigError(HpcdlError, ValueError):
    """A config that does not match the schema; the message names the key's full path."""


def _suggest(key: str, valid: list[str], prefix: str = "", what: str = "valid keys here") -> str:
    """"; did you mean 'x'?" for the closest of ``valid`` to ``key``, else the list of valid ones."""
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if close:
        return f"; did you mean {prefix + close[0]!r}?"
    return f"; {what}: {', '.join(sorted(valid))}"


def _unknown_key(path: str, key: str, section: dict) -> ConfigError:
    prefix = f"{path}." if path else ""
    return ConfigError(f"unknown config key {prefix + key!r}" + _suggest(key, list(section), prefix))


def _yaml_float(text: str) -> float | str:
    """YAML 1.1 reads ``1e-2`` (no dot) as a string; accept it as the number it plainly is."""
    try:
        return float(text)
    except ValueError:
        return text


_YAML11_EXPONENT = re.compile(r"[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+")


def _codec_numbers(codec: dict) -> dict:
    """A codec mapping with YAML 1.1's unread numbers (``bound: 1e-2``, a string there) read as the floats they are;
    the codec checks its options itself, so this is the one conversion the config does for it."""
    return {key: float(value) if isinstance(value, str) and _YAML11_EXPONENT.fullmatch(value) else value
            for key, value in codec.items()}


def _check_value(path: str, field: Field, value: Any) -> Any:
    """Return ``value`` normalised to the field's kind, or raise ConfigError saying what would be right."""
    if value is None:
        if field.nullable:
            return None
        raise ConfigError(f"config key {path!r} must not be null")
    if isinstance(value, str) and value in field.also:
        return value
    if field.kind == "float" and isinstance(value, str):
        value = _yaml_float(value)
    expected = {
        "str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
        "dict": "a mapping", "list": "a list", "bytes": "a size like 4GiB or a number of bytes",
        "codec": "a codec config mapping like {id: sz, mode: rel, bound: 1e-2}",
    }[field.kind]
    if field.also:
        expected += " or " + " or ".join(repr(a) for a in field.also)
    ok_type: Callable[[Any], bool] = {
        "str": lambda v: isinstance(v, str),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "dict": lambda v: isinstance(v, dict),
        "codec": lambda v: isinstance(v, dict),
        "list": lambda v: isinstance(v, list),
        "bytes": lambda v: isinstance(v, (int, float, str)) and not isinstance(v, bool),
    }[field.kind]
    if not ok_type(value):
        raise ConfigError(f"config key {path!r} must be {expected}, got {value!r} ({type(value).__name__})")
    if field.kind == "codec":
        value = _codec_numbers(value) if "id" in value else {**default_codec_config(), **_codec_numbers(value)}
    if field.kind == "float":
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"config key {path!r} must be finite, got {value!r}")
    if field.kind == "bytes":
        try:
            value = parse_bytes(value)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"config key {path!r}: {err}") from None
    if field.aliases and isinstance(value, str):
        value = dict(field.aliases).get(value, value)
    if field.choices and value not in field.choices:
        close = difflib.get_close_matches(value, list(field.choices), n=1, cutoff=0.5) if isinstance(value, str) else []
        raise ConfigError(f"config key {path!r} must be one of {list(field.choices)}, got {value!r}"
                          + (f"; did you mean {close[0]!r}?" if close else ""))
    if field.kind == "int" and field.maximum is None and abs(value) > MAX_INT:
        raise ConfigError(f"config key {path!r} must be an integer of at most {MAX_INT}, got {value!r}")
    if field.minimum is not None and value < field.minimum:
        raise ConfigError(f"config key {path!r} must be >= {field.minimum}, got {value!r}")
    if field.maximum is not None and value > field.maximum:
        raise ConfigError(f"config key {path!r} must be <= {field.maximum}, got {value!r}")
    return copy.deepcopy(value)


def _validate_section(raw: dict, schema: dict, path: str) -> dict:
    if not isinstance(raw, dict):
        raise ConfigError(f"config section {path or 'top level'!r} must be a mapping, got {raw!r}")
    for key in raw:
        if key not in schema:
            raise _unknown_key(path, str(key), schema)
    resolved = {}
    for key, entry in schema.items():
        full = f"{path}.{key}" if path else key
        if isinstance(entry, dict):
            resolved[key] = _validate_section(raw.get(key) or {}, entry, full)
        elif key in raw:
            resolved[key] = _check_value(full, entry, raw[key])
        elif entry.required:
            raise ConfigError(f"config key {full!r} is required ({entry.help or entry.kind})")
        else:
            resolved[key] = copy.deepcopy(entry.default)
    return resolved


def check_run_name(name: str) -> str:
    """``name`` if it can name a run directory (one path component, see :data:`RUN_NAME`); else ConfigError.

    Checked where the name becomes a path (a run without --run-dir, --resume of the newest run), not by the
    schema: with an explicit run directory the name is only a title (the study's "hep-cnn sz:rel=0.01 seed=0").
    """
    if not isinstance(name, str) or not RUN_NAME.fullmatch(name):
        raise ConfigError(f"config key 'name' must be a run name of {RUN_NAME_HELP}, got {name!r} (it defaults to "
                          "the config file's name; set `name:` in the config, --set name=NAME, or give --run-dir)")
    return name


def check_codec_config(path: str, codec: dict, controllers: bool = False) -> None:
    """Build the codec ``codec`` names, so that its own check of its options runs now; its error, if any,
    becomes a ConfigError that names the config key ``path`` (``compression.codec``) and the mapping.
    ``controllers``: a controller such as ``{id: adaptive}`` may stand in for the codec (``compression.codec``)."""
    from hpcdl.compress import UnknownCodecError, get_codec  # torch: only for configs that compress
    from hpcdl.runtime.policy import controller_from_config, is_controller_config

    if is_controller_config(codec) and not controllers:
        raise ConfigError(f"config key {path!r} = {codec!r}: {codec['id']!r} chooses codecs for the whole "
                          "model, so it goes in compression.codec without compression.per_module")
    try:
        if is_controller_config(codec):
            controller_from_config(codec)
        else:
            get_codec(codec)
    except UnknownCodecError as err:
        raise ConfigError(f"config key '{path}.id': {err}") from None
    except (ValueError, TypeError) as err:
        raise ConfigError(f"config key {path!r} = {codec!r}: {err}") from None


def _check_cross_fields(config: dict) -> None:
    compression, optimizer = config["compression"], config["optimizer"]
    betas = optimizer["betas"]
    if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
        raise ConfigError(f"config key 'optimizer.betas' must be two numbers in [0, 1), got {betas!r}")
    if "codec" in method_parts(compression):
        check_codec_config("compression.codec", compression["codec"], controllers=not compression["per_module"])
        for pattern, codec in compression["per_module"].items():
            if not isinstance(codec, dict) or "id" not in codec:
                raise ConfigError(f"config key 'compression.per_module.{pattern}' must be a codec config with an "
                                  f"'id', like {{id: sz, mode: rel, bound: 1e-2}}; got {codec!r}")
            compression["per_module"][pattern] = codec = _codec_numbers(codec)
            check_codec_config(f"compression.per_module.{pattern}", codec)
    elif compression["per_module"]:
        raise ConfigError("config key 'compression.per_module' applies only to compression.method: codec (or recompute+codec), "
                          f"not {compression['method']!r}")


def validate(raw: dict) -> dict:
    """Check ``raw`` against :data:`SCHEMA`; return a new dict with every key present (defaults filled in)."""
    config = _validate_section(_translate_legacy_codec_keys(raw, "the config"), SCHEMA, "")
    _check_cross_fields(config)
    return config


def codec_config(compression: dict) -> dict:
    """A copy of ``compression["codec"]`` of a resolved section (kept for one release; read the key instead)."""
    return dict(compression["codec"])


def _translate_legacy_codec_keys(raw: dict, where: str) -> dict:
    """``raw`` with the deprecated flat codec keys of its ``compression`` section (:data:`LEGACY_CODEC_KEYS`)
    moved into ``compression.codec``, warning once (FutureWarning) with the keys and the new form.

    The keys change the codec of the same file (or the one it extends) as they always did: each sets
    that option, a null removes it, ``id`` alone keeps the other options."""
    compression = raw.get("compression")
    if not isinstance(compression, dict):
        return raw
    legacy = [key for key in LEGACY_CODEC_KEYS if key in compression]
    if not legacy:
        return raw
    raw = {**raw, "compression": dict(compression)}
    compression = raw["compression"]
    codec = compression.get("codec")
    codec = dict(codec) if isinstance(codec, dict) else {}
    for key in legacy:
        value = compression.pop(key)
        if value is None:
            codec.pop(key, None)
        else:
            codec[key] = value
    compression["codec"] = codec
    _warn_legacy([f"compression.{key}" for key in legacy], where)
    return raw


def _warn_legacy(keys: list[str], where: str) -> None:
    new = ", ".join(key.replace("compression.", "compression.codec.") for key in keys)
    what = f"config key {keys[0]} in {where} is" if len(keys) == 1 else f"config keys {', '.join(keys)} in {where} are"
    warnings.warn(f"{what} deprecated and will be removed in the next "
                  f"release; write {new} (the form `compression: {{method: codec, codec: {{id: sz, mode: rel, "
                  "bound: 1e-2}}`)", FutureWarning, stacklevel=4)


def _set_path(tree: dict, path: str, value: Any) -> bool:
    """Set ``tree[a][b]... = value`` for ``path`` "a.b...", checking each step against the schema.

    Returns True for a deprecated flat codec key (``compression.bound``), which sets ``compression.codec``'s option.
    """
    parts = path.split(".")
    if len(parts) == 2 and parts[0] == "compression" and parts[1] in LEGACY_CODEC_KEYS:
        compression = tree.get("compression")
        compression = tree["compression"] = dict(compression) if isinstance(compression, dict) else {}
        codec = compression.get("codec")
        codec = compression["codec"] = dict(codec) if isinstance(codec, dict) else {}
        if value is None:
            codec.pop(parts[1], None)
        else:
            codec[parts[1]] = value
        return True
    schema: Any = SCHEMA
    node = tree
    for depth, part in enumerate(parts):
        here = ".".join(parts[:depth])
        if isinstance(schema, Field):
            # Inside a free-form mapping (model.options, compression.per_module): the rest is one key,
            # since globs like "backbone.*" contain dots.
            node[".".join(parts[depth:])] = value
            return False
        if part not in schema:
            raise _unknown_key(here, part, schema)
        schema = schema[part]
        if depth == len(parts) - 1:
            node[part] = value
            return False
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    return False


def parse_override(text: str) -> tuple[str, Any]:
    """``"train.epochs=3"`` -> ``("train.epochs", 3)``; the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"an override is KEY=VALUE like train.epochs=3, got {text!r}")
    key, _, value = text.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"an override needs a key before '=', got {text!r}")
    return key, (parse_yaml(value, f"override {text!r}: the value") if value.strip() else None)


def configs_dir() -> Path:
    return Path(str(resources.files("hpcdl") / "configs"))


def shipped_configs() -> dict[str, str]:
    """Shipped config name -> its one-line description."""
    listing = {}
    for path in sorted(configs_dir().glob("*.yaml"), key=lambda p: p.stem):
        listing[path.stem] = (_read_yaml(path).get("description") or "").strip()
    return listing


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line from PyYAML's multi-line message: what is wrong and where."""
    problem = getattr(err, "problem", None) or str(err)
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if "constructor for the tag" in problem:
        problem += " (configs are plain YAML: no !!python/... or custom tags)"
    return " ".join(f"{problem}{where}".split())


def parse_yaml(text: str, what: str) -> Any:
    """``yaml.safe_load(text)``; anything PyYAML cannot read or build is a one-line ConfigError about ``what``."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{what} is not valid YAML: {_yaml_problem(err)}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as err:
        # Values YAML resolves but Python cannot build: a date like 2024-13-45, `!!int x`, deep nesting.
        raise ConfigError(f"{what} holds a value YAML cannot build: {' '.join(str(err).split())}") from None


def _read_yaml(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    data = parse_yaml(text, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config sections, got {type(data).__name__}")
    return data


def config_path(name_or_path: str | Path) -> Path:
    """The file a config name (``"hep-jets"``) or path (``"my-run.yaml"``) refers to."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"config file {str(path)!r} does not exist")
        return path
    shipped = configs_dir() / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    names = list(shipped_configs())
    raise FileNotFoundError(f"no shipped config named {str(name_or_path)!r} and no such file"
                            + _suggest(str(name_or_path), names, what="shipped configs"))


def _extends(raw: dict, where: str) -> str | None:
    """The config ``raw`` starts from (``extends: <name or path>``), or None."""
    parent = raw.get("extends")
    if parent is not None and (not isinstance(parent, str) or not parent.strip()):
        raise ConfigError(f"config key 'extends' in {where} must be a config name or path, got {parent!r}")
    return parent


def _replaces(path: str, value: dict) -> bool:
    """Whether ``value`` at ``path`` of an extending config replaces the base's mapping instead of merging into
    it: per-module codecs always; a codec that names its ``id`` (a new codec, not new options for the old one)."""
    return path == "compression.per_module" or (path == "compression.codec" and "id" in value)


def _merge(base: dict, override: dict, path: str = "") -> dict:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        here = f"{path}.{key}" if path else str(key)
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and not _replaces(here, value):
            merged[key] = _merge(merged[key], value, here)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _load_raw(name_or_path: str | Path, seen: tuple[Path, ...] = ()) -> dict:
    path = config_path(name_or_path).resolve()
    if path in seen:
        raise ConfigError(f"config 'extends' chain loops: {' -> '.join(str(p) for p in seen + (path,))}")
    raw = _translate_legacy_codec_keys(_read_yaml(path), str(path))
    parent = _extends(raw, str(path))
    if parent:
        parent_path = Path(parent)
        if not parent_path.is_absolute() and (path.parent / parent).exists():
            parent = str(path.parent / parent)
        raw = _merge(_load_raw(parent, seen + (path,)), {k: v for k, v in raw.items() if k != "extends"})
    return raw


def load_config(source: str | Path | dict, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Load a shipped config by name, a YAML file or a dict; apply ``KEY=VALUE`` overrides; validate.

    Returns the resolved config: a plain dict with every schema key present.
    """
    if isinstance(source, dict):
        raw = _translate_legacy_codec_keys(copy.deepcopy(source), "the config")
        parent = _extends(raw, "the config")
        if parent:
            raw = _merge(_load_raw(parent), {k: v for k, v in raw.items() if k != "extends"})
        default_name = raw["model"].get("name") if isinstance(raw.get("model"), dict) else None
    else:
        raw = _load_raw(source)
        default_name = config_path(source).stem
    legacy = []
    for text in overrides:
        key, value = parse_override(text)
        if _set_path(raw, key, value):
            legacy.append(key)
    if legacy:
        _warn_legacy(legacy, "the --set overrides")
    if raw.get("name") is None:
        raw["name"] = default_name  # names the run directory
    raw.pop("extends", None)
    return validate(raw)


def dump_config(config: dict) -> str:
    """The resolved config as YAML (what ``config.resolved.yaml`` holds)."""
    return yaml.safe_dump(config, sort_keys=False)
