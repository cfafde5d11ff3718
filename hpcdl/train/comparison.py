"""The activation methods that the demo and the training benchmark compare, as trainer config overrides.

One definition for both (they sit side by side above the trainer and do not import each other): the
uncompressed baseline and hpcdl's default policy (:data:`hpcdl.runtime.policy.DEFAULT_POLICY_SPEC`), labelled by
its spec with spaces (``sz:rel=1e-3`` -> ``sz rel 1e-3``).
"""

from __future__ import annotations

import json

from hpcdl.runtime.policy import DEFAULT_POLICY_SPEC, default_codec_config

#: The label of the default policy's rows: its method spec written with spaces, e.g. ``sz rel 1e-3``.
DEFAULT_METHOD_LABEL = DEFAULT_POLICY_SPEC.replace(":", " ").replace("=", " ").replace(",", " ")

COMPARED_METHODS: dict[str, list[str]] = {
    "baseline": ["compression.method=none"],
    DEFAULT_METHOD_LABEL: ["compression.method=codec", f"compression.codec={json.dumps(default_codec_config())}"],
}
