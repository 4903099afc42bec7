"""Reading a Hugging Face `config.json`: the file, then its keys, each failure one line.

Shared by the sizing reader (`kvbench.kvspec.hf`) and the checkpoint reader that decodes
(`kvbench.modeling.hf_config`), so a bad file or key reads the same whichever command met it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.flag_ranges import MAX_INT

REQUIRED = object()  # a key without a default
# the most a size may be: a real model's are far below (vocabularies ~256k tokens, contexts ~10M);
# beyond, sizes multiplied together (a layer's weights, a step's cost) leave float64's range,
# and a simulation on such a model reports latencies of inf


def read_config_json(path: Path) -> object:
    """The parsed config.json of the folder `path` (any JSON value: callers check its shape)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise KvbenchError(f"--model {path}: no config.json in the checkpoint folder")
    try:
        return json.loads(config_file.read_bytes().decode("utf-8-sig"))
    except OSError as error:
        raise KvbenchError(f"--model {path}: cannot read config.json ({error.strerror})") from None
    except UnicodeDecodeError as error:
        raise KvbenchError(f"--model {path}: config.json is not UTF-8 text ({error.reason})") from None
    except json.JSONDecodeError as error:
        raise KvbenchError(f"--model {path}: config.json is not valid JSON (line {error.lineno})") from None
    except RecursionError:
        raise KvbenchError(f"--model {path}: config.json nests too deeply to read") from None
    except ValueError:  # Python's own limit: an integer of more than 4300 digits
        raise KvbenchError(f"--model {path}: config.json holds an integer too long to read") from None


class ConfigKeys:
    """Typed reads of one config object's keys; each failure is one line naming the file and key.

    A JSON null reads as an absent key (Hugging Face writes null for "the default").
    """

    def __init__(self, config: dict, where: str) -> None:
        self.config, self.where = config, where

    def _get(self, key: str, default: object) -> object:
        value = self.config.get(key)
        if value is not None:
            return value
        if default is REQUIRED:
            raise KvbenchError(f"{self.where} lacks {key!r}")
        return default

    def given(self, key: str) -> bool:
        return self.config.get(key) is not None

    def count(self, key: str, default: object = REQUIRED) -> int:
        """A size: an integer in 1..MAX_INT (2.0 or "2" is refused, not read as 2: a config is
        not a guess)."""
        value = self._get(key, default)
        if type(value) is not int or value < 1:
            raise KvbenchError(f"{self.where}: {key} must be an integer >= 1, got {value!r}")
        if value > MAX_INT:  # not shown: it may have thousands of digits
            raise KvbenchError(f"{self.where}: {key} is over {MAX_INT}, larger than any model's")
        return value

    def number(self, key: str, default: float) -> float:
        """A finite real > 0 (an epsilon, a rotary base)."""
        value = self._get(key, default)
        if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
            raise KvbenchError(f"{self.where}: {key} must be a number > 0, got {value!r}")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if type(value) is not bool:
            raise KvbenchError(f"{self.where}: {key} must be true or false, got {value!r}")
        return value

    def choice(self, key: str, supported: str) -> None:
        """Refuse a value kvbench's model does not compute."""
        value = self._get(key, supported)
        if value != supported:
            raise KvbenchError(f"{self.where}: {key} {value!r} is not supported (only {supported!r})")

    def unsupported(self, key: str, what: str) -> None:
        raise KvbenchError(f"{self.where}: {key} {self.config[key]!r}: {what} is not supported")


def json_kind(value: object) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number", dict: "object"}.get(
        type(value), "null"
    )
