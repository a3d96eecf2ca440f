"""cubie.memory.stream_groups, served by vram: StreamGroups, cubie's
bookkeeping of instances (ids) in named groups, each with its stream.

A StreamGroups on its own (cubie's, as its tests build one) makes each
group's stream with Numba's cuda.stream(). The drop-in's MemoryManager
gives its StreamGroups a stream_factory that hands out the group's vram
stream instead (the stream vram's manager copies on), so that kernels
launched on get_stream(instance) are ordered with the manager's copies.
The bookkeeping itself (which id is in which group) is cubie's, kept here
as cubie keeps it; the manager keeps vram's groups in step.
"""

from typing import Any, Callable, Optional

from . import _backend

__all__ = ["StreamGroups"]


_UNSET = object()


def _instance_id(instance: Any) -> int:
    return instance if isinstance(instance, int) else id(instance)


class StreamGroups:
    """Instances (ids) in named groups with shared streams, as cubie's.

    groups: group name -> list of instance ids (none given: empty; None:
    a "default" group with no member and no stream yet, as cubie's
    __attrs_post_init__ makes); streams: group name -> stream.
    """

    def __init__(self, groups: Optional[dict] = _UNSET, streams: Optional[dict] = None,
                 stream_factory: Optional[Callable[[str], Any]] = None):
        if groups is _UNSET:
            groups = {}
        elif groups is not None and not isinstance(groups, dict):
            raise TypeError("'groups' must be a dict or None (got %r)" % (groups,))
        self.groups = {"default": []} if groups is None else groups
        self.streams = {} if streams is None else streams
        self.stream_factory = stream_factory

    def __repr__(self):
        return "StreamGroups(groups=%r, streams=%r)" % (self.groups, self.streams)

    def _new_stream(self, group: str):
        if self.stream_factory is not None:
            return self.stream_factory(group)
        return _backend.cuda().stream()

    def add_instance(self, instance: Any, group: str) -> None:
        """Adds instance (an object, by id, or an int id) to group, made
        with its stream if new. ValueError if it is in a group already."""
        instance_id = _instance_id(instance)
        if any(instance_id in members for members in self.groups.values()):
            raise ValueError("Instance already in a stream group. Call change_group instead")
        self.get_group_stream(group)
        self.groups[group].append(instance_id)

    def get_group(self, instance: Any) -> str:
        """The name of instance's group. ValueError if it is in none."""
        instance_id = _instance_id(instance)
        for name, members in self.groups.items():
            if instance_id in members:
                return name
        raise ValueError("Instance not in any stream groups")

    def get_group_stream(self, group: str = "default"):
        """The group's stream, the group (and its stream) made if missing;
        never the device's default stream."""
        if group not in self.groups:
            self.groups[group] = []
        if group not in self.streams:
            self.streams[group] = self._new_stream(group)
        return self.streams[group]

    def get_stream(self, instance: Any):
        """The stream of instance's group."""
        return self.streams[self.get_group(instance)]

    def get_instances_in_group(self, group: str) -> list:
        """The ids in group ([] for a group that does not exist)."""
        return self.groups.get(group, [])

    def remove_instance(self, instance: Any) -> None:
        """Takes instance out of its group; one in no group is no error
        (the group and its stream stay for the others)."""
        instance_id = _instance_id(instance)
        for members in self.groups.values():
            if instance_id in members:
                members.remove(instance_id)
                return

    def change_group(self, instance: Any, new_group: str) -> None:
        """Moves instance to new_group (made, with its stream, if new).
        ValueError if it is in no group."""
        instance_id = _instance_id(instance)
        self.groups[self.get_group(instance)].remove(instance_id)
        self.get_group_stream(new_group)
        self.groups[new_group].append(instance_id)

    def reinit_streams(self) -> None:
        """A fresh stream for every group (after a context reset)."""
        for group in self.streams:
            self.streams[group] = self._new_stream(group)
