"""A config.json's rotary scaling read into a `RopeScaling`, each value checked.

Two spellings exist: older configs keep it in `rope_scaling` (its kind under `type` or
`rope_type`) beside a top-level `rope_theta`; transformers 5 writes `rope_parameters` holding
`rope_type`, `rope_theta` and the scaling's own keys (Gemma 3: one such object per layer type).
Where both are given `rope_scaling` decides, as transformers reads them. kvbench computes the
types in `ROPE_TYPES` (`kvbench/modeling/rope.py`); any other is refused in one line naming its
key, since plain frequencies would decode other tokens. Torch-free, like the rest of the check.
"""

from __future__ import annotations

from kvbench.errors import KvbenchError
from kvbench.kvspec.config_json import REQUIRED, ConfigKeys, json_kind
from kvbench.kvspec.model import RopeScaling

ROPE_TYPES = ("default", "yarn", "llama3")


def read_rope_scaling(config: dict, where: str, types: tuple[str, ...] = ROPE_TYPES) -> RopeScaling | None:
    """The rotary scaling `config` (a config.json object, `where` naming it) sets, one of `types`
    (a family may compute fewer); None: plain frequencies."""
    key, params = _scaling_object(config, where)
    if params is None:
        return None
    kind = params.get("rope_type", params.get("type")) or "default"
    if kind not in types:
        raise KvbenchError(
            f"{where}: {key}: rope type {kind!r} is not supported here (kvbench computes: {', '.join(types)})"
        )
    if kind == "default":
        return None
    keys = ConfigKeys(params, f"{where}: {key}")
    if keys.number("partial_rotary_factor", 1.0) != 1.0:
        raise KvbenchError(f"{keys.where}: partial_rotary_factor: a partly rotated head is not supported")
    top = ConfigKeys(config, where)  # a top-level original length wins over the nested one (Phi-3's place)
    if top.given("original_max_position_embeddings"):
        original = top.count("original_max_position_embeddings")
    else:
        original = keys.count("original_max_position_embeddings", top.count("max_position_embeddings"))
    if kind == "llama3":
        low, high = keys.number("low_freq_factor", REQUIRED), keys.number("high_freq_factor", REQUIRED)
        if high <= low:
            raise KvbenchError(f"{keys.where}: high_freq_factor {high} must exceed low_freq_factor {low}")
        return RopeScaling(
            "llama3", keys.number("factor", REQUIRED), original, low_freq_factor=low, high_freq_factor=high
        )  # fmt: skip
    factor = keys.number("factor", top.count("max_position_embeddings") / original)  # null: the ratio
    return RopeScaling(
        "yarn", factor, original, beta_fast=keys.number("beta_fast", 32.0),
        beta_slow=keys.number("beta_slow", 1.0), mscale=_weight(keys, "mscale"),
        mscale_all_dim=_weight(keys, "mscale_all_dim"), attention_factor=_weight(keys, "attention_factor"),
        truncate=keys.flag("truncate", True),
    )  # fmt: skip


def _scaling_object(config: dict, where: str) -> tuple[str, dict | None]:
    """The key and the object that say how rotary frequencies are scaled (None: neither is given).
    Per-layer-type objects (Gemma 3's) are accepted only when every one is plain."""
    for key in ("rope_scaling", "rope_parameters"):
        params = config.get(key)
        if not params:  # null or empty: transformers reads the next
            continue
        if not isinstance(params, dict):
            raise KvbenchError(f"{where}: {key} must be an object, got a JSON {json_kind(params)}")
        nested = {name: value for name, value in params.items() if isinstance(value, dict)}
        if not nested:
            return key, params
        for name, value in nested.items():
            if (value.get("rope_type", value.get("type")) or "default") != "default":
                raise KvbenchError(
                    f"{where}: {key}.{name}: rope scaling per layer type is not supported "
                    f"(rope type {value.get('rope_type', value.get('type'))!r})"
                )
        return key, None
    return "rope_parameters", None


def _weight(keys: ConfigKeys, name: str) -> float:
    """An optional YaRN weight: 0 where absent, null or 0 (as transformers treats them), else > 0."""
    value = keys.config.get(name)
    return 0.0 if value is None or (type(value) in (int, float) and value == 0) else keys.number(name, 1.0)
