"""The CUDA driver's virtual-memory API through ctypes on `libcuda`.

Why ctypes: the calls are few (reserve, create, map, set access, unmap, release, free) and
take plain integers and two small structs, so binding them directly needs no compiler and no
package beyond the driver itself, which every CUDA machine has. torch creates and makes
current the device's primary context; these calls run in it, so tensors torch makes over a
mapped range (`VirtualRange.tensor`) and kernels torch launches see the same addresses.

Terms (the driver's): a *reservation* is a span of virtual addresses with nothing behind it;
a *handle* is physical memory of one page (a multiple of the allocation granularity, 2 MiB on
the H200); *mapping* a handle at an offset of the reservation backs those addresses, and
*setting access* makes them readable and writable from the device. A kernel that touches an
unmapped address faults and takes the context down with it, so callers map before use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from dataclasses import dataclass

_SUCCESS = 0
_ALLOCATION_TYPE_PINNED = 1
_LOCATION_TYPE_DEVICE = 1
_ACCESS_READ_WRITE = 3
_GRANULARITY_MINIMUM = 0
_GRANULARITY_RECOMMENDED = 1


class _Location(ctypes.Structure):
    _fields_ = (("type", ctypes.c_int), ("id", ctypes.c_int))


class _AllocFlags(ctypes.Structure):
    _fields_ = (
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    )


class _AllocationProp(ctypes.Structure):
    _fields_ = (
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    )


class _AccessDesc(ctypes.Structure):
    _fields_ = (("location", _Location), ("flags", ctypes.c_int))


class DriverError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error name."""


_u64 = ctypes.c_uint64
_size = ctypes.c_size_t
_SIGNATURES = {
    "cuInit": (ctypes.c_uint,),
    "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
    "cuCtxGetCurrent": (ctypes.POINTER(ctypes.c_void_p),),
    "cuDeviceGet": (ctypes.POINTER(ctypes.c_int), ctypes.c_int),
    "cuDevicePrimaryCtxRetain": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_int),
    "cuCtxSetCurrent": (ctypes.c_void_p,),
    "cuMemGetAllocationGranularity": (ctypes.POINTER(_size), ctypes.POINTER(_AllocationProp), ctypes.c_int),
    "cuMemAddressReserve": (ctypes.POINTER(_u64), _size, _size, _u64, ctypes.c_ulonglong),
    "cuMemAddressFree": (_u64, _size),
    "cuMemCreate": (ctypes.POINTER(_u64), _size, ctypes.POINTER(_AllocationProp), ctypes.c_ulonglong),
    "cuMemRelease": (_u64,),
    "cuMemMap": (_u64, _size, _size, _u64, ctypes.c_ulonglong),
    "cuMemUnmap": (_u64, _size),
    "cuMemSetAccess": (_u64, _size, ctypes.POINTER(_AccessDesc), _size),
}


class Driver:
    """The virtual-memory calls of one device, in the calling thread's current context."""

    def __init__(self, device: int = 0) -> None:
        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            self._lib = ctypes.CDLL(name)
        except OSError as e:
            raise DriverError(f"the CUDA driver library ({name}) could not be loaded: {e}") from None
        for fn, argtypes in _SIGNATURES.items():
            getattr(self._lib, fn).argtypes = argtypes
            getattr(self._lib, fn).restype = ctypes.c_int
        self.device = device
        self._call("cuInit", 0)
        self._ensure_context()
        self._prop = _AllocationProp(
            type=_ALLOCATION_TYPE_PINNED, location=_Location(_LOCATION_TYPE_DEVICE, device)
        )
        here = _Location(_LOCATION_TYPE_DEVICE, device)
        self._access = _AccessDesc(location=here, flags=_ACCESS_READ_WRITE)

    def _call(self, fn: str, *args) -> None:
        status = getattr(self._lib, fn)(*args)
        if status != _SUCCESS:
            text = ctypes.c_char_p()
            self._lib.cuGetErrorName(status, ctypes.byref(text))
            raise DriverError(f"{fn} failed: {(text.value or b'?').decode()} ({status})")

    def _ensure_context(self) -> None:
        """Use the current context (torch's, once it has touched the device), else retain the
        device's primary context, which is the one torch uses."""
        ctx = ctypes.c_void_p()
        self._call("cuCtxGetCurrent", ctypes.byref(ctx))
        if ctx.value:
            return
        dev = ctypes.c_int()
        self._call("cuDeviceGet", ctypes.byref(dev), self.device)
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self._call("cuCtxSetCurrent", ctx)

    def granularity(self, recommended: bool = False) -> int:
        """Bytes every page size and mapping offset must be a multiple of."""
        out = _size()
        option = _GRANULARITY_RECOMMENDED if recommended else _GRANULARITY_MINIMUM
        self._call("cuMemGetAllocationGranularity", ctypes.byref(out), ctypes.byref(self._prop), option)
        return out.value

    def reserve(self, size: int, alignment: int = 0) -> int:
        """A span of `size` virtual bytes; its address."""
        ptr = _u64()
        self._call("cuMemAddressReserve", ctypes.byref(ptr), size, alignment, 0, 0)
        return ptr.value

    def free(self, address: int, size: int) -> None:
        self._call("cuMemAddressFree", address, size)

    def create(self, size: int) -> int:
        """Physical memory of `size` bytes on the device (not yet addressable); its handle."""
        handle = _u64()
        self._call("cuMemCreate", ctypes.byref(handle), size, ctypes.byref(self._prop), 0)
        return handle.value

    def release(self, handle: int) -> None:
        """Give a handle's memory back (it returns once no mapping uses it)."""
        self._call("cuMemRelease", handle)

    def map(self, address: int, size: int, handle: int) -> None:
        """Back `size` bytes at `address` with `handle` and make them device read-write."""
        self._call("cuMemMap", address, size, 0, handle, 0)
        self._call("cuMemSetAccess", address, size, ctypes.byref(self._access), 1)

    def unmap(self, address: int, size: int) -> None:
        self._call("cuMemUnmap", address, size)


