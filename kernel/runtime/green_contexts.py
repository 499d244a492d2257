"""SMs split between two streams: CUDA green contexts through cuda-bindings (NVIDIA's driver API bindings).

A green context owns a subset of the device's SMs; a kernel launched on one of its streams runs on those SMs only.
:func:`split` makes two, one with at least ``sms`` SMs and one with the rest, each with a stream that CuPy can
launch on (``cupy.cuda.ExternalStream``). The driver rounds a partition up to its granularity (on sm_90, groups of 8
SMs), so each side reports the SMs it was given.
"""
from __future__ import annotations

import dataclasses


class GreenContextError(RuntimeError):
    """A driver call of the split failed: its name and the driver's error."""


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise GreenContextError(f"splitting the SMs needs cuda-bindings (pip install cuda-bindings): {exc}") from exc
    return driver


def _checked(driver, name: str, result):
    """The values of a driver call after its CUresult, or GreenContextError naming the call and the error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, text = driver.cuGetErrorString(err)
        raise GreenContextError(f"{name} failed: {err.name} ({text.decode() if text else 'no description'})")
    return values[0] if len(values) == 1 else tuple(values)


@dataclasses.dataclass
class Side:
    """One side of a split: its SMs, its green context, and a stream on it (``stream``: a CuPy ExternalStream)."""
    sms: int
    context: object
    handle: object      # the CUstream
    stream: object

    def close(self) -> None:
        """Destroy the stream, then the context (the driver's order: a context outlives its streams)."""
        driver = _driver()
        _checked(driver, "cuStreamDestroy", driver.cuStreamDestroy(self.handle))
        _checked(driver, "cuGreenCtxDestroy", driver.cuGreenCtxDestroy(self.context))


@dataclasses.dataclass
class Split:
    """Two green contexts over disjoint SMs: ``first`` (at least the SMs asked for) and ``rest``."""
    first: Side
    rest: Side

    def close(self) -> None:
        self.first.close()
        self.rest.close()


def _sm_resource(driver, device_id: int):
    """(the CUdevice, its SM resource) of ``device_id``: what a split divides."""
    _checked(driver, "cuInit", driver.cuInit(0))
    dev = _checked(driver, "cuDeviceGet", driver.cuDeviceGet(device_id))
    return dev, _checked(driver, "cuDeviceGetDevResource",
                         driver.cuDeviceGetDevResource(dev, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))


def device_sms(device_id: int = 0) -> tuple[int, int, int]:
    """(the device's SMs, the smallest partition, its alignment) as the driver reports them for green contexts."""
    _, res = _sm_resource(_driver(), device_id)
    return int(res.sm.smCount), int(res.sm.minSmPartitionSize), int(res.sm.smCoscheduledAlignment)


def _side(driver, dev, resource, priority: int) -> Side:
    import cupy

    desc = _checked(driver, "cuDevResourceGenerateDesc", driver.cuDevResourceGenerateDesc([resource], 1))
    ctx = _checked(driver, "cuGreenCtxCreate",
                   driver.cuGreenCtxCreate(desc, dev, driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
    handle = _checked(driver, "cuGreenCtxStreamCreate",
                      driver.cuGreenCtxStreamCreate(ctx, driver.CUstream_flags.CU_STREAM_NON_BLOCKING, priority))
    got = _checked(driver, "cuGreenCtxGetDevResource",
                   driver.cuGreenCtxGetDevResource(ctx, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
    return Side(int(got.sm.smCount), ctx, handle, cupy.cuda.ExternalStream(int(handle)))


def split(sms: int, device_id: int = 0, priority_first: int = 0, priority_rest: int = 0) -> Split:
    """Green contexts over ``sms`` SMs (rounded up by the driver) and over the rest, a stream on each (priorities as
    cuStreamCreateWithPriority's: lower runs first). The primary context must be current (CuPy's or torch's first
    call makes it so), so that the green contexts share its memory."""
    driver = _driver()
    dev, res = _sm_resource(driver, device_id)
    total, smallest = int(res.sm.smCount), int(res.sm.minSmPartitionSize)
    if not smallest <= sms <= total - smallest:
        raise ValueError(f"sms: each side of a split needs at least {smallest} of the device's {total} SMs, "
                         f"got {sms}")
    groups, n, rest = _checked(driver, "cuDevSmResourceSplitByCount",
                               driver.cuDevSmResourceSplitByCount(1, res, 0, sms))
    if n != 1:
        raise GreenContextError(f"cuDevSmResourceSplitByCount made {n} groups of at least {sms} SMs, not 1")
    first = _side(driver, dev, groups[0], priority_first)
    try:
        second = _side(driver, dev, rest, priority_rest)
    except Exception:
        first.close()
        raise
    return Split(first, second)
