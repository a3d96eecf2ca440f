"""A stand-in of tensorflow with tf.config as vram lease's hook uses it.

As tensorflow/python/eager/context.py: set_memory_growth on a device with
a logical (virtual) device configuration raises ValueError; a
configuration may be set until the runtime is initialized
(initialize(), as the first op does), not after.
"""
import collections
import types

PhysicalDevice = collections.namedtuple("PhysicalDevice", ["name", "device_type"])
_gpus = [PhysicalDevice("/physical_device:GPU:0", "GPU"), PhysicalDevice("/physical_device:GPU:1", "GPU")]
_virtual = {}
_growth = {}
_initialized = [False]


class LogicalDeviceConfiguration(collections.namedtuple("LogicalDeviceConfiguration", ["memory_limit"])):
    def __new__(cls, memory_limit=None):
        return super().__new__(cls, memory_limit)


def list_physical_devices(device_type=None):
    return [g for g in _gpus if device_type in (None, g.device_type)]


def set_logical_device_configuration(device, logical_devices):
    if _initialized[0]:
        raise RuntimeError("Virtual devices cannot be modified after being initialized")
    _virtual[device] = logical_devices


def get_logical_device_configuration(device):
    return _virtual.get(device)


def set_memory_growth(device, enable):
    if device in _virtual:
        raise ValueError("Cannot set memory growth on device when virtual devices configured")
    if _initialized[0]:
        raise RuntimeError("Physical devices cannot be modified after being initialized")
    _growth[device] = enable


def initialize():
    _initialized[0] = True


config = types.SimpleNamespace(
    list_physical_devices=list_physical_devices,
    set_logical_device_configuration=set_logical_device_configuration,
    get_logical_device_configuration=get_logical_device_configuration,
    LogicalDeviceConfiguration=LogicalDeviceConfiguration,
    experimental=types.SimpleNamespace(set_memory_growth=set_memory_growth),
)