@dataclass(frozen=True)
class _ArrayInterface:
    """Enough of `__cuda_array_interface__` (version 3) for torch.as_tensor to view a range."""

    address: int
    shape: tuple[int, ...]
    typestr: str

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.typestr, "data": (self.address, False), "version": 3}


_TYPESTR = {"float16": "<f2", "bfloat16": "<V2", "float32": "<f4", "uint8": "|u1", "int32": "<i4"}


def view(address: int, shape: tuple[int, ...], dtype) -> object:
    """A torch tensor over device memory at `address` (no copy, no ownership: the range must
    outlive it). bfloat16 has no array-interface type, so it is viewed as int16 and
    reinterpreted."""
    import torch

    name = str(dtype).removeprefix("torch.")
    if name == "bfloat16":
        return torch.as_tensor(_ArrayInterface(address, shape, "<i2"), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(_ArrayInterface(address, shape, _TYPESTR[name]), device="cuda")


def range_tokens(max_len: int, row_bytes: int, page: int) -> int:
    """Token rows in a virtual range that holds `max_len` rows of `row_bytes` and starts and ends
    on a page boundary, so that every range of a tensor starts on one too (a row may straddle
    two pages; the range's length is whole pages and whole rows)."""
    unit = row_bytes // math.gcd(row_bytes, page)  # pages in the shortest such span
    pages = -(-max_len * row_bytes // page)
    return -(-pages // unit) * unit * page // row_bytes


class VirtualBuffer:
    """A span of virtual memory with a page created and mapped wherever asked; `close` unmaps and
    releases every page and frees the span. Pages are one handle each, as an allocator that
    maps a sequence's growth page by page holds them.

    `page` (bytes, a multiple of the driver's granularity; default the granularity) is what one
    handle holds. An unmapped page's handle is kept for the next map (`spare`): creating
    physical memory costs more than mapping it, and a KV arena's pages come and go within the
    same budget. `maps` and `unmaps` count the driver's map and unmap calls; mapping a page that
    is mapped, or unmapping one that is not, is a `DriverError` (a caller's bookkeeping bug).
    """

    def __init__(self, driver: Driver, size: int, page: int | None = None) -> None:
        self.driver = driver
        granularity = driver.granularity()
        self.page = page or granularity
        if self.page % granularity:
            raise DriverError(f"a page of {self.page} bytes is not a multiple of {granularity} (granularity)")
        self.size = -(-size // self.page) * self.page
        self.address = driver.reserve(self.size, self.page)
        self._handles: dict[int, int] = {}  # page index -> handle
        self._spare: list[int] = []  # handles of unmapped pages, kept for the next map
        self.maps = self.unmaps = self.creates = 0

    @property
    def mapped_bytes(self) -> int:
        return len(self._handles) * self.page

    @property
    def mapped_pages(self) -> frozenset[int]:
        return frozenset(self._handles)

    @property
    def held_bytes(self) -> int:
        """Physical memory this buffer holds: mapped pages and spare handles."""
        return (len(self._handles) + len(self._spare)) * self.page

    def map_page(self, index: int) -> None:
        """Back page `index` (unmapped now) with a spare handle, else a new one."""
        if index in self._handles:
            raise DriverError(f"page {index} is mapped already")
        if self._spare:
            handle = self._spare.pop()
        else:
            handle = self.driver.create(self.page)
            self.creates += 1
        try:
            self.driver.map(self.address + index * self.page, self.page, handle)
        except DriverError:
            self._spare.append(handle)
            raise
        self._handles[index] = handle
        self.maps += 1

    def unmap_page(self, index: int) -> None:
        """Unmap page `index` (mapped now); its handle waits for the next `map_page`."""
        handle = self._handles.pop(index, None)
        if handle is None:
            raise DriverError(f"page {index} is not mapped")
        self.driver.unmap(self.address + index * self.page, self.page)
        self._spare.append(handle)
        self.unmaps += 1

    def map(self, offset: int, size: int) -> None:
        """Back bytes `[offset, offset + size)`, a page at a time (pages already mapped stay)."""
        for index in range(offset // self.page, -(-(offset + size) // self.page)):
            if index not in self._handles:
                self.map_page(index)

    def tensor(self, shape: tuple[int, ...], dtype) -> object:
        """The whole span as a tensor; only its mapped pages may be touched."""
        return view(self.address, shape, dtype)

    def close(self) -> None:
        for index, handle in self._handles.items():
            self.driver.unmap(self.address + index * self.page, self.page)
            self.driver.release(handle)
        self._handles.clear()
        for handle in self._spare:
            self.driver.release(handle)
        self._spare.clear()
        if self.address:
            self.driver.free(self.address, self.size)
            self.address = 0
