"""Run tables stored gzip-packed: `steps.csv.gz` read wherever `steps.csv` is.

Why: committed real runs keep every step and request row (calibration, replays and reports
rebuild from them), and a 60 s Alpaca run at 100 requests/s writes over a megabyte of each. The
repository travels whole to a GPU machine, so committed folders pack their large tables
(`tools/pack_results.py`); a run writes plain CSV, and every reader takes either form. A packed
table is byte for byte the CSV it replaced (gzip with no name and no time stamp: packing the same
file twice gives the same bytes).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.results.files import atomic_open

PACKED_SUFFIX = ".gz"


def packed_path(path: Path) -> Path:
    """Where table `path` lives when packed: `steps.csv` -> `steps.csv.gz`."""
    path = Path(path)
    return path.with_name(path.name + PACKED_SUFFIX)


def table_path(path: Path) -> Path | None:
    """The file that holds table `path`: itself, else its packed copy; None when neither is there.
    Something else by either name (a folder) is refused: read as no table, a run's steps would
    silently be empty."""
    path = Path(path)
    for candidate in (path, packed_path(path)):
        if candidate.is_file():
            return candidate
        if candidate.exists():
            raise KvbenchError(f"{candidate}: is not a file: kvbench writes its tables as files")
    return None


def table_bytes(path: Path) -> bytes | None:
    """Table `path`'s CSV bytes (unpacked where it is packed); None when it is not there.

    A packed file that is not gzip, or is cut short, is refused naming it (`KvbenchError`)."""
    found = table_path(path)
    if found is None:
        return None
    try:
        data = found.read_bytes()
    except OSError as error:
        raise KvbenchError(f"{found}: cannot read it ({error.strerror})") from None
    if found == Path(path):
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as error:
        raise KvbenchError(f"{found}: not a whole gzip file ({error})") from None


def pack_table(path: Path, min_bytes: int = 0) -> bool:
    """Replace CSV `path` by its packed copy when it holds at least `min_bytes`; True if packed.

    The packed file is written atomically and read back before the CSV is removed, so an
    interruption leaves the CSV, the packed copy, or (for an instant) both, never neither."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size < min_bytes:
        return False
    data = path.read_bytes()
    packed = gzip.compress(data, compresslevel=9, mtime=0)
    target = packed_path(path)
    with atomic_open(target, binary=True) as f:
        f.write(packed)
    if gzip.decompress(target.read_bytes()) != data:
        target.unlink()
        raise KvbenchError(f"{target}: the packed copy does not read back as {path.name}; {path} is kept")
    path.unlink()
    return True
